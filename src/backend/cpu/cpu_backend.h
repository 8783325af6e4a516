// The CPU backend: the reference implementation of every op, f32 activations and accumulation,
// multithreaded over rows.
#pragma once
#include <memory>

#include "backend/backend.h"
#include "core/kv_quant.h"

namespace gyre {

// n_threads <= 0: all cores. kv_type F16 keeps the KV cache in f32 (the exact reference); q8/q4
// store it quantized (core/kv_quant.h).
std::unique_ptr<Backend> make_cpu_backend(int n_threads, KvType kv_type = KvType::F16);

}  // namespace gyre
