#include "quant/measure.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>

#include "core/error.h"
#include "quant/gptq.h"
#include "quant/gptq_device.h"
#include "quant/gptq_trellis.h"
#include "quant/linalg.h"
#include "quant/progress.h"
#include "quant/unit_quant.h"

namespace gyre::quant {

std::vector<QuantSetting> candidate_settings() {
  std::vector<QuantSetting> out;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int g : {32, 64, 128}) {
      out.push_back({bits, g, true});
      if (bits <= 4) out.push_back({bits, g, false});
    }
  // Mixes of two widths (gyre_qformat.h): a quarter or half of the groups, those with the most
  // input energy, one bit wider; group 128 only (and 64 at 3 bits, the 3 bpw region), to keep
  // the measurement's cost near 1.5x the one-width candidates'.
  for (int bits : {2, 3, 4, 5})
    for (int g : {64, 128}) {
      if (g == 64 && bits != 3) continue;
      for (int eighths : {2, 4}) {
        out.push_back({bits, g, true, bits + 1, eighths});
        if (bits <= 3) out.push_back({bits, g, false, bits + 1, eighths});
      }
    }
  // The 8 bpw region (no 7-bit width): 8-bit g128 alone costs 8.125 bits per weight, so at a
  // target of 8.0 whole units had to drop to 6 bits; these keep most groups at 8.
  for (int eighths : {4, 6, 7}) out.push_back({6, 128, true, 8, eighths});
  return out;
}

std::vector<QuantSetting> settings_for(const std::vector<QuantSetting>& all, int64_t cols) {
  std::vector<QuantSetting> out;
  for (const QuantSetting& s : all)
    if (cols % s.group_size == 0 && (!s.mixed() || cols / s.group_size >= 2)) out.push_back(s);
  return out;
}

bool trellis_unit(bool trellis, const std::vector<int64_t>& rows, int64_t cols) {
  if (!trellis || hadamard_block_for(cols) == 0) return false;
  for (int64_t r : rows)
    if (!trellis_tileable(r, cols)) return false;
  return !rows.empty();
}

std::vector<QuantSetting> trellis_candidates(int64_t cols) {
  std::vector<QuantSetting> out;
  for (int k : {2, 3, 4, 5, 6, 8}) out.push_back(trellis_setting(k, cols));
  return out;
}

const LayerErrors* Measurement::find(const std::string& name) const {
  for (const LayerErrors& l : layers)
    if (l.name == name) return &l;
  return nullptr;
}

nlohmann::json Measurement::to_json() const {
  nlohmann::json j;
  j["format"] = "gyre-measurement";
  j["version"] = 1;
  j["meta"] = meta;
  j["blocks_done"] = blocks_done;
  j["layers"] = nlohmann::json::array();
  for (const LayerErrors& l : layers) {
    nlohmann::json e = nlohmann::json::array();
    for (const auto& [s, err] : l.errors) {
      e.push_back({{"bits", s.bits}, {"group_size", s.group_size}, {"sym", s.sym}, {"error", err}});
      if (s.mixed()) {
        e.back()["mix_bits"] = s.mix_bits;
        e.back()["mix_eighths"] = s.mix_eighths;
      }
      if (s.trellis) e.back()["trellis"] = true;
    }
    j["layers"].push_back({{"name", l.name}, {"shape", {l.rows, l.cols}}, {"errors", e}});
  }
  if (!sensitivity.empty()) {
    nlohmann::json s = nlohmann::json::object();
    for (const auto& [name, u] : sensitivity)
      s[name] = {{"kl", u.kl}, {"probe_error", u.probe_error}};
    j["sensitivity"] = s;
  }
  return j;
}

Measurement Measurement::from_json(const nlohmann::json& j, const std::string& where) {
  try {
    GYRE_CHECK(
        j.is_object() && j.value("format", "") == "gyre-measurement" && j.value("version", 0) == 1,
        where, " is not a gyre measurement (version 1)");
    Measurement m;
    m.meta = j.at("meta");
    m.blocks_done = j.at("blocks_done").get<int>();
    for (const auto& l : j.at("layers")) {
      LayerErrors le;
      le.name = l.at("name").get<std::string>();
      le.rows = l.at("shape").at(0).get<int64_t>();
      le.cols = l.at("shape").at(1).get<int64_t>();
      for (const auto& e : l.at("errors")) {
        QuantSetting s{e.at("bits").get<int>(), e.at("group_size").get<int>(),
                       e.at("sym").get<bool>(), e.value("mix_bits", 0), e.value("mix_eighths", 0)};
        s.trellis = e.value("trellis", false);
        quant_setting_validate(s, le.cols, where + ": layer " + le.name);
        const double err = e.at("error").get<double>();
        GYRE_CHECK(err >= 0.0, where, ": negative error for ", le.name);
        le.errors.emplace_back(s, err);
      }
      m.layers.push_back(std::move(le));
    }
    if (j.contains("sensitivity"))
      for (const auto& [name, u] : j.at("sensitivity").items()) {
        UnitSensitivity us{u.at("kl").get<double>(), u.at("probe_error").get<double>()};
        GYRE_CHECK(std::isfinite(us.kl) && us.kl >= 0 && std::isfinite(us.probe_error) &&
                       us.probe_error >= 0,
                   where, ": bad sensitivity for ", name);
        m.sensitivity[name] = us;
      }
    return m;
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": malformed measurement: ", e.what());
  }
}

