// gyre convert: Gyre's own quantizer (src/quant/convert.h).
#include <filesystem>
#include <memory>

#include "cli/bench_serve.h"
#include "cli/commands.h"
#include "core/error.h"
#include "quant/convert.h"
#include "quant/gguf_source.h"
#include "quant/synthetic.h"

namespace gyre {

void add_convert_command(CLI::App& app) {
  auto o = std::make_shared<quant::ConvertOptions>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Quantize a Hugging Face model folder or a GGUF file (GPTQ, bit widths chosen per layer)");
  auto synthetic = std::make_shared<std::string>();
  cmd->add_option("-m,--model", o->model,
                  "input model: a folder (config.json + safetensors) or a .gguf file");
  auto dequantize_only = std::make_shared<bool>(false);
  cmd->add_flag("--dequantize-only", *dequantize_only,
                "with a .gguf model: only write its dequantized (FP16) twin as a Hugging Face "
                "folder, tokenizer.json included");
  cmd->add_option("--synthetic", *synthetic,
                  "time the conversion of a model shape with random weights instead (" +
                      std::string("llama3-8b, llama2-7b, mistral-7b, llama-30b)"));
  auto synthetic_layers = std::make_shared<int>(0);
  cmd->add_option("--synthetic-layers", *synthetic_layers,
                  "with --synthetic: only the first N blocks (all blocks have one shape)");
  cmd->add_option("--device", o->device,
                  "cpu, cuda or cuda:N (default: the GPU when present, else cpu)");
  cmd->add_option("-o,--out", o->out, "output folder")->required();
  cmd->add_option("--bpw", o->bpw, "target bits per weight of the decoder's linear layers")
      ->capture_default_str();
  cmd->add_option("--head-bits", o->head_bits,
                  "LM head bits: 2-6 or 8, 0 keeps it unquantized, -1: 8 at targets of 6 bits or "
                  "more, else 6")
      ->capture_default_str();
  auto shard_mb = std::make_shared<int64_t>(4096);
  cmd->add_option("--shard-mb", *shard_mb,
                  "largest safetensors shard of the output, MiB (one model.safetensors when the "
                  "model fits in one)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--calibration", o->calibration, "calibration text file (default: built in)");
  cmd->add_option("--rows", o->rows, "calibration rows")->capture_default_str();
  cmd->add_option("--length", o->length, "tokens per calibration row")->capture_default_str();
  cmd->add_option("--damp", o->damp, "GPTQ damping, fraction of the mean Hessian diagonal")
      ->capture_default_str();
  cmd->add_option("--chooser", o->chooser,
                  "kl: weigh each unit's error by its measured effect on the output; plain: "
                  "unweighted sum")
      ->capture_default_str();
  cmd->add_flag("--rotate", o->rotate,
                "fold random orthogonal rotations into the weights first (better low-bit quality, "
                "unties the LM head)");
  cmd->add_flag("--hadamard", o->hadamard,
                "rotate each decoder layer's input by random-sign block Hadamard matrices "
                "(incoherence processing; the backends rotate activations at run time)");
  cmd->add_flag("--trellis", o->trellis,
                "trellis-coded layers (K = 2..6, 8 bits, chosen per unit) for the rotated units "
                "whose layers tile into 16 x 16; implies --hadamard (format version 4)");
  cmd->add_option("--sensitivity-rows", o->sensitivity_rows,
                  "calibration rows the sensitivity pass runs on")
      ->capture_default_str();
  cmd->add_flag("!--no-clip-search", o->clip_search,
                "plain min/max group scales instead of the clipping search on the "
                "Hessian-weighted error");
  cmd->add_flag("--target-correction,!--no-target-correction", o->target_correction,
                "GPTQ toward W C H^-1: the layer's original output from its quantized-model "
                "input (runs the unquantized blocks alongside; on by default)");
  cmd->add_flag("!--no-exact-grid", o->exact_grid,
                "quantize layers already on their setting's grid (GGUF sources at their own "
                "width) like any other, instead of storing them exactly");
  cmd->add_option("--target-correction-damp", o->target_damp,
                  "its regularization toward the original weights, fraction of the mean Hessian "
                  "diagonal")
      ->capture_default_str();
  cmd->add_option("--scale-refit", o->scale_refit,
                  "after GPTQ, refit each row's group scales with the codes fixed: off, diag "
                  "(diagonal Hessian) or full")
      ->capture_default_str();
  cmd->add_option("--measurement", o->measurement, "reuse this measurement.json");
  cmd->add_option("--uniform", o->uniform,
                  "baseline: every layer at BITS:GROUP[:asym], no measurement; "
                  "BITS:GROUP:sym|asym:MIXBITSxEIGHTHS mixes two widths");
  cmd->add_flag("--rtn", o->rtn, "baseline: round to nearest instead of GPTQ");
  cmd->add_flag("!--no-mixes", o->mixes,
                "measure one-width settings only (no mixes of two widths: a shorter measurement)");
  cmd->add_flag("!--no-act-order", o->act_order, "visit columns in their stored order");
  cmd->add_option("-t,--threads", o->threads, "CPU threads (default: all cores)");
  cmd->add_flag("!--no-progress", o->progress, "no progress bar on stderr");
  cmd->callback([o, synthetic, synthetic_layers, dequantize_only, shard_mb] {
    GYRE_CHECK(o->model.empty() != synthetic->empty(), "give either -m MODEL or --synthetic NAME");
    o->shard_bytes = static_cast<uint64_t>(*shard_mb) << 20;
    if (*dequantize_only) {
      GYRE_CHECK(quant::is_gguf_file(o->model), "--dequantize-only needs a .gguf model");
      GYRE_CHECK(!std::filesystem::exists(o->out + "/config.json"), "'", o->out,
                 "' already holds a model; choose a new output folder");
      quant::export_gguf_as_hf(o->model, o->out, o->shard_bytes);
    } else if (synthetic->empty())
      quant::convert_model(*o);
    else {
      ModelConfig c = synthetic_config(*synthetic);
      GYRE_CHECK(*synthetic_layers >= 0 && *synthetic_layers <= c.n_layers,
                 "--synthetic-layers must be between 1 and ", c.n_layers);
      if (*synthetic_layers > 0) c.n_layers = *synthetic_layers;
      quant::convert_synthetic(c, *synthetic, *o);
    }
  });
}

}  // namespace gyre
