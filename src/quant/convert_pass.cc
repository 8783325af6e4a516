#include "quant/convert_pass.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "backend/cpu/trellis.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/gyre_quant_loader.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "quant/progress.h"
#include "quant/unit_quant.h"

namespace gyre::quant {

namespace fs = std::filesystem;

namespace {

const char* kHead = "lm_head";

// The tensor the LM head multiplies by: lm_head.weight, or the embedding table when tied.
const TensorView& head_weight(const LoadedModel& m) {
  if (!m.config.tie_embeddings && m.weights.has("lm_head.weight"))
    return m.weights.get("lm_head.weight");
  return m.weights.get("model.embed_tokens.weight");
}

template <typename T>
StTensor st_from(const std::string& name, const char* dtype, std::vector<int64_t> shape,
                 const std::vector<T>& v) {
  StTensor t{name, dtype, std::move(shape), {}};
  t.bytes.resize(v.size() * sizeof(T));
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

// The dequantized floats of the plan's layers stored in a job file (what the loader will make).
std::map<std::string, std::vector<float>> load_job_file(const std::string& path, const Plan& plan,
                                                        const LoadedModel& m, bool hadamard) {
  WeightSet raw, out;
  safetensors_load(path, raw);
  Plan part;
  for (const auto& [name, st] : plan)
    if (raw.has(name + ".qweight")) part[name] = st;
  nlohmann::json cfg;
  cfg["quantization_config"] = {{"quant_method", "gyre"},
                                {"version", plan_format_version(part, hadamard)},
                                {"layers", plan_layers_json(part, m, hadamard)}};
  gyre_quant_load(cfg, raw, out, path);
  std::map<std::string, std::vector<float>> floats;
  for (const auto& [name, st] : part) floats[name] = tensor_to_f32(out.get(name + ".weight"));
  return floats;
}

void log_layer(Progress& bar, const std::string& name, const QuantSetting& st, double err,
               double seconds) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "  %-40s %-12s rel. error %.6f (%.2f s)", name.c_str(),
                st.str().c_str(), err, seconds);
  bar.note(buf);
}

}  // namespace

namespace {

// One width's tensors (PREFIX.qweight / .scales / .mins) for the columns `cols` of q (all of a
// layer, or one part of a mix), with setting st.
void pack_part(const QuantizedWeight& q, const std::vector<int>& cols, const QuantSetting& st,
               const std::string& prefix, std::vector<StTensor>& out) {
  const auto n = static_cast<int64_t>(cols.size());
  const int64_t words = n * st.bits / 32, groups = n / st.group_size,
                all_groups = q.cols / st.group_size;
  std::vector<uint32_t> packed(static_cast<size_t>(q.rows * words));
  std::vector<int> row(static_cast<size_t>(n));
  std::vector<uint16_t> scales(static_cast<size_t>(q.rows * groups)), mins(scales.size());
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t j = 0; j < n; ++j) row[j] = q.q[r * q.cols + cols[j]];
    quant_pack_row(row.data(), n, st.bits, packed.data() + r * words);
    for (int64_t k = 0; k < groups;
         ++k) {  // the part's k-th group is the layer's group of its columns
      const int64_t g = r * all_groups + cols[k * st.group_size] / st.group_size;
      scales[r * groups + k] = q.scales[g];
      if (!st.sym) mins[r * groups + k] = q.mins[g];
    }
  }
  out.push_back(st_from(prefix + ".qweight", "I32", {q.rows, words}, packed));
  out.push_back(st_from(prefix + ".scales", "F16", {q.rows, groups}, scales));
  if (!st.sym) out.push_back(st_from(prefix + ".mins", "F16", {q.rows, groups}, mins));
}

}  // namespace

int plan_format_version(const Plan& plan, bool hadamard) {
  bool any_mix = false, any_trellis = false;
  for (const auto& [name, st] : plan) {
    any_mix = any_mix || st.mixed();
    any_trellis = any_trellis || st.trellis;
  }
  return quant_format_version(any_mix, hadamard, any_trellis);
}

