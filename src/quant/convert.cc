#include "quant/convert.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend/backend.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/gyre_quant_loader.h"
#include "model/safetensors.h"
#include "quant/calibration.h"
#include "quant/convert_job.h"
#include "quant/convert_pass.h"
#include "quant/gguf_source.h"
#include "quant/gptq.h"
#include "quant/gptq_device.h"
#include "quant/gptq_trellis.h"
#include "quant/measure.h"
#include "quant/optimizer.h"
#include "quant/progress.h"
#include "quant/rotate.h"
#include "quant/runtime.h"
#include "quant/sensitivity.h"
#include "quant/st_writer.h"

namespace gyre::quant {

namespace fs = std::filesystem;

namespace {

// Fixed, so a conversion with --rotate is reproducible (and resumable).
constexpr uint64_t kRotationSeed = 20261122;

// BITS:GROUP[:sym|asym[:MIXBITSxEIGHTHS]], e.g. 3:128:sym:4x2 (a quarter of the groups at 4 bits).
QuantSetting parse_uniform(const std::string& s) {
  QuantSetting st;
  char kind[8] = "sym";
  char tail = 0;
  const int n = std::sscanf(s.c_str(), "%d:%d:%7[a-z]:%dx%d%c", &st.bits, &st.group_size, kind,
                            &st.mix_bits, &st.mix_eighths, &tail);
  GYRE_CHECK(
      (n == 2 || n == 3 || n == 5) && (std::string(kind) == "sym" || std::string(kind) == "asym"),
      "--uniform must look like BITS:GROUP, BITS:GROUP:asym or BITS:GROUP:sym:MIXBITSxEIGHTHS, "
      "got '",
      s, "'");
  st.sym = std::string(kind) == "sym";
  quant_setting_validate(st, st.mixed() ? 2 * st.group_size : st.group_size, "--uniform");
  return st;
}

// The setting with its group narrowed to the widest of 128/64/32 (at most the asked one) that
// divides cols; false when none does (the layer stays unquantized).
bool fit_setting(QuantSetting& s, int64_t cols) {
  for (int g : {128, 64, 32})
    if (g <= s.group_size && cols % g == 0) {
      s.group_size = g;
      return true;
    }
  return false;
}

// With `trellis`, the units that take it (trellis_unit) get K = st.bits trellis-coded.
Plan uniform_plan(const LoadedModel& m, const QuantSetting& st, bool trellis) {
  Plan plan;
  for (int b = 0; b < m.config.n_layers; ++b)
    for (int u = 0; u < kUnits; ++u) {
      std::vector<int64_t> rows;
      for (const std::string& s : unit_linears(static_cast<Unit>(u)))
        rows.push_back(m.weights.get(layer_tensor(b, s.c_str()) + ".weight").rows());
      const int64_t unit_cols =
          m.weights.get(layer_tensor(b, unit_linears(static_cast<Unit>(u))[0].c_str()) + ".weight")
              .cols();
      const bool coded = trellis_unit(trellis, rows, unit_cols);
      for (const std::string& s : unit_linears(static_cast<Unit>(u))) {
        const std::string name = layer_tensor(b, s.c_str());
        if (coded) {
          plan[name] = trellis_setting(st.bits, unit_cols);
          continue;
        }
        QuantSetting fit = st;
        const int64_t cols = m.weights.get(name + ".weight").cols();
        if (!fit_setting(fit, cols)) continue;
        if (fit.mixed() && cols / fit.group_size < 2) fit.mix_bits = fit.mix_eighths = 0;
        plan[name] = fit;
      }
    }
  return plan;
}

// Each unit's weight in the choice: its measured sensitivity (KL per unit of relative error);
// units without one (none measured, or a width the probe's group does not divide) get the
// mean of the others, or 1 when there are none.
double unit_weight(const Measurement& meas, const std::string& first_layer, bool weighted) {
  if (!weighted || meas.sensitivity.empty()) return 1.0;
  const auto it = meas.sensitivity.find(first_layer);
  if (it != meas.sensitivity.end()) return it->second.sensitivity();
  double sum = 0;
  for (const auto& [name, s] : meas.sensitivity) sum += s.sensitivity();
  return sum / static_cast<double>(meas.sensitivity.size());
}

}  // namespace

// One choice per unit (linears sharing an input get one setting, so they stay fusable).
Plan optimized_plan(const LoadedModel& m, const Measurement& meas, double bpw, bool weighted) {
  std::vector<std::vector<std::string>> units;
  std::vector<std::vector<Choice>> choices;
  std::vector<std::vector<QuantSetting>> settings;
  double numel_total = 0;
  for (int b = 0; b < m.config.n_layers; ++b)
    for (int u = 0; u < kUnits; ++u) {
      std::vector<const LayerErrors*> members;
      for (const std::string& s : unit_linears(static_cast<Unit>(u))) {
        const std::string name = layer_tensor(b, s.c_str());
        const LayerErrors* le = meas.find(name);
        if (le == nullptr) continue;
        if (m.weights.has(name + ".weight")) {  // (a synthetic model has no weight views)
          const TensorView& t = m.weights.get(name + ".weight");
          GYRE_CHECK(t.rows() == le->rows && t.cols() == le->cols, "the measurement's layer ", name,
                     " has another shape than the model's");
        }
        members.push_back(le);
      }
      if (members.empty()) continue;
      std::vector<Choice> cs;
      std::vector<QuantSetting> ss;
      const double weight = unit_weight(meas, members[0]->name, weighted);
      for (const auto& [st, err0] : members[0]->errors) {
        Choice c;
        bool everywhere = true;
        for (const LayerErrors* le : members) {
          bool found = false;
          for (const auto& [st2, e] : le->errors)
            if (st2 == st) {
              c.error += weight * e;
              found = true;
            }
          everywhere = everywhere && found;
          c.cost_bits += st.stored_bits(le->rows, le->cols);
        }
        if (!everywhere) continue;
        cs.push_back(c);
        ss.push_back(st);
      }
      GYRE_CHECK(!cs.empty(), "the measurement has no common setting for unit of ",
                 members[0]->name);
      std::vector<std::string> names;
      for (const LayerErrors* le : members) {
        names.push_back(le->name);
        numel_total += static_cast<double>(le->rows * le->cols);
      }
      units.push_back(names);
      choices.push_back(cs);
      settings.push_back(ss);
    }
  GYRE_CHECK(!units.empty(), "the model has no layer that can be quantized");
  const std::vector<int> pick = choose_settings(choices, bpw * numel_total);
  Plan plan;
  for (size_t u = 0; u < units.size(); ++u)
    for (const std::string& n : units[u]) plan[n] = settings[u][pick[u]];
  return plan;
}

void open_runtime(const ConvertOptions& o, QuantContext& ctx, QuantRuntime& rt) {
  ctx.damp = o.damp;
  ctx.act_order = o.act_order;
  ctx.rtn = o.rtn;
  ctx.mixes = o.mixes;
  ctx.clip_search = o.clip_search;
  ctx.target_correction = o.target_correction;
  GYRE_CHECK(o.target_damp > 0.0 && o.target_damp <= 100.0,
             "--target-correction-damp must be in (0, 100], got ", o.target_damp);
  ctx.target_damp = o.target_damp;
  ctx.exact_grid = o.exact_grid;
  GYRE_CHECK(o.scale_refit == "off" || o.scale_refit == "diag" || o.scale_refit == "full",
             "--scale-refit must be off, diag or full, got '", o.scale_refit, "'");
  ctx.scale_refit = o.scale_refit == "full" ? 2 : o.scale_refit == "diag" ? 1 : 0;
  GYRE_CHECK(!o.trellis || !o.rtn, "--trellis has no round-to-nearest baseline (drop --rtn)");
  ctx.hadamard = o.hadamard || o.trellis;  // trellis layers are always rotated
  ctx.trellis = o.trellis;
  ctx.threads = o.threads > 0 ? o.threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ctx.progress = o.progress;
  rt.device = o.device.empty() ? default_quant_device() : o.device;
  if (rt.device != "cpu") rt.gpu = make_gptq_device(rt.device);
  ctx.gpu = rt.gpu.get();
  ctx.timings = &rt.timings;
  rt.backend = backend_create(rt.device, ctx.threads);
  ctx.backend = rt.backend.get();
}

nlohmann::json job_options(const ConvertOptions& o) {
  return {{"bpw", o.bpw},
          {"head_bits", o.head_bits},
          {"rows", o.rows},
          {"length", o.length},
          {"damp", o.damp},
          {"act_order", o.act_order},
          {"uniform", o.uniform},
          {"rtn", o.rtn},
          {"mixes", o.mixes},
          {"measurement", o.measurement},
          {"chooser", o.chooser},
          {"sensitivity_rows", o.sensitivity_rows},
          {"rotate", o.rotate},
          {"hadamard", o.hadamard},
          {"trellis", o.trellis},
          {"clip_search", o.clip_search},
          {"target_correction", o.target_correction},
          {"target_damp", o.target_damp},
          {"exact_grid", o.exact_grid},
          {"scale_refit", o.scale_refit}};
}

int resolved_head_bits(const ConvertOptions& o) {
  if (o.head_bits >= 0) return o.head_bits;
  const double bits = o.uniform.empty() ? o.bpw : parse_uniform(o.uniform).bits;
  return bits >= 6.0 ? 8 : 6;
}

void convert_model(const ConvertOptions& o_in) {
  ConvertOptions o = o_in;
  o.head_bits = resolved_head_bits(o_in);
  if (o.trellis) o.hadamard = true;
  GYRE_CHECK(o.bpw >= 2.0 && o.bpw <= 16.0, "--bpw must be between 2 and 16, got ", o.bpw);
  GYRE_CHECK(o.head_bits == 0 || o.head_bits == 2 || o.head_bits == 3 || o.head_bits == 4 ||
                 o.head_bits == 5 || o.head_bits == 6 || o.head_bits == 8,
             "--head-bits must be 0 (unquantized), 2, 3, 4, 5, 6 or 8, got ", o.head_bits);
  GYRE_CHECK(o.chooser == "kl" || o.chooser == "plain", "--chooser must be kl or plain, got '",
             o.chooser, "'");
  GYRE_CHECK(o.sensitivity_rows >= 1, "--sensitivity-rows must be at least 1");
  GYRE_CHECK(o.damp >= 0.0 && o.damp <= 1.0, "--damp must be in [0, 1], got ", o.damp);
  GYRE_CHECK(!o.out.empty(), "convert needs an output folder (-o)");
  GYRE_CHECK(o.shard_bytes > 0, "the output's shard size must be positive");
  const bool from_gguf = is_gguf_file(o.model);
  GYRE_CHECK(from_gguf || (fs::is_directory(o.model) && file_exists(o.model + "/config.json")), "'",
             o.model,
             "' is not a Hugging Face model folder (config.json + safetensors) or a .gguf file");
  const std::string job = o.out + "/.gyre-job";
  GYRE_CHECK(!fs::exists(o.out + "/config.json") || fs::exists(job), "'", o.out,
             "' already holds a model; choose a new output folder");
  // Everything that can be checked is checked before a job folder is created.
  QuantSetting uniform;
  if (!o.uniform.empty()) uniform = parse_uniform(o.uniform);
  Measurement meas;
  if (o.uniform.empty() && !o.measurement.empty())
    meas = Measurement::from_json(read_json_file(o.measurement), o.measurement);
  const std::string text =
      o.calibration.empty() ? default_calibration_text() : read_text_file(o.calibration);
  // A GGUF model is converted from its dequantized twin, written (again, it is quick) into the
  // job folder; `src` is the conversion as if that folder had been given.
  ConvertOptions src = o;
  if (from_gguf) {
    src.model = job + "/gguf-source";
    export_gguf_as_hf(o.model, src.model, o.shard_bytes);
  }
  const nlohmann::json in_config = read_json_file(src.model + "/config.json");
  GYRE_CHECK(in_config.is_object() && !in_config.contains("quantization_config"), "'", o.model,
             "' is already quantized; convert needs an unquantized model");
  auto model = load_model(src.model);
  if (o.rotate) rotate_model(*model, kRotationSeed);
  if (o.uniform.empty() && !o.measurement.empty())
    // A measurement of the rotated model says nothing about the unrotated one; one made with
    // or without the clipping search still ranks the settings alike, so it may guide either.
    GYRE_CHECK(meas.meta.value("rotate", false) == o.rotate, "'", o.measurement,
               "' was measured with another --rotate option; measure again");
  if (o.uniform.empty() && !o.measurement.empty())
    GYRE_CHECK(meas.meta.value("hadamard", false) == o.hadamard, "'", o.measurement,
               "' was measured with another --hadamard option; measure again");
  if (o.uniform.empty() && !o.measurement.empty())
    GYRE_CHECK(meas.meta.value("trellis", false) == o.trellis, "'", o.measurement,
               "' was measured with another --trellis option; measure again");
  if (o.uniform.empty() && !o.measurement.empty())
    GYRE_CHECK(meas.blocks_done == model->config.n_layers, "'", o.measurement,
               "' is an unfinished measurement (", meas.blocks_done, " of ", model->config.n_layers,
               " blocks)");
  GYRE_CHECK(o.length <= model->config.max_seq_len || model->config.max_seq_len <= 0, "--length ",
             o.length, " exceeds the model's context of ", model->config.max_seq_len);
  QuantContext ctx;
  ctx.model = model.get();
  ctx.rows = calibration_rows(*model->tokenizer, text, o.rows, o.length, model->config.bos_id);

  std::error_code ec;
  fs::create_directories(job, ec);
  GYRE_CHECK(!ec, "cannot create '", job, "': ", ec.message());
  nlohmann::json sig = job_options(o);
  sig["model"] = fs::absolute(o.model).lexically_normal().string();
  sig["calibration_hash"] = std::to_string(std::hash<std::string>{}(text));
  if (file_exists(job + "/job.json")) {
    GYRE_CHECK(read_json_file(job + "/job.json") == sig, "'", job,
               "' belongs to a conversion with other options; delete it or pick another output");
    std::fprintf(stderr, "convert: resuming the job in %s\n", job.c_str());
  } else {
    write_file_atomic(job + "/job.json", sig.dump(2));
  }
  QuantRuntime rt;
  open_runtime(o, ctx, rt);
  const std::string& device = rt.device;
  QuantTimings& timings = rt.timings;
  std::fprintf(stderr, "convert: on %s\n", device.c_str());
  // Per phase: wall seconds, and the part spent in Hessians/factors and in GPTQ runs.
  auto phase_start = std::chrono::steady_clock::now();
  auto phase_done = [&](const char* what) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - phase_start).count();
    std::fprintf(stderr,
                 "convert: %s took %.1f s (Hessians+factors %.1f s, GPTQ+errors %.1f s; %s)\n",
                 what, s, timings.hessian, timings.gptq, timing_breakdown(timings).c_str());
    timings = QuantTimings{};
    phase_start = std::chrono::steady_clock::now();
  };

  Plan plan;
  const bool measured = o.uniform.empty();
  if (!measured) {
    plan = uniform_plan(*model, uniform, o.trellis);
  } else {
    if (!o.measurement.empty()) {
      // Checked before the job folder was made (above).
    } else {
      const std::string mpath = job + "/measurement.json";
      if (file_exists(mpath)) meas = Measurement::from_json(read_json_file(mpath), mpath);
      meas.meta = {{"model", sig["model"]},    {"rows", o.rows},
                   {"length", o.length},       {"damp", o.damp},
                   {"act_order", o.act_order}, {"method", o.rtn ? "rtn" : "gptq"},
                   {"rotate", o.rotate},       {"clip_search", o.clip_search},
                   {"hadamard", o.hadamard},   {"trellis", o.trellis}};
      measure(ctx, meas,
              [&](const Measurement& m) { write_file_atomic(mpath, m.to_json().dump(1)); });
      phase_done("measurement");
    }
    if (o.chooser == "kl" && meas.sensitivity.empty()) {
      meas.sensitivity = measure_sensitivity(ctx, kSensitivityProbe, o.sensitivity_rows);
      write_file_atomic(job + "/measurement.json", meas.to_json().dump(1));
      phase_done("sensitivity");
    }
    plan = optimized_plan(*model, meas, o.bpw, o.chooser == "kl");
  }
  quantize_pass(ctx, plan, job, o.head_bits);
  phase_done("quantization");
  write_output(ctx, src, plan, job, in_config, measured ? &meas : nullptr);
  fs::remove_all(job, ec);
}

}  // namespace gyre::quant
