#include "server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>

#include "server/metrics.h"
#include "server/openai_response.h"

namespace gyre {

namespace {

using Json = nlohmann::ordered_json;
using namespace std::chrono_literals;

// Events of one HTTP request's engine requests, tagged with the choice index. Filled on the
// engine thread (never blocks for long), drained by the handler thread.
class EventQueue {
 public:
  void push(int index, const TokenEvent& e) {
    {
      std::lock_guard<std::mutex> lock(m_);
      q_.emplace_back(index, e);
    }
    cv_.notify_one();
  }
  bool pop(std::pair<int, TokenEvent>& out, std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(m_);
    if (!cv_.wait_for(lock, wait, [&] { return !q_.empty(); })) return false;
    out = std::move(q_.front());
    q_.pop_front();
    return true;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<int, TokenEvent>> q_;
};

// The n engine requests behind one HTTP request. Cancels whatever is unfinished when dropped,
// so a handler that leaves early (client gone, error) never leaves work running.
class Submission {
 public:
  Submission(ServingEngine& engine, const ParsedRequest& p)
      : engine_(engine), events_(std::make_shared<EventQueue>()), results_(p.n) {
    try {
      for (int i = 0; i < p.n; ++i) {
        RequestOptions o = p.options;
        o.gen.sampler.seed += static_cast<uint64_t>(i);  // independent choices
        std::shared_ptr<EventQueue> q = events_;
        ids_.push_back(
            engine_.submit(p.prompt_ids, o, [q, i](const TokenEvent& e) { q->push(i, e); }));
      }
    } catch (const QueueFullError& e) {
      cancel_unfinished();
      throw ApiError(429, std::string("The server is busy: ") + e.what(), "", "queue_full");
    } catch (const Error& e) {
      cancel_unfinished();
      throw ApiError(400, e.what());
    }
    remaining_ = p.n;
  }
  ~Submission() { cancel_unfinished(); }

  // The next event, already added to its choice's result; false when none came in `wait`.
  bool next(std::pair<int, TokenEvent>& ev, std::chrono::milliseconds wait, bool logprobs) {
    if (!events_->pop(ev, wait)) return false;
    ChoiceResult& r = results_[ev.first];
    if (!r.done && ev.second.done) --remaining_;
    r.add(ev.second, logprobs);
    return true;
  }
  bool all_done() const { return remaining_ == 0; }
  const std::vector<ChoiceResult>& results() const { return results_; }

  void cancel_unfinished() {
    for (size_t i = 0; i < ids_.size(); ++i)
      if (!results_[i].done) engine_.cancel(ids_[i]);
    ids_.clear();
  }

 private:
  ServingEngine& engine_;
  std::shared_ptr<EventQueue> events_;
  std::vector<uint64_t> ids_;
  std::vector<ChoiceResult> results_;
  int remaining_ = 0;
};

// httplib 0.11 listens with a backlog of 5: a burst of clients overflows it and the kernel
// drops their handshakes (they stall for seconds). Listening again on the bound socket raises
// the backlog (Linux updates it in place).
class Listener : public httplib::Server {
 public:
  void widen_backlog() {
    const auto fd = svr_sock_.load();
    if (fd != INVALID_SOCKET) ::listen(fd, SOMAXCONN);
  }
};

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& param = {}, const std::string& code = {}) {
  res.status = status;
  res.set_content(dump_json(error_body(status, message, param, code)), "application/json");
}

// Compares without an early exit, so timing does not reveal how much of a key was right.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[b.empty() ? 0 : i % b.size()];
  return b.empty() ? a.empty() : diff == 0;
}

}  // namespace

struct HttpServer::Impl {
  ServingEngine& engine;
  ModelContext model;
  ServerOptions opt;
  Listener svr;
  std::atomic<bool> draining{false};
  std::mutex active_m;
  std::condition_variable active_cv;
  int active = 0;  // handlers (and open streams) still at work
  std::atomic<uint64_t> next_id{0};
  uint64_t id_salt = std::random_device{}();
  int64_t started = 0;
  int bound_port = -1;
  std::once_flag shutdown_once;
  std::mutex status_m;
  std::map<int, uint64_t> http_status_counts;

  // Counts a handler (or a stream that outlives its handler) for shutdown() to wait on.
  struct ActiveGuard {
    Impl& impl;
    explicit ActiveGuard(Impl& i) : impl(i) {
      std::lock_guard<std::mutex> lock(impl.active_m);
      ++impl.active;
    }
    ~ActiveGuard() {
      {
        std::lock_guard<std::mutex> lock(impl.active_m);
        --impl.active;
      }
      impl.active_cv.notify_all();
    }
  };