std::vector<StTensor> pack_tensors(const QuantizedWeight& q, const std::string& name) {
  const QuantSetting& st = q.setting;
  if (st.trellis) {  // the tiles' words as they are: row tr of qweight is tile row tr
    const int64_t words = int64_t{q.cols} / kTrellisTileDim * trellis_tile_words(st.bits);
    GYRE_CHECK(q.had.active() && static_cast<int64_t>(q.trellis.size()) ==
                                     int64_t{q.rows} / kTrellisTileDim * words,
               "internal: trellis layer ", name, " has no rotation or the wrong number of words");
    std::vector<StTensor> out;
    out.push_back(st_from(name + ".qweight", "I32", {q.rows / kTrellisTileDim, words}, q.trellis));
    out.push_back(st_from(name + ".scales", "F16", {q.rows, q.cols / st.group_size}, q.scales));
    const std::vector<int16_t> signs(q.had.signs.begin(), q.had.signs.end());
    out.push_back(st_from(name + ".had_signs", "I16", {q.cols}, signs));
    return out;
  }
  std::vector<int> lo, hi;
  std::vector<bool> is_hi(static_cast<size_t>(q.cols / st.group_size), false);
  for (int g : q.hi_groups) is_hi[g] = true;
  for (int c = 0; c < q.cols; ++c) (is_hi[c / st.group_size] ? hi : lo).push_back(c);
  std::vector<StTensor> out;
  pack_part(q, lo, st.part(false), name, out);
  if (st.mixed()) {
    GYRE_CHECK(static_cast<int64_t>(q.hi_groups.size()) == st.mix_groups(q.cols),
               "internal: mixed layer ", name, " has ", q.hi_groups.size(), " chosen groups");
    pack_part(q, hi, st.part(true), name + ".hi", out);
    std::vector<int32_t> groups(q.hi_groups.begin(), q.hi_groups.end());
    out.push_back(
        st_from(name + ".hi_groups", "I32", {static_cast<int64_t>(groups.size())}, groups));
  }
  if (q.had.active()) {
    const std::vector<int16_t> signs(q.had.signs.begin(), q.had.signs.end());
    out.push_back(st_from(name + ".had_signs", "I16", {q.cols}, signs));
  }
  return out;
}

nlohmann::json plan_layers_json(const Plan& plan, const LoadedModel& m, bool hadamard) {
  const WeightSet& w = m.weights;
  // [rows, cols] of a planned layer: its tensor's, or by the config for a model whose blocks are
  // made on the fly (QuantContext::blocks: the synthetic ones).
  auto shape = [&](const std::string& name) -> std::pair<int64_t, int64_t> {
    if (name == kHead || w.has(name + ".weight")) {
      const TensorView& t = name != kHead             ? w.get(name + ".weight")
                            : w.has("lm_head.weight") ? w.get("lm_head.weight")
                                                      : w.get("model.embed_tokens.weight");
      return {t.rows(), t.cols()};
    }
    const size_t at = name.find('.', std::string("model.layers.").size());
    GYRE_CHECK(name.rfind("model.layers.", 0) == 0 && at != std::string::npos,
               "internal: no tensor for planned layer ", name);
    const std::string suffix = name.substr(at + 1);
    return {linear_rows(m.config, suffix), linear_cols(m.config, suffix)};
  };
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, st] : plan) {
    const auto [rows, cols] = shape(name);
    j[name] = {
        {"bits", st.bits}, {"group_size", st.group_size}, {"sym", st.sym}, {"shape", {rows, cols}}};
    if (st.mixed()) j[name]["mix"] = {{"bits", st.mix_bits}, {"hi_groups", st.mix_groups(cols)}};
    if (st.trellis) j[name]["trellis"] = true;
    // The decoder's layers are rotated (quant/hadamard.h), the LM head is not.
    if (hadamard && name != kHead && hadamard_block_for(cols) != 0)
      j[name]["hadamard"] = hadamard_block_for(cols);
  }
  return j;
}

