// The CUDA backend (host-side entry points; compiled only when nvcc is found).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace gyre {

int cuda_device_count();  // 0 when no driver or device
std::unique_ptr<Backend> make_cuda_backend(int device_index, const BackendOptions& options);

// Device memory held by a CUDA backend, by use, and the device's free/total memory.
struct CudaMemoryReport {
  size_t weights = 0, kv_cache = 0, scratch = 0, free = 0, total = 0;
};
// The helpers below throw gyre::Error when `backend` is not a CUDA backend.
CudaMemoryReport cuda_memory_report(Backend& backend);
// From now on upload_weight ignores the host data and fills each weight on the GPU with
// deterministic pseudo-random values (never zeros) of the right shape: synthetic benchmarks.
void cuda_set_synthetic_weights(Backend& backend, uint64_t seed);
// ... with k_proj, v_proj and up_proj at `bits` (2..8) and the other projections at
// BackendOptions::weight_bits: fused Q|K|V and gate|up of two widths, as in EXL2 checkpoints.
void cuda_set_synthetic_part_bits(Backend& backend, int bits);
// ... with every quantized projection trellis-coded (backend/cpu/trellis.h) at
// BackendOptions::weight_bits = K: random tile words, positive scales per row and group of
// hadamard_block_for(cols) columns (the converter's group; BackendOptions::group_size if none).
void cuda_set_synthetic_trellis(Backend& backend, bool on);
// Device memory bandwidth in bytes/s, measured with a large device-to-device copy
// (bytes read + bytes written over the time).
double cuda_measure_bandwidth(Backend& backend);
// Decode-step graphs, on by default (GYRE_CUDA_GRAPH=0 in the environment turns both parts off):
// `buckets` pads batched decode steps to bucket row counts (Backend::decode_bucket), `record`
// records steps as CUDA graphs and replays them. Buckets without records run eagerly exactly
// what a record replays (tests compare the two).
void cuda_set_decode_graphs(Backend& backend, bool buckets, bool record);
uint64_t cuda_graph_replays(Backend& backend);  // recorded steps replayed so far
uint64_t cuda_fed_steps(Backend& backend);      // fed greedy decode steps launched so far
// Fused-norm matmuls so far that read the residual in their weight's column order as the
// matmul_add before them left it (act-order weights; cuda_fused.cc).
uint64_t cuda_permuted_handoffs(Backend& backend);
// Decode-row gathers that filled every group's row of a fused weight of mixed groups at once
// (cuda_fused_parts.cc).
uint64_t cuda_parts_row_gathers(Backend& backend);

}  // namespace gyre
