#include "server/serve.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "server/http_server.h"

namespace gyre {

namespace {

std::string token_text(const Tokenizer& tok, int id) {
  return id >= 0 && id < tok.vocab_size() ? tok.id_to_token(id) : std::string();
}

}  // namespace

std::string default_served_name(const std::string& model_path) {
  std::string p = model_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.find_last_of('/');
  std::string name = slash == std::string::npos ? p : p.substr(slash + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0)
    name.resize(name.size() - 5);
  return name.empty() ? "gyre" : name;
}

void run_serve(const ServeConfig& c) {
  GYRE_CHECK(c.max_batch >= 1, "--max-batch must be at least 1, got ", c.max_batch);
  GYRE_CHECK(c.max_queue >= 0, "--max-queue must be >= 0, got ", c.max_queue);
  GYRE_CHECK(c.threads >= 0, "--threads must be >= 0, got ", c.threads);
  GYRE_CHECK(c.port >= 0 && c.port <= 65535, "--port must be in 0..65535, got ", c.port);
  // Signals go to the waiting thread below only; every thread started from here inherits the
  // mask. A client that vanishes must not kill the process with SIGPIPE.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto model = load_model(c.model_path);
  GYRE_CHECK(c.max_seq_len >= 0, "--max-seq-len must be positive, got ", c.max_seq_len);
  GYRE_CHECK(c.max_seq_len <= model->config.max_seq_len, "--max-seq-len ", c.max_seq_len,
             " is longer than the model's context of ", model->config.max_seq_len, " tokens");
  const int max_seq = c.max_seq_len > 0
                          ? c.max_seq_len
                          : std::min(model->config.max_seq_len, c.default_max_seq_len);
  const Tokenizer& tok = *model->tokenizer;
  ModelContext ctx;
  ctx.name = c.served_name.empty() ? default_served_name(c.model_path) : c.served_name;
  ctx.tokenizer = &tok;
  ctx.chat_template =
      c.chat_template_file.empty() ? model->chat_template : read_text_file(c.chat_template_file);
  ctx.bos_token = token_text(tok, tok.bos_id());
  std::vector<int> eos = tok.eos_ids();
  if (eos.empty()) eos = model->config.eos_ids;
  ctx.eos_token = eos.empty() ? std::string() : token_text(tok, eos[0]);
  ctx.end_of_turn_ids = end_of_turn_ids(tok);
  ctx.max_seq_len = max_seq;

  BackendOptions bo;
  bo.n_threads = c.threads;
  bo.kv_cache = c.kv_cache;
  auto backend = backend_create(c.device, bo);
  EngineConfig ec;
  ec.max_batch = c.max_batch;
  ec.max_queue = c.max_queue;
  ec.max_seq_len = max_seq;
  auto engine = make_serving_engine(*model, *backend, ec);

  ServerOptions so;
  so.host = c.host;
  so.port = c.port;
  so.api_key = c.api_key;
  // Every accepted request holds a handler thread while it waits or runs.
  so.http_threads = std::min(c.max_batch + c.max_queue + 8, 1024);
  HttpServer server(*engine, ctx, so);
  const int port = server.bind();
  std::fprintf(stderr, "gyre: serving '%s' (%s, device %s, context %d) on http://%s:%d\n",
               ctx.name.c_str(), model->config.arch.c_str(), backend->name().c_str(), max_seq,
               c.host.c_str(), port);

  std::atomic<bool> stopped{false};
  std::thread waiter([&] {
    const timespec tick{0, 200 * 1000 * 1000};
    while (!stopped) {
      const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig == SIGTERM || sig == SIGINT) {
        std::fprintf(stderr, "gyre: %s: draining in-flight requests\n", strsignal(sig));
        server.shutdown();
        return;
      }
    }
  });
  server.serve();
  stopped = true;
  waiter.join();
  engine.reset();  // joins the engine thread before the model and backend go
  std::fprintf(stderr, "gyre: stopped\n");
}

}  // namespace gyre
