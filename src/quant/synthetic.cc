#include "quant/synthetic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "backend/backend.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "quant/convert_job.h"
#include "quant/convert_pass.h"
#include "quant/gptq_device.h"
#include "quant/linalg.h"
#include "quant/measure.h"
#include "quant/runtime.h"
#include "quant/sensitivity.h"

namespace gyre::quant {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kSeed = 20261122;

uint64_t mix(uint64_t x) {  // splitmix64's finalizer: a well-spread hash of x
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from (stream, index).
float uniform(uint64_t stream, uint64_t index) {
  const uint64_t h = mix(stream ^ mix(index));
  return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

void fill(std::vector<float>& v, int64_t rows, int64_t cols, uint64_t stream, float scale,
          float offset, int threads) {
  v.resize(static_cast<size_t>(rows * cols));
  parallel_ranges(rows, threads, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * cols; i < r1 * cols; ++i)
      v[static_cast<size_t>(i)] = offset + scale * uniform(stream, static_cast<uint64_t>(i));
  });
}

// The largest device memory in use (total - free, so other processes' too) seen by a thread that
// looks every 100 ms while the conversion runs: an estimate of the peak from below.
class MemoryWatch {
 public:
  // Off on the CPU path: asking CUDA would make a context on a GPU the run does not use.
  explicit MemoryWatch(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!stop_) {
        peak_ = std::max(peak_, backend_memory_used());
        cv_.wait_for(lock, std::chrono::milliseconds(100));
      }
    });
  }
  ~MemoryWatch() {
    if (!enabled_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  size_t peak_device_bytes() {
    if (!enabled_) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    return std::max(peak_, backend_memory_used());
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool enabled_, stop_ = false;
  size_t peak_ = 0;
  std::thread thread_;
};

// The process's peak resident set (VmHWM), 0 where /proc does not say.
size_t peak_host_rss_bytes() {
  std::string status;
  try {
    status = read_text_file("/proc/self/status");
  } catch (const Error&) {
    return 0;
  }
  const size_t at = status.find("VmHWM:");
  if (at == std::string::npos) return 0;
  return static_cast<size_t>(std::strtoull(status.c_str() + at + 6, nullptr, 10)) * 1024;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

BlockWeights synthetic_block(const ModelConfig& c, int layer, int threads) {
  BlockWeights b;
  uint64_t stream = mix(kSeed + static_cast<uint64_t>(layer) * 1000);
  for (int u = 0; u < kUnits; ++u)
    for (const std::string& s : unit_linears(static_cast<Unit>(u))) {
      const int64_t cols = linear_cols(c, s);
      int64_t rows = c.dim;
      if (s == "self_attn.q_proj") rows = c.q_dim();
      if (s == "self_attn.k_proj" || s == "self_attn.v_proj") rows = c.kv_dim();
      if (s == "mlp.gate_proj" || s == "mlp.up_proj") rows = c.hidden_dim;
      fill(b.t[s], rows, cols, ++stream, std::sqrt(3.0f / static_cast<float>(cols)), 0.0f, threads);
    }
  fill(b.t["input_layernorm"], 1, c.dim, ++stream, 0.2f, 1.0f, 1);
  fill(b.t["post_attention_layernorm"], 1, c.dim, ++stream, 0.2f, 1.0f, 1);
  return b;
}

void convert_synthetic(const ModelConfig& c, const std::string& name, const ConvertOptions& o_in) {
  ConvertOptions o = o_in;
  o.head_bits = resolved_head_bits(o_in);
  GYRE_CHECK(!o.out.empty(), "convert needs an output folder (-o)");
  GYRE_CHECK(o.bpw >= 2.0 && o.bpw <= 16.0, "--bpw must be between 2 and 16, got ", o.bpw);
  GYRE_CHECK(o.rows >= 1 && o.length >= 1 && o.length <= c.max_seq_len,
             "--rows and --length must be positive (length at most ", c.max_seq_len, ")");
  GYRE_CHECK(o.uniform.empty() && o.measurement.empty() && !o.rotate,
             "--synthetic measures and quantizes only (no --uniform, --measurement, --rotate)");
  GYRE_CHECK(o.chooser == "kl" || o.chooser == "plain", "--chooser must be kl or plain, got '",
             o.chooser, "'");
  GYRE_CHECK(o.sensitivity_rows >= 1, "--sensitivity-rows must be at least 1");
  GYRE_CHECK(!fs::exists(o.out + "/conversion.json"), "'", o.out,
             "' already holds a conversion; choose a new output folder");
  const auto start = std::chrono::steady_clock::now();
  LoadedModel lm;
  lm.path = "synthetic:" + name;
  lm.config = c;
  QuantContext ctx;
  ctx.model = &lm;
  QuantRuntime rt;
  open_runtime(o, ctx, rt);
  for (int r = 0; r < o.rows; ++r) {  // random token ids, the same for every run
    std::vector<int> row;
    for (int i = 0; i < o.length; ++i)
      row.push_back(static_cast<int>(mix(kSeed ^ mix(uint64_t(r) << 32 | uint64_t(i))) %
                                     static_cast<uint64_t>(c.vocab_size)));
    ctx.rows.push_back(row);
  }
  ctx.blocks = [&](int layer) { return synthetic_block(c, layer, ctx.threads); };
  ctx.embed = [&](const std::vector<std::vector<int>>& rows) {  // unit-variance rows per token
    std::vector<float> out;
    const float a = std::sqrt(3.0f);
    for (const auto& row : rows)
      for (int id : row)
        for (int k = 0; k < c.dim; ++k)
          out.push_back(a * uniform(kSeed + 7, uint64_t(id) * uint64_t(c.dim) + uint64_t(k)));
    return out;
  };
  // The final norm and an untied LM head, random like the blocks, so the timing includes the
  // head's GPTQ (unless --head-bits 0) as a real conversion's does; the KL chooser's sensitivity
  // pass needs them too (the next-token distributions it compares).
  std::vector<float> final_norm, head;
  if (o.head_bits > 0 || o.chooser == "kl") {
    fill(final_norm, 1, c.dim, mix(kSeed + 3), 0.2f, 1.0f, 1);
    fill(head, c.vocab_size, c.dim, mix(kSeed + 5), std::sqrt(3.0f / static_cast<float>(c.dim)),
         0.0f, ctx.threads);
    lm.config.tie_embeddings = false;
    lm.weights.add(f32_view("model.norm.weight", final_norm, {c.dim}));
    lm.weights.add(f32_view("lm_head.weight", head, {c.vocab_size, c.dim}));
  }
  const std::string& device = rt.device;
  QuantTimings& timings = rt.timings;
  MemoryWatch memory(device != "cpu");
  std::error_code ec;
  const std::string job = o.out + "/.gyre-job";
  fs::create_directories(job, ec);
  GYRE_CHECK(!ec, "cannot create '", job, "': ", ec.message());
  // Resumable like a real conversion (a run longer than one sitting is timed in parts): the
  // measurement block by block, the sensitivity pass whole, the quantization block by block.
  nlohmann::json sig = job_options(o);
  sig["model"] = lm.path;
  sig["layers"] = c.n_layers;
  const bool resumed = file_exists(job + "/job.json");
  if (resumed) {
    GYRE_CHECK(read_json_file(job + "/job.json") == sig, "'", job,
               "' belongs to a conversion with other options; delete it or pick another output");
    std::fprintf(stderr, "convert: resuming the job in %s\n", job.c_str());
  } else {
    write_file_atomic(job + "/job.json", sig.dump(2));
  }
  const std::string mpath = job + "/measurement.json";
  Measurement meas;
  if (file_exists(mpath)) meas = Measurement::from_json(read_json_file(mpath), mpath);
  meas.meta = {{"model", lm.path}, {"rows", o.rows},           {"length", o.length},
               {"damp", o.damp},   {"act_order", o.act_order}, {"method", o.rtn ? "rtn" : "gptq"},
               {"device", device}};
  auto t0 = std::chrono::steady_clock::now();
  measure(ctx, meas, [&](const Measurement& m) { write_file_atomic(mpath, m.to_json().dump(1)); });
  const double t_measure = seconds_since(t0);
  const QuantTimings measure_la = timings;
  // Each phase's time as soon as it ends, so a run cut short still tells how far it got.
  std::fprintf(stderr,
               "convert: measurement took %.1f s (peak GPU memory in use so far %.2f GiB; %s)\n",
               t_measure, static_cast<double>(memory.peak_device_bytes()) / (1 << 30),
               timing_breakdown(measure_la).c_str());
  double t_sensitivity = 0;
  QuantTimings sensitivity_la;
  if (o.chooser == "kl" && meas.sensitivity.empty()) {
    t0 = std::chrono::steady_clock::now();
    timings = QuantTimings{};
    meas.sensitivity = measure_sensitivity(ctx, kSensitivityProbe, o.sensitivity_rows);
    write_file_atomic(mpath, meas.to_json().dump(1));
    t_sensitivity = seconds_since(t0);
    sensitivity_la = timings;
    std::fprintf(stderr,
                 "convert: sensitivity took %.1f s (peak GPU memory in use so far %.2f GiB)\n",
                 t_sensitivity, static_cast<double>(memory.peak_device_bytes()) / (1 << 30));
  }
  Plan plan = optimized_plan(lm, meas, o.bpw, o.chooser == "kl");
  t0 = std::chrono::steady_clock::now();
  timings = QuantTimings{};
  quantize_pass(ctx, plan, job, o.head_bits);
  const double t_quant = seconds_since(t0);
  std::fprintf(stderr, "convert: quantization took %.1f s (Hessians+factors %.1f, GPTQ %.1f; %s)\n",
               t_quant, timings.hessian, timings.gptq, timing_breakdown(timings).c_str());
  double bits = 0, numel = 0;
  for (const auto& [layer, st] : plan) {
    const LayerErrors* le = meas.find(layer);
    if (le == nullptr) continue;  // the LM head: outside the budget, as in a real conversion
    const double n = static_cast<double>(le->rows * le->cols);
    bits += n * st.bits_per_weight();
    numel += n;
  }
  const double total = seconds_since(start);
  // With `resumed` the seconds are this run's: the phases done before it count 0 here.
  nlohmann::json summary = {{"synthetic", name},
                            {"resumed", resumed},
                            {"device", device},
                            {"rows", o.rows},
                            {"length", o.length},
                            {"bpw_target", o.bpw},
                            {"head_bits", o.head_bits},
                            {"chooser", o.chooser},
                            {"sensitivity_rows", o.sensitivity_rows},
                            {"bits_per_weight", numel > 0 ? bits / numel : 0.0},
                            {"peak_host_rss_bytes", peak_host_rss_bytes()},
                            {"peak_device_bytes", memory.peak_device_bytes()},
                            {"seconds",
                             {{"total", total},
                              {"measure", t_measure},
                              {"measure_hessian_factor", measure_la.hessian},
                              {"measure_gptq", measure_la.gptq},
                              {"sensitivity", t_sensitivity},
                              {"sensitivity_hessian_factor", sensitivity_la.hessian},
                              {"sensitivity_gptq", sensitivity_la.gptq},
                              {"quantize", t_quant},
                              {"quantize_hessian_factor", timings.hessian},
                              {"quantize_gptq", timings.gptq}}}};
  write_file_atomic(o.out + "/measurement.json", meas.to_json().dump(1));
  write_file_atomic(o.out + "/conversion.json", summary.dump(2));
  fs::remove_all(job, ec);
  std::fprintf(stderr,
               "convert: synthetic %s on %s: %.1f s total (measure %.1f s: Hessians+factors %.1f, "
               "GPTQ+errors %.1f; sensitivity (%s chooser) %.1f s: %.1f, %.1f; quantize %.1f s: "
               "%.1f, %.1f), %.3f bits per weight; peak host RSS %.2f GiB, peak GPU memory in use "
               "%.2f GiB\n",
               name.c_str(), device.c_str(), total, t_measure, measure_la.hessian, measure_la.gptq,
               o.chooser.c_str(), t_sensitivity, sensitivity_la.hessian, sensitivity_la.gptq,
               t_quant, timings.hessian, timings.gptq, numel > 0 ? bits / numel : 0.0,
               static_cast<double>(peak_host_rss_bytes()) / (1 << 30),
               static_cast<double>(memory.peak_device_bytes()) / (1 << 30));
}

}  // namespace gyre::quant
