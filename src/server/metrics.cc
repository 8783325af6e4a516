#include "server/metrics.h"

#include <cstdio>

namespace gyre {

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type,
                name, value);
  out += buf;
}

}  // namespace

std::string prometheus_text(const EngineStats& s, const std::map<int, uint64_t>& http_statuses,
                            bool draining) {
  std::string out;
  const auto d = [](auto v) { return static_cast<double>(v); };
  metric(out, "gyre_requests_total", "counter", "Requests the engine accepted.",
         d(s.requests_total));
  metric(out, "gyre_requests_finished_total", "counter", "Requests that finished.",
         d(s.requests_finished));
  metric(out, "gyre_requests_cancelled_total", "counter",
         "Requests cancelled (client gone, shutdown).", d(s.requests_cancelled));
  metric(out, "gyre_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.",
         d(s.prompt_tokens));
  metric(out, "gyre_cached_prompt_tokens_total", "counter",
         "Prompt tokens served from shared KV pages instead of prefilled.",
         d(s.cached_prompt_tokens));
  metric(out, "gyre_generated_tokens_total", "counter", "Tokens generated.", d(s.generated_tokens));
  metric(out, "gyre_queue_depth", "gauge", "Requests waiting for a batch slot.", d(s.waiting));
  metric(out, "gyre_requests_running", "gauge", "Requests in the running batch.", d(s.running));
  metric(out, "gyre_kv_pages_total", "gauge", "KV cache pages.", d(s.kv_pages_total));
  metric(out, "gyre_kv_pages_used", "gauge", "KV cache pages held by requests.",
         d(s.kv_pages_used));
  metric(out, "gyre_kv_pages_shared", "gauge", "KV cache pages held by more than one request.",
         d(s.kv_pages_shared));
  metric(out, "gyre_kv_pages_cached", "gauge", "Free KV cache pages kept for prefix reuse.",
         d(s.kv_pages_cached));
  metric(out, "gyre_tokens_per_second", "gauge", "Generated tokens per second, recent.",
         s.tokens_per_s);
  metric(out, "gyre_preemptions_total", "counter",
         "Sequences sent back to recompute when KV pages ran out.", d(s.preemptions));
  metric(out, "gyre_draining", "gauge", "1 while the server shuts down.", draining ? 1 : 0);
  out += "# HELP gyre_http_responses_total HTTP responses sent, by status.\n";
  out += "# TYPE gyre_http_responses_total counter\n";
  for (const auto& [status, count] : http_statuses)
    out += "gyre_http_responses_total{code=\"" + std::to_string(status) + "\"} " +
           std::to_string(count) + "\n";
  return out;
}

}  // namespace gyre
