// `gyre bench --concurrency ...`: serving throughput and time-to-first-token through the Engine
// (bench_serve.cc), and the synthetic-model helpers it shares with cmd_bench.cc.
#pragma once
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace gyre {

struct ServeBenchOptions {
  std::string model, synthetic, device = "auto", kv_cache = "f16";
  int bits = 16, threads = 0;
  int trellis = 0;  // synthetic: trellis-coded weights at K bits (as gyre bench --trellis)
  std::vector<int> concurrency;  // concurrent requests per run
  int decode = 128;              // generated tokens per request (EOS ignored)
  int prefix = 2048;             // shared prompt prefix of the TTFT scenario
  int ttft_requests = 32;        // requests of the TTFT scenario (0: skip it)
  bool json = false;
};

// "1,8,32" -> {1, 8, 32}; throws gyre::Error on anything else.
std::vector<int> parse_concurrency(const std::string& list);
void run_serve_bench(const ServeBenchOptions& o);

// cmd_bench.cc: a known model shape, and views (of zeros) for every weight it needs; the CUDA
// backend fills them on the GPU after cuda_set_synthetic_weights.
ModelConfig synthetic_config(const std::string& name);
void synthetic_weights(const ModelConfig& c, WeightSet& w);

}  // namespace gyre
