// `gyre serve`: loads the model, starts the engine and the HTTP server, and runs until SIGTERM
// or SIGINT, which stop new requests, let in-flight ones finish, and return.
// (This header stays free of engine/engine.h so the CLI can include it next to cli/common.h.)
#pragma once
#include <string>

namespace gyre {

struct ServeConfig {
  std::string model_path;
  std::string device = "auto";
  int threads = 0;
  std::string kv_cache = "f16";  // f16, q8 or q4
  int max_seq_len = 0;           // context per request (prompt + generated); 0: the model's, capped
  int default_max_seq_len = 4096;  // that cap
  int max_batch = 32, max_queue = 256;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string chat_template_file;  // overrides the model's chat template
  std::string served_name;         // default: the model path's last component
};

// Blocks until a signal asks to stop and the drain is over. Throws gyre::Error on startup
// failures (model, device, address in use).
void run_serve(const ServeConfig& c);

// The model name /v1/models reports: the folder name, or the .gguf file name without extension.
std::string default_served_name(const std::string& model_path);

}  // namespace gyre
