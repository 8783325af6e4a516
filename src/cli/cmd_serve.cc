// gyre serve: an OpenAI-compatible HTTP server (server/serve.h) for one model.
#include "cli/commands.h"
#include "cli/common.h"
#include "server/serve.h"

namespace gyre {

void add_serve_command(CLI::App& app) {
  auto model = std::make_shared<ModelOptions>();
  auto c = std::make_shared<ServeConfig>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve the model over HTTP with OpenAI's API: POST /v1/completions, "
      "POST /v1/chat/completions (JSON or streamed server-sent events), GET /v1/models, "
      "GET /health, GET /metrics (Prometheus). Requests name the model as /v1/models reports "
      "it, or \"gyre\". SIGTERM/SIGINT drain in-flight requests, then exit 0.");
  add_model_option(*cmd, *model);
  cmd->add_option("--host", c->host, "Address to listen on (loopback unless you open it up)")
      ->capture_default_str();
  cmd->add_option("--port", c->port, "TCP port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", c->api_key,
                  "Require \"Authorization: Bearer KEY\" on every route but /health");
  cmd->add_option("--max-batch", c->max_batch, "Sequences decoded together in one step")
      ->capture_default_str();
  cmd->add_option("--max-queue", c->max_queue, "Waiting requests before answering 429")
      ->capture_default_str();
  cmd->add_option("--chat-template", c->chat_template_file,
                  "Jinja chat template file to use instead of the model's");
  cmd->add_option("--served-name", c->served_name,
                  "Model name for clients (default: the model folder or .gguf file name)");
  add_runtime_options(*cmd, *model);
  cmd->callback([model, c] {
    c->model_path = model->model;
    c->device = model->device;
    c->threads = model->threads;
    c->kv_cache = model->kv_cache;
    c->max_seq_len = model->max_seq_len;
    c->default_max_seq_len = kDefaultMaxSeq;
    run_serve(*c);
  });
}

}  // namespace gyre