void quantize_pass(const QuantContext& ctx, Plan& plan, const std::string& job, int head_bits) {
  const LoadedModel& m = *ctx.model;
  const ModelConfig& c = m.config;
  const int rows = static_cast<int>(ctx.rows.size()), length = static_cast<int>(ctx.rows[0].size());
  if (head_bits > 0) {
    QuantSetting st{head_bits, 128, true};
    for (int g : {128, 64, 32})
      if (head_weight(m).cols() % g == 0) {
        st.group_size = g;
        plan[kHead] = st;
        break;
      }
  }
  Progress bar("quantizing", static_cast<int64_t>(plan.size()), ctx.progress);
  BlockRunner runner(*ctx.backend, c, rows, length);
  std::vector<float> hidden = embed_rows(ctx);
  UnitQuantizer uq(ctx, /*refine=*/true);
  auto quantize = [&](const std::string& name, const std::vector<float>& w) {
    const QuantSetting& st = plan.at(name);
    double err = 0;
    const auto t0 = std::chrono::steady_clock::now();
    QuantizedWeight q = uq.quantize(w, st, &err);
    log_layer(bar, name, st, err,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    bar.step();
    return q;
  };
  // Target correction needs each unit's input in the unquantized model too: the original
  // blocks run alongside on their own hidden states, each unit's input kept for the hook.
  const bool tc = ctx.target_correction && !ctx.rtn;
  std::vector<float> hidden_fp;
  if (tc) hidden_fp = hidden;
  BlockPrefetch blocks(ctx, 0, c.n_layers);
  for (int b = 0; b < c.n_layers; ++b) {
    BlockWeights w = blocks.next();
    const std::string path = job + "/block_" + std::to_string(b) + ".safetensors";
    std::map<Unit, std::vector<float>> fp_inputs;
    if (tc)  // before the quantization below replaces w's floats; the hook leaves w as it is
      runner.run(hidden_fp, w, [&](Unit unit, const std::vector<float>& x, int64_t, BlockWeights&) {
        fp_inputs[unit] = x;
      });
    if (file_exists(path)) {  // done before an interruption: its quantized weights, then move on
      for (auto& [name, f] : load_job_file(path, plan, m, ctx.hadamard)) {
        w.t[name.substr(layer_tensor(b, "").size())] = std::move(f);
        bar.step();
      }
      runner.run(hidden, w, nullptr);
      continue;
    }
    std::vector<StTensor> tensors;
    runner.run(
        hidden, w, [&](Unit unit, const std::vector<float>& x, int64_t tokens, BlockWeights& bw) {
          std::vector<std::string> names;
          for (const std::string& s : unit_linears(unit))
            if (plan.count(layer_tensor(b, s.c_str()))) names.push_back(s);
          if (names.empty()) return;
          uq.set_input(x, tokens, layer_tensor(b, unit_linears(unit)[0].c_str()),
                       tc ? &fp_inputs.at(unit) : nullptr);
          // Trellis layers of one shape (k and v, gate and up) are quantized together: on the
          // GPU one stacked LDLQ sweep for both (each alone fills a fraction of the GPU).
          std::vector<bool> done(names.size(), false);
          for (size_t i = 0; i < names.size(); ++i) {
            if (done[i]) continue;
            std::vector<size_t> group{i};
            const QuantSetting& st = plan.at(layer_tensor(b, names[i].c_str()));
            for (size_t j = i + 1; j < names.size() && st.trellis; ++j) {
              const QuantSetting& sj = plan.at(layer_tensor(b, names[j].c_str()));
              if (!done[j] && sj.trellis && sj.group_size == st.group_size &&
                  bw.t[names[j]].size() == bw.t[names[i]].size())
                group.push_back(j);
            }
            std::vector<QuantizedWeight> qs;
            if (group.size() == 1) {
              qs.push_back(quantize(layer_tensor(b, names[i].c_str()), bw.t[names[i]]));
            } else {
              std::vector<const std::vector<float>*> ws;
              std::vector<QuantSetting> sts;
              for (size_t g : group) {
                ws.push_back(&bw.t[names[g]]);
                sts.push_back(plan.at(layer_tensor(b, names[g].c_str())));
              }
              std::vector<double> errs;
              const auto t0 = std::chrono::steady_clock::now();
              qs = uq.quantize_many(ws, sts, errs);
              const double sec =
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
              for (size_t g = 0; g < group.size(); ++g) {
                log_layer(bar, layer_tensor(b, names[group[g]].c_str()), sts[g], errs[g],
                          sec / static_cast<double>(group.size()));
                bar.step();
              }
            }
            for (size_t g = 0; g < group.size(); ++g) {
              const std::string& s = names[group[g]];
              const std::string name = layer_tensor(b, s.c_str());
              done[group[g]] = true;
              for (StTensor& t : pack_tensors(qs[g], name)) tensors.push_back(std::move(t));
              bw.t[s] = std::move(qs[g].dequant);  // later units and blocks see the quantized layer
            }
          }
        });
    const auto t_write = std::chrono::steady_clock::now();
    write_safetensors(path, tensors);
    if (ctx.timings != nullptr)
      ctx.timings->write +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_write).count();
  }
  const std::string head_path = job + "/head.safetensors";
  if (plan.count(kHead) && !file_exists(head_path)) {
    const std::vector<float> norm = tensor_to_f32(m.weights.get("model.norm.weight"));
    const std::vector<float> x = runner.final_norm(hidden, norm);
    std::vector<float> x_fp;
    if (tc) x_fp = runner.final_norm(hidden_fp, norm);
    uq.set_input(x, int64_t{rows} * length, {}, tc ? &x_fp : nullptr);
    const std::vector<float> hw = tensor_to_f32(head_weight(m));
    QuantSetting& hs = plan.at(kHead);
    // A head on a grid of its bits with smaller groups (a GGUF Q8_0 table at 8 bits: blocks of
    // 32) keeps that grid, stored exactly (UnitQuantizer::quantize), at the coarsest such group.
    const int64_t hrows = head_weight(m).rows(), hcols = head_weight(m).cols();
    if (ctx.exact_grid && !rtn_exact(hw.data(), hrows, hcols, hs))
      for (int g = hs.group_size / 2; g >= 32; g /= 2) {
        QuantSetting t = hs;
        t.group_size = g;
        if (hcols % g == 0 && rtn_exact(hw.data(), hrows, hcols, t)) {
          hs = t;
          break;
        }
      }
    const QuantizedWeight q = quantize(kHead, hw);
    write_safetensors(head_path, pack_tensors(q, kHead));
  } else if (plan.count(kHead)) {
    bar.step();
  }
  bar.finish();
  if (ctx.scale_refit != 0 && uq.refit_error_before() > 0.0)
    std::fprintf(stderr, "convert: scale refit: summed tr(E H E^T) %.6g -> %.6g (%.2f%% lower)\n",
                 uq.refit_error_before(), uq.refit_error_after(),
                 100.0 * (1.0 - uq.refit_error_after() / uq.refit_error_before()));
}

