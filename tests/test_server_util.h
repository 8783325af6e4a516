// Helpers for the server tests: an in-process HttpServer on 127.0.0.1 with an ephemeral port,
// an httplib client, SSE parsing, raw-socket requests and /metrics lookups.
#pragma once
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/http_server.h"

namespace gyre::test {

inline std::string fixture(const std::string& rel) {
  return std::string(GYRE_FIXTURES) + "/" + rel;
}

// Runs an HttpServer on a background thread for the lifetime of the object.
class RunningServer {
 public:
  RunningServer(ServingEngine& engine, ModelContext ctx, ServerOptions opt = {}) {
    opt.host = "127.0.0.1";
    opt.port = 0;
    server_ = std::make_unique<HttpServer>(engine, std::move(ctx), opt);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
  }
  ~RunningServer() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    server_->shutdown();
    thread_.join();
  }
  int port() const { return port_; }
  HttpServer& server() { return *server_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }

 private:
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
};

inline nlohmann::json post_json(httplib::Client& c, const std::string& path,
                                const nlohmann::json& body, int expect_status) {
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(res) << "no response for " << path;
  if (!res) return {};
  EXPECT_EQ(res->status, expect_status) << res->body;
  return nlohmann::json::parse(res->body);
}

// The "data: ..." payloads of a server-sent-event body, in order ("[DONE]" included).
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

// A value of an unlabelled metric in Prometheus text; -1 when absent.
inline double metric_value(const std::string& text, const std::string& name) {
  size_t pos = 0;
  while ((pos = text.find(name + " ", pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + name.size() + 1));
    pos += name.size();
  }
  return -1;
}

inline double get_metric(int port, const std::string& name) {
  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/metrics");
  if (!res || res->status != 200) return -1;
  return metric_value(res->body, name);
}

// The metric once it reaches `want` (the engine updates its stats just after the final event),
// or its value after about five seconds.
inline double wait_metric(int port, const std::string& name, double want) {
  double v = get_metric(port, name);
  for (int i = 0; i < 500 && v < want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    v = get_metric(port, name);
  }
  return v;
}

// Opens a TCP connection to the server; -1 on failure.
inline int connect_raw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline std::string http_post_text(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace gyre::test
