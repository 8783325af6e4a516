#include "quant/sensitivity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <memory>
#include <mutex>
#include <string>

#include "core/error.h"
#include "engine/eval.h"
#include "quant/gptq.h"
#include "quant/gptq_device.h"
#include "quant/linalg.h"
#include "quant/progress.h"
#include "quant/unit_quant.h"
#ifdef GYRE_HAVE_CUDA
#include "quant/cuda/kl_cuda.h"
#endif

namespace gyre::quant {

double mean_kl_of_logits(const std::vector<float>& ref_logits, const std::vector<float>& logits,
                         int64_t vocab, int threads) {
  GYRE_CHECK(vocab > 0 && ref_logits.size() == logits.size() &&
                 ref_logits.size() % static_cast<size_t>(vocab) == 0,
             "internal: logit shapes differ");
  const int64_t n = static_cast<int64_t>(ref_logits.size()) / vocab;
  std::mutex mu;
  double sum = 0;
  parallel_ranges(n, threads, [&](int64_t i0, int64_t i1) {
    std::vector<double> lp(static_cast<size_t>(vocab)), lq(static_cast<size_t>(vocab));
    double part = 0;
    for (int64_t i = i0; i < i1; ++i) {
      log_softmax(ref_logits.data() + i * vocab, static_cast<int>(vocab), lp.data());
      log_softmax(logits.data() + i * vocab, static_cast<int>(vocab), lq.data());
      double kl = 0;
      for (int64_t v = 0; v < vocab; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
      part += kl;
    }
    std::lock_guard<std::mutex> lock(mu);
    sum += part;
  });
  return n > 0 ? sum / static_cast<double>(n) : 0.0;
}

namespace {

// One unit's perturbed copy of the hidden states on its way through the later blocks: on the
// backend while the copies fit the budget, else on the host between blocks.
struct Stream {
  std::string key;
  UnitSensitivity s;
  Tensor on_backend;
  std::vector<float> on_host;
};

// One unit's probe in a block: its setting (the probe's group narrowed to fit), the dequantized
// weights of its linears in order, their summed relative error and its quantizer's seconds.
struct UnitProbe {
  QuantSetting setting;
  bool skipped = false;  // no group size fits the unit's width
  std::vector<std::vector<float>> dequant;
  double error = 0;
  QuantTimings timings;
};

// The mean KL of logits against the reference: on the GPU when the backend left FP16 logits on
// one, else on the host in float64 (ref_host is the reference's host copy, made once).
double kl_against(BlockRunner& runner, const Tensor& ref, const std::vector<float>& ref_host,
                  const Tensor& logits, int threads) {
#ifdef GYRE_HAVE_CUDA
  if (logits.dtype == DType::F16 && ref.dtype == DType::F16) {
    runner.backend().synchronize();
    return cuda::mean_kl_f16(ref.data, logits.data, logits.rows, logits.cols);
  }
#endif
  (void)ref;
  return mean_kl_of_logits(ref_host, runner.to_host(logits), logits.cols, threads);
}

}  // namespace

size_t backend_memory_used() {
#ifdef GYRE_HAVE_CUDA
  return cuda::device_memory_used();
#else
  return 0;
#endif
}

// Block-major: each block's weights are loaded (from the mapped file, or generated) and uploaded
// once, and every perturbed copy of the hidden states made in earlier blocks goes through them
// before this block's own units are probed; so the pass holds one block's weights at a time (two
// while the next loads) and each unit costs the forward of the blocks after it, the same
// arithmetic (in the same order per unit) as running the model once per unit.
// The copies: 4 per block, each [rows * length, dim], FP16 on CUDA: 16 MiB at the Llama-3-8B
// shape and 8 rows of 256, so 128 copies take 2 GiB; 80 blocks of width 8192 would take 20 GiB,
// beyond the default budget (12 GiB), and move the rest through the host.
std::map<std::string, UnitSensitivity> measure_sensitivity(const QuantContext& ctx,
                                                           const QuantSetting& probe, int max_rows,
                                                           size_t stream_budget_bytes) {
  const LoadedModel& m = *ctx.model;
  const ModelConfig& c = m.config;
  QuantContext sub = ctx;
  if (static_cast<int>(sub.rows.size()) > max_rows) sub.rows.resize(static_cast<size_t>(max_rows));
  const int rows = static_cast<int>(sub.rows.size()), length = static_cast<int>(sub.rows[0].size());
  BlockRunner runner(*ctx.backend, c, rows, length);
  std::vector<float> norm = tensor_to_f32(m.weights.get("model.norm.weight"));
  const bool own_head = !c.tie_embeddings && m.weights.has("lm_head.weight");
  std::vector<float> head =
      tensor_to_f32(m.weights.get(own_head ? "lm_head.weight" : "model.embed_tokens.weight"));
  const int64_t vocab = static_cast<int64_t>(head.size()) / c.dim;
  const Tensor norm_t = runner.upload_weight_floats(norm, 1, c.dim);
  const Tensor head_t = runner.upload_weight_floats(head, vocab, c.dim);
  if (head_t.owner != nullptr) std::vector<float>().swap(head);  // the backend has its own copy

  std::vector<Stream> streams;
  size_t stream_bytes = 0;
  // Wall seconds per part, for the log: uploading blocks (and waiting for their loading), carrying
  // the earlier units' states, probing (the partial forward, Hessian, GPTQ), the final logits and
  // KLs.
  double t_load = 0, t_carry = 0, t_probe = 0, t_kl = 0;
  // The probes' parts: the reference forward keeping the units' inputs, Hessians and GPTQ
  // (host rotations included), uploading the perturbed weights, the perturbed forwards.
  double t_reference = 0, t_quantize = 0, t_upload = 0, t_forward = 0;
  int64_t carried = 0;
  auto clock = std::chrono::steady_clock::now();
  auto lap = [&](double& into) {
    const auto now = std::chrono::steady_clock::now();
    into += std::chrono::duration<double>(now - clock).count();
    clock = now;
  };
  Tensor ref = runner.to_device(embed_rows(sub));  // the unquantized hidden states
  // Units 1.. get quantizers of their own on the GPU (their buffers, ~3 n^2 float64 for a unit
  // of width n, stay for the pass): up to the 8B-class widths; wider models probe one unit at
  // a time in the memory the measurement needed.
  const bool parallel =
      ctx.parallel_units && ctx.gpu != nullptr && !ctx.rtn && c.hidden_dim <= 16384;
  std::vector<std::unique_ptr<GptqDevice>> lanes(kUnits);
  Progress bar("sensitivity", int64_t{c.n_layers} * kUnits * 2, ctx.progress);
  // The next block is loaded (read from the mapped file, or generated) on another thread while
  // this one's forwards and probes run; the backend is only used from this thread.
  std::future<BlockWeights> next = std::async(std::launch::async, [&] { return block_of(ctx, 0); });
  for (int b = 0; b < c.n_layers; ++b) {
    const BlockWeights w = next.get();
    if (b + 1 < c.n_layers)
      next = std::async(std::launch::async, [&ctx, b] { return block_of(ctx, b + 1); });
    const DeviceBlock dev = runner.upload(w);
    lap(t_load);
    for (Stream& s : streams) {  // the units of earlier blocks, through this unperturbed block
      if (!s.on_host.empty()) {
        Tensor t = runner.to_device(s.on_host);
        runner.run(t, dev, nullptr);
        s.on_host = runner.to_host(t);
      } else {
        runner.run(s.on_backend, dev, nullptr);
      }
      ++carried;
    }
    runner.backend().synchronize();
    lap(t_carry);
    // The reference through this block, keeping each unit's input: with only that unit
    // perturbed, everything before it in the block is unperturbed, so that input is the one its
    // own forward would see.
    const std::vector<float> input = runner.to_host(ref);
    std::vector<std::vector<float>> unit_inputs(kUnits);
    runner.run(ref, dev, [&](Unit at, const std::vector<float>& x, int64_t, DeviceBlock&) {
      unit_inputs[static_cast<int>(at)] = x;
    });
    const int64_t tokens = ref.rows;
    lap(t_reference);
    // The probes (GPTQ of a unit's weights at the probe setting, from its input) are independent
    // of one another, so on the GPU the units run at once, each on its own quantizer and host
    // thread: a GPTQ of one setting has one GPU thread per weight row walking the columns in
    // order, which leaves most of the GPU idle. Each unit's numbers are those of a sequential run.
    std::vector<UnitProbe> probes(kUnits);
    for (int u = 0; u < kUnits; ++u) {
      const int in = static_cast<int>(static_cast<int64_t>(unit_inputs[u].size()) / tokens);
      QuantSetting& st = probes[u].setting;  // the widest group up to the probe's that fits
      st = probe;
      while (st.group_size > 32 && in % st.group_size != 0) st.group_size /= 2;
      probes[u].skipped = in % st.group_size != 0;
    }
    auto run_probe = [&](int u, GptqDevice* gpu) {
      UnitProbe& p = probes[u];
      QuantContext own = ctx;  // its own quantizer and timings
      own.gpu = gpu;
      own.timings = ctx.timings != nullptr ? &p.timings : nullptr;
      const Unit unit = static_cast<Unit>(u);
      UnitQuantizer uq(own);
      uq.set_input(unit_inputs[u], tokens, layer_tensor(b, unit_linears(unit)[0].c_str()));
      for (const std::string& name : unit_linears(unit)) {
        double err = 0;
        QuantizedWeight q = uq.quantize(w.t.at(name), p.setting, &err);
        p.error += err;
        p.dequant.push_back(std::move(q.dequant));
      }
    };
    {
      // Declared after `probes`: on an exception the futures (which wait for their tasks) go
      // first.
      std::vector<std::future<void>> running;
      for (int u = 1; u < kUnits; ++u) {
        if (probes[u].skipped) continue;
        if (!parallel) {  // the CPU's GPTQ is threaded already
          run_probe(u, nullptr);
          continue;
        }
        if (lanes[u] == nullptr) lanes[u] = ctx.gpu->another();
        running.push_back(std::async(std::launch::async, run_probe, u, lanes[u].get()));
      }
      if (!probes[0].skipped) run_probe(0, ctx.gpu);
      for (std::future<void>& f : running) f.get();
    }
    for (const UnitProbe& p : probes)
      if (ctx.timings != nullptr) add_timings(*ctx.timings, p.timings);
    lap(t_quantize);
    for (int u = 0; u < kUnits; ++u) {
      const Unit unit = static_cast<Unit>(u);
      if (probes[u].skipped) {
        bar.step(2);
        continue;
      }
      Stream s;
      s.s.probe_error = probes[u].error;
      DeviceBlock perturbed = dev;
      // (the CPU backend reads probes[u].dequant in place during run)
      for (size_t i = 0; i < probes[u].dequant.size(); ++i)
        perturbed.t[unit_linears(unit)[i]] =
            runner.upload_tensor(unit_linears(unit)[i], probes[u].dequant[i]);
      Tensor h = runner.to_device(input);
      runner.backend().synchronize();
      lap(t_upload);
      runner.run(h, std::move(perturbed), nullptr);
      runner.backend().synchronize();
      lap(t_forward);
      bar.step();
      s.key = layer_tensor(b, unit_linears(unit)[0].c_str());
      const size_t bytes = h.row_bytes() * static_cast<size_t>(h.rows);
      if (stream_bytes + bytes <= stream_budget_bytes) {
        stream_bytes += bytes;
        s.on_backend = std::move(h);
      } else {
        s.on_host = runner.to_host(h);
      }
      streams.push_back(std::move(s));
    }
    runner.backend().synchronize();
    lap(t_probe);
  }
  const Tensor ref_logits = runner.logits(ref, norm_t, head_t);
  std::vector<float> ref_host;
  if (ref_logits.dtype != DType::F16) ref_host = runner.to_host(ref_logits);

  std::map<std::string, UnitSensitivity> out;
  for (Stream& s : streams) {
    const Tensor h = s.on_host.empty() ? s.on_backend : runner.to_device(s.on_host);
    s.on_backend = Tensor{};  // its memory goes back after this unit
    s.s.kl =
        kl_against(runner, ref_logits, ref_host, runner.logits(h, norm_t, head_t), ctx.threads);
    char line[200];
    std::snprintf(line, sizeof(line), "  %-40s KL %.6f rel. error %.6f sensitivity %.4f",
                  s.key.c_str(), s.s.kl, s.s.probe_error, s.s.sensitivity());
    bar.note(line);
    out[s.key] = s.s;
    bar.step();
  }
  lap(t_kl);
  bar.finish();
  t_probe += t_reference + t_quantize + t_upload + t_forward;
  std::string parts;
  if (ctx.timings != nullptr)
    parts = "of which Hessians " + std::to_string(ctx.timings->hessian) + " s, GPTQ " +
            std::to_string(ctx.timings->gptq) + " s, " + timing_breakdown(*ctx.timings);
  std::fprintf(
      stderr,
      "sensitivity: %zu units; blocks loaded+uploaded %.1f s, %lld carried block forwards "
      "%.1f s, probes %.1f s (reference forwards %.1f, Hessians+GPTQ %.1f, uploads %.1f, "
      "perturbed forwards %.1f; %s), logits+KL %.1f s (%s); %zu of them kept on the backend\n",
      out.size(), t_load, static_cast<long long>(carried), t_carry, t_probe, t_reference,
      t_quantize, t_upload, t_forward, parts.c_str(), t_kl, runner.backend().name().c_str(),
      static_cast<size_t>(std::count_if(streams.begin(), streams.end(),
                                        [](const Stream& s) { return s.on_host.empty(); })));
  return out;
}

}  // namespace gyre::quant
