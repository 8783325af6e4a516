// Test hooks (test_hooks.cu) that make timing bugs of the kernels show in the tests.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

namespace gyre::qlinear_detail {

// Fills every SM's shared memory with 0xff bytes (NaN) so that a kernel reading a shared-memory
// slot before its copy lands reads NaN, not what the previous launch of the same test left there.
void poison_shared_memory();

// Streams `passes` reads of the `bytes` at buf (a multiple of 16) on `stream`, one block of 256
// threads per SM, so that a kernel launched beside it on another stream finds DRAM busy, as a
// decode step's kernel does when it starts (PDL) under its predecessor: its global copies land
// late while what it reads from L2 does not. Plain loads, so it also pushes other data out of L2.
// Results go to *sink, so the reads stay.
void launch_memory_hog(const void* buf, size_t bytes, int passes, unsigned* sink,
                       cudaStream_t stream);

}  // namespace gyre::qlinear_detail