void write_output(const QuantContext& ctx, const ConvertOptions& o, const Plan& plan,
                  const std::string& job, const nlohmann::json& in_config,
                  const Measurement* measurement) {
  const LoadedModel& m = *ctx.model;
  const bool head_q = plan.count(kHead) != 0;
  // Views into the mapped source and job files: the model is streamed to disk, never held whole.
  std::vector<StSource> tensors;
  auto add = [&](const std::string& name, const TensorView& t) {
    tensors.push_back(
        {name, dtype_name(t.dtype), t.shape, static_cast<const uint8_t*>(t.data), t.nbytes});
  };
  // Unquantized tensors keep their dtype and bytes (the embedding, norms, biases, and layers
  // whose width fits no group size).
  for (const auto& [name, t] : m.weights.all()) {
    const std::string base = name.size() > 7 ? name.substr(0, name.size() - 7) : name;
    if (plan.count(base) && name.ends_with(".weight")) continue;
    if (name == "lm_head.weight" && (head_q || m.config.tie_embeddings)) continue;
    add(name, t);
  }
  std::vector<std::string> files;
  for (int b = 0; b < m.config.n_layers; ++b)
    files.push_back(job + "/block_" + std::to_string(b) + ".safetensors");
  if (head_q) files.push_back(job + "/head.safetensors");
  std::vector<WeightSet> quantized(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    safetensors_load(files[i], quantized[i]);
    for (const auto& [name, t] : quantized[i].all()) add(name, t);
  }
  double qbits = 0, qnumel = 0;
  for (const auto& [name, st] : plan) {
    if (name == kHead) continue;
    const TensorView& t = m.weights.get(name + ".weight");
    qbits += st.stored_bits(t.rows(), t.cols());
    qnumel += static_cast<double>(t.numel());
  }
  const std::vector<std::string> shards = write_safetensors_shards(o.out, tensors, o.shard_bytes);
  uint64_t out_bytes = 0;
  for (const std::string& f : shards) out_bytes += fs::file_size(o.out + "/" + f);
  nlohmann::json cfg = in_config;
  if (head_q || !m.config.tie_embeddings) cfg["tie_word_embeddings"] = false;  // --rotate unties
  nlohmann::json qc = {{"quant_method", "gyre"},
                       {"version", plan_format_version(plan, ctx.hadamard)},
                       {"bits_per_weight", qnumel > 0 ? qbits / qnumel : 16.0},
                       {"target_bits_per_weight", o.uniform.empty() ? o.bpw : 0.0},
                       {"uniform", o.uniform},
                       {"head_bits", o.head_bits},
                       {"method", ctx.rtn ? "rtn" : "gptq"},
                       {"act_order", ctx.act_order},
                       {"damp", ctx.damp},
                       {"rotated", o.rotate},
                       {"hadamard", ctx.hadamard},
                       {"trellis", ctx.trellis},
                       {"clip_search", ctx.clip_search},
                       {"target_correction", ctx.target_correction},
                       {"target_damp", ctx.target_damp},
                       {"scale_refit", o.scale_refit},
                       {"calibration_rows", ctx.rows.size()},
                       {"calibration_length", ctx.rows[0].size()},
                       {"layers", plan_layers_json(plan, m, ctx.hadamard)}};
  cfg["quantization_config"] = qc;
  write_file_atomic(o.out + "/config.json", cfg.dump(2));
  std::error_code ec;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                        "special_tokens_map.json", "generation_config.json", "added_tokens.json"})
    if (file_exists(o.model + "/" + f)) {
      fs::copy_file(o.model + "/" + f, o.out + "/" + f, fs::copy_options::overwrite_existing, ec);
      GYRE_CHECK(!ec, "cannot copy ", f, " into '", o.out, "': ", ec.message());
    }
  if (measurement != nullptr)
    write_file_atomic(o.out + "/measurement.json", measurement->to_json().dump(1));
  load_model(o.out);  // the folder must load: throws here rather than at first use
  std::fprintf(stderr,
               "convert: wrote %s (%.3f bits per weight over %zu quantized layers, %.2f MB in %zu "
               "file%s)\n",
               o.out.c_str(), qnumel > 0 ? qbits / qnumel : 16.0, plan.size() - (head_q ? 1 : 0),
               static_cast<double>(out_bytes) / 1e6, shards.size(), shards.size() == 1 ? "" : "s");
}

}  // namespace gyre::quant