std::string timing_breakdown(const QuantTimings& t) {
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "host rotations %.1f s, target correction setup %.1f s, block weights %.1f s, "
                "writing %.1f s",
                t.rotate, t.target, t.weights, t.write);
  return buf;
}

void add_timings(QuantTimings& into, const QuantTimings& t) {
  into.hessian += t.hessian;
  into.gptq += t.gptq;
  into.rotate += t.rotate;
  into.target += t.target;
  into.weights += t.weights;
  into.write += t.write;
}

BlockWeights block_of(const QuantContext& ctx, int layer) {
  if (ctx.blocks) return ctx.blocks(layer);
  return block_weights_from(ctx.model->weights, ctx.model->config, layer);
}

int64_t linear_cols(const ModelConfig& c, const std::string& suffix) {
  if (suffix == "self_attn.o_proj") return c.q_dim();
  if (suffix == "mlp.down_proj") return c.hidden_dim;
  return c.dim;
}

int64_t linear_rows(const ModelConfig& c, const std::string& suffix) {
  if (suffix == "self_attn.q_proj") return c.q_dim();
  if (suffix == "self_attn.k_proj" || suffix == "self_attn.v_proj") return c.kv_dim();
  if (suffix == "mlp.gate_proj" || suffix == "mlp.up_proj") return c.hidden_dim;
  return c.dim;
}

BlockPrefetch::BlockPrefetch(const QuantContext& ctx, int first, int end)
    : ctx_(ctx), at_(first), end_(end) {
  if (at_ < end_)
    pending_ = std::async(std::launch::async, [this, b = at_] { return block_of(ctx_, b); });
}

BlockWeights BlockPrefetch::next() {
  GYRE_CHECK(at_ < end_, "internal: no block left to prefetch");
  const auto t0 = std::chrono::steady_clock::now();
  BlockWeights w = pending_.get();
  if (ctx_.timings != nullptr)
    ctx_.timings->weights +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (++at_ < end_)
    pending_ = std::async(std::launch::async, [this, b = at_] { return block_of(ctx_, b); });
  return w;
}

BlockPrefetch::~BlockPrefetch() {
  if (pending_.valid()) pending_.wait();  // (an exception left it running: let it finish)
}

std::vector<float> embed_rows(const QuantContext& ctx) {
  if (ctx.embed) return ctx.embed(ctx.rows);
  const ModelConfig& c = ctx.model->config;
  const TensorView& table = ctx.model->weights.get("model.embed_tokens.weight");
  const size_t row_bytes = dtype_row_bytes(table.dtype, c.dim);
  std::vector<float> out;
  std::vector<uint8_t> aligned(row_bytes);
  for (const auto& row : ctx.rows)
    for (int id : row) {
      GYRE_CHECK(id >= 0 && id < table.shape[0], "calibration token ", id,
                 " is outside the embedding table");
      std::memcpy(aligned.data(), static_cast<const uint8_t*>(table.data) + id * row_bytes,
                  row_bytes);
      out.resize(out.size() + c.dim);
      dequantize_row(table.dtype, aligned.data(), out.data() + out.size() - c.dim, c.dim);
    }
  return out;
}

std::vector<double> hessian_of(const std::vector<float>& x, int64_t tokens, int n, int threads) {
  std::vector<double> h(static_cast<size_t>(n) * n, 0.0);
  hessian_add(h, x.data(), tokens, n, threads);
  symmetrize_upper(h, n);
  for (double& v : h) v *= 2.0 / static_cast<double>(tokens);
  return h;
}