  Impl(ServingEngine& e, ModelContext m, ServerOptions o)
      : engine(e), model(std::move(m)), opt(std::move(o)) {
    started = std::chrono::duration_cast<std::chrono::seconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
    const size_t threads = static_cast<size_t>(std::max(4, opt.http_threads));
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    svr.set_payload_max_length(opt.max_body_bytes);
    svr.set_keep_alive_max_count(1000);
    svr.set_read_timeout(30, 0);
    svr.set_write_timeout(30, 0);
    svr.set_pre_routing_handler(
        [this](const httplib::Request& req, httplib::Response& res) { return gate(req, res); });
    svr.set_error_handler(
        [this](const httplib::Request& req, httplib::Response& res) { fill_error(req, res); });
    svr.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "internal error";
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          send_error(res, 500, what);
        });
    svr.set_logger([this](const httplib::Request&, const httplib::Response& res) {
      std::lock_guard<std::mutex> lock(status_m);
      ++http_status_counts[res.status];
    });
    // The bodies are read here rather than by httplib, which does not bound chunked bodies.
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                       const httplib::ContentReader& reader) {
      std::string body;
      if (read_body(req, res, reader, body)) generate(body, res, false);
    });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                            const httplib::ContentReader& reader) {
      std::string body;
      if (read_body(req, res, reader, body)) generate(body, res, true);
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const Json list = {{"object", "list"}, {"data", Json::array({model_json()})}};
      res.set_content(dump_json(list), "application/json");
    });
    svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string name = req.matches[1];
      if (name != model.name && name != "gyre")
        return send_error(res, 404, "The model '" + name + "' does not exist", "model",
                          "model_not_found");
      res.set_content(dump_json(model_json()), "application/json");
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.status = draining ? 503 : 200;
      res.set_content(draining ? R"({"status":"draining"})" : R"({"status":"ok"})",
                      "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::map<int, uint64_t> statuses;
      {
        std::lock_guard<std::mutex> lock(status_m);
        statuses = http_status_counts;
      }
      res.set_content(prometheus_text(engine.stats(), statuses, draining),
                      "text/plain; version=0.0.4");
    });
  }

  Json model_json() const {
    return {{"id", model.name}, {"object", "model"}, {"created", started}, {"owned_by", "gyre"}};
  }

  // Auth and draining, before routing: unknown routes need the key too.
  httplib::Server::HandlerResponse gate(const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (!opt.api_key.empty() &&
        !same_secret(req.get_header_value("Authorization"), "Bearer " + opt.api_key)) {
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, 401, "Missing or wrong API key (Authorization: Bearer KEY)", "",
                 "invalid_api_key");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (draining && req.path != "/metrics") {
      send_error(res, 503, "The server is shutting down", "", "draining");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }

  // Errors httplib produced itself (no route, body too large, ...) get OpenAI's JSON shape.
  void fill_error(const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_error(res, 404, "Unknown route: " + req.method + " " + req.path, "", "not_found");
    else if (res.status == 413)
      send_error(res, 413,
                 "The request body is larger than " + std::to_string(opt.max_body_bytes) + " bytes",
                 "", "body_too_large");
    else
      send_error(res, res.status, "HTTP error " + std::to_string(res.status));
  }

  ResponseMeta meta_for(const ParsedRequest& p) {
    char id[64];
    std::snprintf(id, sizeof id, "%s-%08llx%012llx", p.chat ? "chatcmpl" : "cmpl",
                  static_cast<unsigned long long>(id_salt & 0xffffffffu),
                  static_cast<unsigned long long>(next_id.fetch_add(1)));
    ResponseMeta m;
    m.id = id;
    m.created = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
    m.model = model.name;
    m.chat = p.chat;
    m.logprobs = p.logprobs;
    return m;
  }

  // Reads the body up to the limit; false (with the error response set) when it is too large
  // or unreadable. The rest of an oversized body is never read: the connection closes.
  bool read_body(const httplib::Request& req, httplib::Response& res,
                 const httplib::ContentReader& reader, std::string& body) {
    if (req.is_multipart_form_data()) {
      send_error(res, 400, "Expected a JSON body, not multipart/form-data");
      return false;
    }
    bool too_large = false;
    const bool ok = reader([&](const char* data, size_t n) {
      if (body.size() + n > opt.max_body_bytes) {
        too_large = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    if (ok) return true;
    if (too_large || res.status == 413) {
      send_error(res, 413,
                 "The request body is larger than " + std::to_string(opt.max_body_bytes) + " bytes",
                 "", "body_too_large");
    } else {
      send_error(res, 400, "The request body could not be read");
    }
    res.set_header("Connection", "close");
    return false;
  }

  void generate(const std::string& raw_body, httplib::Response& res, bool chat) {
    auto guard = std::make_shared<ActiveGuard>(*this);
    try {
      const Json body = parse_body(raw_body);
      ParsedRequest p =
          chat ? parse_chat_request(body, model) : parse_completion_request(body, model);
      auto sub = std::make_shared<Submission>(engine, p);
      const ResponseMeta meta = meta_for(p);
      if (p.stream)
        stream(res, std::move(sub), meta, p, std::move(guard));
      else
        collect(res, *sub, meta, p);
    } catch (const ApiError& e) {
      send_error(res, e.status(), e.what(), e.param(), e.code());
    } catch (const Error& e) {
      send_error(res, 400, e.what());
    }
  }

  void collect(httplib::Response& res, Submission& sub, const ResponseMeta& meta,
               const ParsedRequest& p) {
    std::pair<int, TokenEvent> ev;
    while (!sub.all_done()) sub.next(ev, 1000ms, p.logprobs);
    for (const ChoiceResult& c : sub.results())
      if (!c.error.empty()) return send_error(res, 500, "Generation failed: " + c.error);
    res.set_content(dump_json(full_response(meta, sub.results(), engine.tokenizer())),
                    "application/json");
  }

  // Server-sent events: one chunk per event, then usage (when asked) and [DONE]. A failed
  // write means the client is gone: the provider returns false and the requests are cancelled.
  void stream(httplib::Response& res, std::shared_ptr<Submission> sub, const ResponseMeta& meta,
              const ParsedRequest& p, std::shared_ptr<ActiveGuard> guard) {
    struct State {
      std::shared_ptr<Submission> sub;
      ResponseMeta meta;
      int n;
      bool include_usage, logprobs, started = false;
      std::shared_ptr<ActiveGuard> guard;
      std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
    };
    auto st = std::make_shared<State>(
        State{std::move(sub), meta, p.n, p.include_usage, p.logprobs, false, std::move(guard)});
    const Tokenizer& tok = engine.tokenizer();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [st, &tok](size_t, httplib::DataSink& sink) {
          auto send = [&](const Json& j) {
            const std::string s = sse_event(j);
            return sink.write(s.data(), s.size());
          };
          if (!st->started) {
            st->started = true;
            if (st->meta.chat)
              for (int i = 0; i < st->n; ++i)
                if (!send(stream_chunk(st->meta, i, "", {}, nullptr, true, tok))) return false;
          }
          std::pair<int, TokenEvent> ev;
          if (!st->sub->next(ev, 100ms, false)) {
            // Nothing yet (queued, or a long prefill): an SSE comment now and then finds a
            // client that left, since only a failed write tells (clients ignore comments).
            const auto now = std::chrono::steady_clock::now();
            if (now - st->last_write < 2s) return true;
            st->last_write = now;
            const std::string ping = ": ping\n\n";
            return sink.write(ping.data(), ping.size());
          }
          st->last_write = std::chrono::steady_clock::now();
          do {
            const TokenEvent& e = ev.second;
            if (!e.error.empty()) {
              if (!send(error_body(500, "Generation failed: " + e.error))) return false;
              continue;
            }
            std::vector<TokenLogprob> lps;
            if (st->logprobs && e.token >= 0) lps.push_back({e.token, e.logprob, e.top_logprobs});
            if (!e.text.empty() || !lps.empty())
              if (!send(stream_chunk(st->meta, ev.first, e.text, lps, nullptr, false, tok)))
                return false;
            if (e.done && !send(stream_chunk(st->meta, ev.first, "", {},
                                             openai_finish_reason(e.finish), false, tok)))
              return false;
          } while (st->sub->next(ev, 0ms, false));
          if (!st->sub->all_done()) return true;
          if (st->include_usage && !send(usage_chunk(st->meta, st->sub->results()))) return false;
          const std::string done = "data: [DONE]\n\n";
          if (!sink.write(done.data(), done.size())) return false;
          sink.done();
          return true;
        },
        [st](bool) { st->sub->cancel_unfinished(); });
  }
};

HttpServer::HttpServer(ServingEngine& engine, ModelContext model, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(model), std::move(options))) {}

HttpServer::~HttpServer() {
  if (impl_->svr.is_running()) shutdown();
}

int HttpServer::bind() {
  const ServerOptions& o = impl_->opt;
  GYRE_CHECK(o.port >= 0 && o.port <= 65535, "--port must be in 0..65535, got ", o.port);
  if (o.port == 0) {
    impl_->bound_port = impl_->svr.bind_to_any_port(o.host);
    GYRE_CHECK(impl_->bound_port > 0, "cannot listen on ", o.host, " (any port)");
  } else {
    GYRE_CHECK(impl_->svr.bind_to_port(o.host, o.port), "cannot listen on ", o.host, ":", o.port,
               " (in use, or not an address of this machine)");
    impl_->bound_port = o.port;
  }
  impl_->svr.widen_backlog();
  return impl_->bound_port;
}

void HttpServer::serve() {
  impl_->svr.listen_after_bind();
}

void HttpServer::shutdown() {
  std::call_once(impl_->shutdown_once, [this] {
    Impl& s = *impl_;
    s.draining = true;
    s.engine.drain();
    // Let handlers write out what the engine finished; a stuck client gets the write timeout.
    std::unique_lock<std::mutex> lock(s.active_m);
    s.active_cv.wait_for(lock, 60s, [&] { return s.active == 0; });
    lock.unlock();
    s.svr.stop();
  });
}

int HttpServer::port() const {
  return impl_->bound_port;
}

}  // namespace gyre
