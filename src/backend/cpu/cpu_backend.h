// The CPU backend: the reference implementation of every op, f32 activations and accumulation,
// multithreaded over rows.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace gyre {

std::unique_ptr<Backend> make_cpu_backend(int n_threads);  // n_threads <= 0: all cores

}  // namespace gyre
