// What one conversion run sets up from its options, shared by `gyre convert` and its
// --synthetic form (convert.cc, synthetic.cc): the QuantContext options and the device (GPU
// GPTQ engine and backend), kept alive by QuantRuntime.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "quant/convert.h"
#include "quant/gptq_device.h"
#include "quant/measure.h"

namespace gyre::quant {

struct QuantRuntime {
  std::string device;  // "cpu", "cuda", "cuda:N"
  std::unique_ptr<GptqDevice> gpu;
  std::unique_ptr<Backend> backend;
  QuantTimings timings;
};

// Copies o's GPTQ options into ctx and opens the device o names (default: the GPU when present),
// pointing ctx's gpu, backend and timings into rt.
void open_runtime(const ConvertOptions& o, QuantContext& ctx, QuantRuntime& rt);

}  // namespace gyre::quant