void measure(const QuantContext& ctx, Measurement& m,
             const std::function<void(const Measurement&)>& save) {
  const ModelConfig& c = ctx.model->config;
  const int rows = static_cast<int>(ctx.rows.size());
  const int length = static_cast<int>(ctx.rows[0].size());
  std::vector<QuantSetting> all = candidate_settings();
  // Mixes choose their groups from the Hessian: GPTQ only (on either device).
  if (ctx.rtn || !ctx.mixes) std::erase_if(all, [](const QuantSetting& s) { return s.mixed(); });
  // A unit's candidates: with --trellis the trellis ones alone where the unit takes them (the
  // CPU encoder's cost is per candidate), else the scalar ones that fit its width.
  auto unit_cands = [&](Unit unit, int64_t cols) {
    std::vector<int64_t> rows_of;
    for (const std::string& s : unit_linears(unit)) rows_of.push_back(linear_rows(c, s));
    return trellis_unit(ctx.trellis, rows_of, cols) ? trellis_candidates(cols)
                                                    : settings_for(all, cols);
  };
  int64_t steps = 0;
  for (int u = 0; u < kUnits; ++u) {
    const Unit unit = static_cast<Unit>(u);
    const int64_t cols = linear_cols(c, unit_linears(unit)[0]);
    steps += static_cast<int64_t>(unit_cands(unit, cols).size() * unit_linears(unit).size());
  }
  Progress bar("measuring", steps * (c.n_layers - m.blocks_done), ctx.progress);
  BlockRunner runner(*ctx.backend, c, rows, length);
  std::vector<float> hidden = embed_rows(ctx);
  // With trellis candidates on the GPU the units of a block are measured at once, each on its own
  // quantizer and host thread, while this thread runs the forward: a unit's Hessian and LDLQ
  // column sweeps leave the GPU mostly idle between its encoder launches (the stacks are
  // 256-row samples). The scalar candidates' stacks are large (GiBs of float64 per quantizer):
  // one unit at a time there, and for models wider than the 8B class.
  const bool parallel =
      ctx.parallel_units && ctx.trellis && ctx.gpu != nullptr && !ctx.rtn && c.hidden_dim <= 16384;
  std::vector<std::unique_ptr<GptqDevice>> lanes(kUnits);  // unit 0 uses ctx.gpu
  std::vector<QuantContext> lane_ctx(kUnits, ctx);
  std::vector<QuantTimings> lane_timings(kUnits);
  std::vector<std::unique_ptr<UnitQuantizer>> lane_uq(kUnits);
  for (int u = 0; u < kUnits; ++u) {
    if (parallel && u > 0) lanes[u] = ctx.gpu->another();
    if (parallel) lane_ctx[u].gpu = u > 0 ? lanes[u].get() : ctx.gpu;
    if (ctx.timings != nullptr) lane_ctx[u].timings = &lane_timings[u];
    lane_uq[u] = std::make_unique<UnitQuantizer>(lane_ctx[u]);
  }
  BlockPrefetch blocks(ctx, 0, c.n_layers);
  for (int b = 0; b < c.n_layers; ++b) {
    BlockWeights w = blocks.next();
    if (b < m.blocks_done) {  // measured before an interruption: only move the states along
      runner.run(hidden, w, nullptr);
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    // Per unit: its layers' names and columns and each layer's errors at each candidate.
    struct UnitResult {
      std::vector<QuantSetting> cands;
      int in = 0;
      std::vector<std::vector<double>> errs;
    };
    std::vector<UnitResult> results(kUnits);
    auto measure_unit = [&w, &results, &lane_uq, b](int u, const std::vector<float>& x,
                                                    int64_t tokens) {
      const Unit unit = static_cast<Unit>(u);
      UnitQuantizer& q = *lane_uq[u];
      q.set_input(x, tokens, layer_tensor(b, unit_linears(unit)[0].c_str()));
      // The unit's layers together: on the GPU their trellis candidates share one stacked
      // LDLQ sweep.
      std::vector<const std::vector<float>*> ws;
      for (const std::string& s : unit_linears(unit)) ws.push_back(&w.t.at(s));
      results[u].errs = q.errors_many(ws, results[u].cands);
    };
    {
      // Declared after `results`: on an exception the futures (which wait for their tasks) go
      // first.
      std::vector<std::future<void>> running;
      // Measured on the unquantized model: each block sees the float outputs of those before it.
      runner.run(
          hidden, w, [&](Unit unit, const std::vector<float>& x, int64_t tokens, BlockWeights&) {
            const int u = static_cast<int>(unit);
            results[u].in = static_cast<int>(static_cast<int64_t>(x.size()) / tokens);
            results[u].cands = unit_cands(unit, results[u].in);
            if (results[u].cands.empty()) return;
            if (!parallel) return measure_unit(u, x, tokens);
            running.push_back(std::async(
                std::launch::async, [&measure_unit, u, x, tokens] { measure_unit(u, x, tokens); }));
          });
      for (std::future<void>& f : running) f.get();
    }
    for (int u = 0; u < kUnits; ++u) {
      const UnitResult& r = results[u];
      for (size_t l = 0; l < r.errs.size(); ++l) {
        const std::string s = unit_linears(static_cast<Unit>(u))[l];
        LayerErrors le;
        le.name = layer_tensor(b, s.c_str());
        le.cols = r.in;
        le.rows = static_cast<int64_t>(w.t.at(s).size()) / r.in;
        for (size_t i = 0; i < r.cands.size(); ++i)
          le.errors.emplace_back(r.cands[i], r.errs[l][i]);
        bar.step(static_cast<int64_t>(r.cands.size()));
        m.layers.push_back(std::move(le));
      }
    }
    if (ctx.timings != nullptr)
      for (QuantTimings& t : lane_timings) {
        add_timings(*ctx.timings, t);
        t = QuantTimings{};
      }
    m.blocks_done = b + 1;
    save(m);
    char line[80];
    std::snprintf(line, sizeof(line), "  block %d measured in %.2f s", b,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    bar.note(line);
  }
  bar.finish();
}

}  // namespace gyre::quant
