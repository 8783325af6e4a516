// The OpenAI-compatible HTTP server over a ServingEngine:
//   POST /v1/completions, POST /v1/chat/completions (JSON or server-sent events),
//   GET /v1/models, GET /health, GET /metrics (Prometheus text).
// httplib handler threads submit to the engine and wait on per-request event queues that the
// engine's callbacks fill; a streaming client that disconnects has its requests cancelled.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "server/engine_api.h"
#include "server/openai_request.h"

namespace gyre {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (see HttpServer::port())
  std::string api_key;  // non-empty: every route but /health needs "Authorization: Bearer KEY"
  size_t max_body_bytes = 4u << 20;
  int http_threads = 64;  // handler threads; each waiting or running request holds one
};

class HttpServer {
 public:
  HttpServer(ServingEngine& engine, ModelContext model, ServerOptions options);
  ~HttpServer();  // shuts down if still running
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket (throws gyre::Error); returns the port.
  int bind();
  // Serves until shutdown(); returns then. Call bind() first.
  void serve();
  // New requests get 503, in-flight ones finish (engine drain), then serve() returns.
  // Safe to call from any thread, more than once.
  void shutdown();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gyre
