// The trellis encoder on the GPU (quant/cuda/trellis_cuda.h): one thread block per tile, the two
// Viterbi passes of quant/trellis_encode.cc, formulated as trellis_viterbi.cuh describes.
//
// Speed (the fast kernel; GYRE_TRELLIS_ENCODER_OLD=1 selects the first version, kept for A/B).
// The step is issue-bound: ~9.5 instructions per state in the old SASS (K = 4), 3 of them the
// code (IADD, IDP4A, FADD). A thread evaluates the same 64 states (K <= 6) at every step, so
// their codes are computed once per kernel: 16-32 kept in registers (as many as fit without
// spills), the others (K >= 3) as fp16 in shared memory, 8 per LDS.128 (integers in
// [-512, 508] are exact in fp16); the minima are read as float4; pass 1 needs no argmin before
// position 128 (labels start there), so those steps keep only the minimum (FMNMX): ~5.5-6
// instructions per state in the SASS. The tail no longer idles the block: tile n's traceback
// runs on thread 0 during tile n + 1's pass 1 (its dependent loads hidden behind the steps),
// then the whole block packs the words (one per thread) and sums the error (a reduction).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/trellis.h"
#include "quant/cuda/gptq_cuda_common.h"
#include "quant/cuda/trellis_cuda.h"
#include "quant/cuda/trellis_viterbi.cuh"

namespace gyre::quant::cuda {
namespace {

using namespace trellis_gpu;  // NOLINT: this file is its only user

extern __shared__ __align__(16) unsigned char trellis_smem[];  // both kernels' dynamic smem

// The codes of the states a thread evaluates at every step of forward_fast, state n = j fan + low
// = (group_j << K) | low with group_j = u' of its output j: for K <= 6 (64 states) in registers
// and shared memory, for K = 8 (256 states) recomputed from the state as the old kernel does.
template <int K>
struct Codes {
  using S = Shape<K>;
  static constexpr int kStates = S::kOutputs * S::kFan;
  static constexpr bool kCached = kStates <= 64;
  // The first kKept states' codes stay in registers. ptxas converts the kept halves to floats
  // once, outside the step loop, so each costs a register: all 64 spill at the 64 registers of
  // a 1024-thread block; these counts do not (ptxas -v).
  static constexpr int kKept = !kCached ? 0 : K == 3 ? 16 : K >= 4 ? 24 : 32;
  // The others in shared memory after smem_bytes (K = 2 has room for 8 of them only, 16 KB next
  // to its 198 KB, and recomputes the rest), as chunks of 8 halves per thread, chunk c of thread
  // x at uint4 c * threads + x (a warp's LDS.128 reads 512 contiguous bytes): one read and 8
  // conversions instead of 24 instructions (IADD, IDP4A, FADD per code).
  static constexpr bool kSmem = kCached;
  static constexpr int kChunks = !kSmem ? 0 : K == 2 ? 1 : (kStates - kKept) / 8;
  static constexpr int kInSmem = kKept + 8 * kChunks;  // states kKept..kInSmem - 1
  static constexpr size_t kSmemBytes = static_cast<size_t>(kChunks) * S::kThreads * sizeof(uint4);
  static_assert(kKept % 8 == 0 && smem_bytes<K>() % 16 == 0, "chunks: 8 states, 16 bytes");
  __half2 h[kKept > 0 ? kKept / 2 : 1];

  __device__ static uint32_t group_of(int j) {
    const int o = j * S::kThreads + static_cast<int>(threadIdx.x);
    return static_cast<uint32_t>(((o & (S::kFan - 1)) << S::kVBits) | (o >> K));
  }
  __device__ static float compute(int j, int low) {
    return code_of(((group_of(j) << K) | static_cast<uint32_t>(low)) * kTrellisMul + kTrellisAdd);
  }
  __device__ static uint32_t pair(int n) {  // the codes of states n, n + 1 as half2 bits
    const __half2 p =
        __floats2half2_rn(compute(n / S::kFan, n % S::kFan), compute(n / S::kFan, n % S::kFan + 1));
    return *reinterpret_cast<const uint32_t*>(&p);
  }
  // The chunks (kSmemBytes) follow the layout of carve; each thread writes and reads only its
  // own, so no barrier is needed. (Addressed from the shared array itself, not a pointer member,
  // so that ptxas keeps a 32-bit shared address and no extra registers.)
  __device__ static uint4* chunks() {
    return reinterpret_cast<uint4*>(trellis_smem + smem_bytes<K>()) + threadIdx.x;
  }
  __device__ void init() {
    if constexpr (kCached) {
#pragma unroll
      for (int n = 0; n < kKept; n += 2)
        h[n / 2] = __floats2half2_rn(compute(n / S::kFan, n % S::kFan),
                                     compute(n / S::kFan, n % S::kFan + 1));
    }
    if constexpr (kSmem) {
      for (int c = 0; c < kChunks; ++c) {
        const int n = kKept + 8 * c;
        chunks()[c * S::kThreads] = make_uint4(pair(n), pair(n + 2), pair(n + 4), pair(n + 6));
      }
    }
  }
  __device__ __forceinline__ static uint4 chunk(int c) {
    return chunks()[c * S::kThreads];
  }
  // Half k (0..7) of a chunk as a float.
  __device__ __forceinline__ static float half_at(const uint4& w, int k) {
    const uint32_t word = k < 2 ? w.x : k < 4 ? w.y : k < 6 ? w.z : w.w;
    return __half2float(__ushort_as_half(static_cast<unsigned short>(word >> (16 * (k & 1)))));
  }
  __device__ __forceinline__ float get(int j, int low, uint32_t x0) const {
    const int n = j * S::kFan + low;
    if (kCached && n < kKept) return (n & 1) ? __high2float(h[n / 2]) : __low2float(h[n / 2]);
    return code_of(x0 + static_cast<uint32_t>(low) * kTrellisMul);
  }
};

// One step of forward_fast for a thread's outputs: the same expressions and tie-break as
// forward. kArg: the argmins are needed (packed into the return value, and the labels written
// when `labels`); without them only the minima are kept.
template <int K, bool kArg>
__device__ __forceinline__ uint32_t relax(const Codes<K>& codes, const float* cur, float* nxt,
                                          const uint16_t* lcur, uint16_t* lnxt, float tv, float s,
                                          bool first_label, bool labels) {
  using S = Shape<K>;
  // Cached codes index registers, so their loops must unroll fully (K = 8: 64 float4 reads).
  constexpr int kUnroll = Codes<K>::kCached ? S::kFan / 4 : 4;
  uint32_t packed = 0;
  uint4 ch = make_uint4(0, 0, 0, 0);  // the current shared-memory chunk (Codes::kSmem)
#pragma unroll
  for (int j = 0; j < S::kOutputs; ++j) {
    const int o = j * S::kThreads + static_cast<int>(threadIdx.x);
    const int hi = o & (S::kFan - 1), v = o >> K;
    const int group = (hi << S::kVBits) | v;  // u'
    const int p0 = v << K;                    // a multiple of 4: float4-aligned
    const uint32_t x0 = (static_cast<uint32_t>(group) << K) * kTrellisMul + kTrellisAdd;
    const float4* prev = reinterpret_cast<const float4*>(cur + p0);
    float best = 0.0f;
    int arg = 0;
#pragma unroll kUnroll
    for (int q = 0; q < S::kFan / 4; ++q) {
      const float4 b4 = prev[q];
      const float bq[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int low = 4 * q + r;
        // n (compile-time once unrolled) picks the code's home; a chunk is read at its first
        // state (kKept is a multiple of 8) and may span two j (K = 2: fan 4).
        const int n = j * S::kFan + low;
        float code;
        if (Codes<K>::kSmem && n >= Codes<K>::kKept && n < Codes<K>::kInSmem) {
          if ((n - Codes<K>::kKept) % 8 == 0) ch = codes.chunk((n - Codes<K>::kKept) / 8);
          code = Codes<K>::half_at(ch, (n - Codes<K>::kKept) % 8);
        } else {
          code = codes.get(j, low, x0);
        }
        const float e = tv - s * code;
        const float c = bq[r] + e * e;
        if constexpr (kArg) {
          if (low == 0 || c < best) best = c, arg = low;
        } else {
          // One FMNMX instead of FSETP + FSEL: the same minimum unless a cost is NaN (then the
          // CPU's std::min and the argmin branch above disagree with each other anyway).
          best = low == 0 ? c : fminf(best, c);
        }
      }
    }
    nxt[group] = best;
    if constexpr (kArg) {
      packed |= static_cast<uint32_t>(arg) << (j * K);
      if (labels) lnxt[group] = first_label ? static_cast<uint16_t>(p0 + arg) : lcur[p0 + arg];
    }
  }
  return packed;
}

// The group minimum of pass 2 that a state's predecessor argmin is stored under: its thread
// (o % threads) and field (o / threads) of the packed u32.
template <int K>
__device__ __forceinline__ uint32_t out_index(uint32_t st) {
  using S = Shape<K>;
  const uint32_t u = st & (S::kGroups - 1);
  return ((u & ((1u << S::kVBits) - 1)) << K) | (u >> S::kVBits);
}

// forward with the codes of `codes` and float4 reads of the minima; the same contract. With
// trace_bp (pass 1 only), thread 0 also runs the previous tile's traceback from trace_st, one
// step per step: the load issued before the step's work and used after it hides its latency.
// Step i stores states[254 - i]; after the pass, states[0..255] are the previous tile's.
template <int K>
__device__ void forward_fast(const Smem& m, const Codes<K>& codes, int shift, int overlap,
                             bool labels, uint32_t* bp, const uint32_t* trace_bp,
                             uint32_t& trace_st) {
  using S = Shape<K>;
  const int tid = threadIdx.x;
  for (int u = tid; u < S::kGroups; u += S::kThreads)
    m.b[u] = (overlap < 0 || u == overlap) ? 0.0f : INFINITY;
  __syncthreads();
  for (int i = 0; i < kSteps - 1; ++i) {
    const int pos = (i + shift) & (kSteps - 1);
    const float tv = m.t[pos], s = m.sc[pos];
    const float* cur = m.b + (i & 1) * S::kGroups;
    float* nxt = m.b + ((i + 1) & 1) * S::kGroups;
    const uint16_t* lcur = m.label + (i & 1) * S::kGroups;
    uint16_t* lnxt = m.label + ((i + 1) & 1) * S::kGroups;
    const bool lab = labels && i >= kSteps / 2;
    const bool tracing = trace_bp != nullptr && tid == 0;
    uint32_t pending = 0;
    if (tracing)
      pending = trace_bp[static_cast<size_t>(kSteps - 2 - i) * S::kThreads +
                         out_index<K>(trace_st) % S::kThreads];
    if (bp == nullptr && !lab) {
      relax<K, false>(codes, cur, nxt, lcur, lnxt, tv, s, false, false);
    } else {
      const uint32_t packed =
          relax<K, true>(codes, cur, nxt, lcur, lnxt, tv, s, i == kSteps / 2, lab);
      if (bp != nullptr) bp[static_cast<size_t>(i) * S::kThreads + tid] = packed;
    }
    if (tracing) {
      const uint32_t o = out_index<K>(trace_st);
      trace_st =
          ((trace_st << K) & 0xFFFFu) | ((pending >> ((o / S::kThreads) * K)) & (S::kFan - 1));
      m.states[kSteps - 2 - i] = trace_st;
    }
    __syncthreads();
  }
}

// Pass 2's end on thread 0: the best admissible final state (as finish_tile), stored as
// states[255] and returned (the start of the traceback).
template <int K>
__device__ uint32_t final_state(const Smem& m, int overlap) {
  using S = Shape<K>;
  const float tv = m.t[kSteps - 1], s = m.sc[kSteps - 1];
  float best = 0.0f;
  uint32_t st = 0;
  for (int low = 0; low < S::kFan; ++low) {
    const uint32_t cand = (static_cast<uint32_t>(overlap) << K) | static_cast<uint32_t>(low);
    const float e = tv - s * code_of(cand * kTrellisMul + kTrellisAdd);
    const float c = m.b[S::kGroups + (cand & (S::kGroups - 1))] + e * e;
    if (low == 0 || c < best) best = c, st = cand;
  }
  m.states[kSteps - 1] = st;
  return st;
}

// The last tile's traceback on thread 0 (the others are traced during the next tile's pass 1).
template <int K>
__device__ void trace_back(const Smem& m, const uint32_t* bp, uint32_t st) {
  using S = Shape<K>;
  for (int i = kSteps - 1; i > 0; --i) {
    const uint32_t o = out_index<K>(st);
    const uint32_t packed = bp[static_cast<size_t>(i - 1) * S::kThreads + o % S::kThreads];
    st = ((st << K) & 0xFFFFu) | ((packed >> ((o / S::kThreads) * K)) & (S::kFan - 1));
    m.states[i - 1] = st;
  }
}

// The previous tile's output from states[] (visible to all: the caller synchronised) and its
// tp, scp: thread w < 8K packs word w (bit b of the stream is bit b - K p of its last writer p in
// set_bits' order), threads p < 256 sum the error by a block reduction (another order than
// finish_tile's sum: equal up to double rounding). Ends synchronised.
template <int K>
__device__ void pack_tile(const Smem& m, uint32_t* words_out, double* err_out) {
  using S = Shape<K>;
  constexpr int kNbits = kSteps * K, kWords = 8 * K;
  static_assert(S::kThreads >= kSteps, "a thread per position");
  const int tid = threadIdx.x;
  uint32_t word = 0;
  if (tid < kWords) {
    for (int i = 0; i < 32; ++i) {
      const int b = 32 * tid + i;
      // set_bits writes bits [0, 16) from state 0, then bits [K p + 16 - K, K p + 16) mod
      // kNbits from state p = 1..255; those wrap onto bits [0, 16 - K), last.
      int p = 0, sh = b;
      if (b >= 16) {
        p = (b - 16) / K + 1, sh = b - K * p;
      } else if (b < 16 - K) {
        p = (b + kNbits - 16) / K + 1, sh = b + kNbits - K * p;
      }
      word |= ((m.states[p] >> sh) & 1u) << i;
    }
    m.words[tid] = word;
  }
  __syncthreads();
  double err = 0.0;
  if (tid < kSteps) {
    const float e =
        m.tp[tid] - m.scp[tid] * code_of(state_at(m.words, K, tid) * kTrellisMul + kTrellisAdd);
    err = static_cast<double>(e) * e;
  }
  for (int off = 16; off > 0; off >>= 1) err += __shfl_down_sync(0xFFFFFFFFu, err, off);
  double* red = reinterpret_cast<double*>(m.red_c);  // 8-byte aligned, 16 doubles of room
  if (tid < kSteps && (tid & 31) == 0) red[tid >> 5] = err;
  __syncthreads();
  if (tid == 0 && err_out != nullptr) {
    double sum = 0.0;
    for (int w = 0; w < kSteps / 32; ++w) sum += red[w];
    *err_out = sum;
  }
  if (tid < kWords) words_out[tid] = word;
  __syncthreads();  // red (red_c) and words are reused
}

// kFast: forward_fast, tile n's traceback during tile n + 1's pass 1 and pack_tile after it;
// else the first version (forward, finish_tile).
template <int K, bool kFast>
__global__ void __launch_bounds__(Shape<K>::kThreads)
    viterbi_tiles(const float* t, const float* sc, int64_t tiles, uint32_t* words, double* err,
                  uint32_t* bp_all) {
  using S = Shape<K>;
  const Smem m = carve<K>(trellis_smem);
  uint32_t* bp = bp_all + static_cast<size_t>(blockIdx.x) * (kSteps - 1) * S::kThreads;
  Codes<K> codes;
  if constexpr (kFast) codes.init();
  int64_t prev = -1;      // the tile whose traceback is pending (fast kernel)
  uint32_t trace_st = 0;  // thread 0: its final state, then the traceback's current state
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    for (int p = threadIdx.x; p < kSteps; p += S::kThreads) {
      m.t[p] = t[tile * kSteps + p];
      m.sc[p] = sc[tile * kSteps + p];
    }
    // (forward's first __syncthreads publishes t and sc)
    if constexpr (kFast) {
      forward_fast<K>(m, codes, kSteps / 2, -1, true, nullptr, prev >= 0 ? bp : nullptr, trace_st);
      if (prev >= 0) pack_tile<K>(m, words + prev * 8 * K, err != nullptr ? err + prev : nullptr);
      const int overlap = best_label<K>(m, kSteps / 2);
      forward_fast<K>(m, codes, 0, overlap, false, bp, nullptr, trace_st);
      if (threadIdx.x == 0) trace_st = final_state<K>(m, overlap);
      for (int p = threadIdx.x; p < kSteps; p += S::kThreads) m.tp[p] = m.t[p], m.scp[p] = m.sc[p];
      prev = tile;
    } else {
      forward<K>(m, kSteps / 2, -1, true, nullptr);
      const int overlap = best_label<K>(m, kSteps / 2);
      forward<K>(m, 0, overlap, false, bp);
      if (threadIdx.x == 0)
        finish_tile<K>(m, overlap, bp, words + tile * 8 * K, err != nullptr ? err + tile : nullptr);
    }
    __syncthreads();  // t, sc and the buffers are reused by the next tile
  }
  if constexpr (kFast) {
    if (prev >= 0) {
      if (threadIdx.x == 0) trace_back<K>(m, bp, trace_st);
      __syncthreads();
      pack_tile<K>(m, words + prev * 8 * K, err != nullptr ? err + prev : nullptr);
    }
  }
}

// GYRE_TRELLIS_ENCODER_OLD=1: the first kernel (A/B of the same binary; read at every call so
// that a test can compare both).
bool old_encoder() {
  const char* v = std::getenv("GYRE_TRELLIS_ENCODER_OLD");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

template <int K, bool kFast>
void launch(const float* t, const float* sc, int64_t tiles, uint32_t* words, double* err,
            DevBuf& workspace, cudaStream_t stream) {
  using S = Shape<K>;
  const size_t smem = smem_bytes<K>() + (kFast ? Codes<K>::kSmemBytes : 0);
  const auto kernel = viterbi_tiles<K, kFast>;
  GYRE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int device = 0, sms = 0, per_sm = 0;
  GYRE_CUDA_CHECK(cudaGetDevice(&device));
  GYRE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  GYRE_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, S::kThreads, smem));
  GYRE_CHECK(per_sm > 0, "trellis encoder: the kernel does not fit this GPU");
  const int64_t grid = std::min<int64_t>(tiles, int64_t{sms} * per_sm);
  uint32_t* bp = workspace.as<uint32_t>(static_cast<size_t>(grid) * (kSteps - 1) * S::kThreads);
  kernel<<<static_cast<unsigned>(grid), S::kThreads, smem, stream>>>(t, sc, tiles, words, err, bp);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace

void trellis_encode_tiles_device(const float* t, const float* sc, int64_t tiles, int k,
                                 uint32_t* words, double* err, void* workspace, void* stream) {
  GYRE_CHECK(trellis_bits_supported(k), "trellis encoder: unsupported bits per weight ", k);
  if (tiles <= 0) return;
  DevBuf& ws = *static_cast<DevBuf*>(workspace);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool fast = !old_encoder();
  switch (k) {
    case 2:
      return fast ? launch<2, true>(t, sc, tiles, words, err, ws, s)
                  : launch<2, false>(t, sc, tiles, words, err, ws, s);
    case 3:
      return fast ? launch<3, true>(t, sc, tiles, words, err, ws, s)
                  : launch<3, false>(t, sc, tiles, words, err, ws, s);
    case 4:
      return fast ? launch<4, true>(t, sc, tiles, words, err, ws, s)
                  : launch<4, false>(t, sc, tiles, words, err, ws, s);
    case 5:
      return fast ? launch<5, true>(t, sc, tiles, words, err, ws, s)
                  : launch<5, false>(t, sc, tiles, words, err, ws, s);
    case 6:
      return fast ? launch<6, true>(t, sc, tiles, words, err, ws, s)
                  : launch<6, false>(t, sc, tiles, words, err, ws, s);
    default:
      return fast ? launch<8, true>(t, sc, tiles, words, err, ws, s)
                  : launch<8, false>(t, sc, tiles, words, err, ws, s);
  }
}

void trellis_encode_tiles_host(const float* t, const float* sc, int64_t tiles, int k,
                               uint32_t* words, double* err) {
  GYRE_CHECK(trellis_bits_supported(k), "trellis encoder: unsupported bits per weight ", k);
  GYRE_CHECK(tiles >= 0, "trellis encoder: negative tile count");
  if (tiles == 0) return;
  const size_t n = static_cast<size_t>(tiles) * kSteps, nw = static_cast<size_t>(tiles) * 8 * k;
  DevBuf td, scd, wd, ed, ws;
  cudaStream_t s = nullptr;
  GYRE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  try {
    upload(td, t, n, s);
    upload(scd, sc, n, s);
    uint32_t* words_d = wd.as<uint32_t>(nw);
    double* err_d = ed.as<double>(static_cast<size_t>(tiles));
    trellis_encode_tiles_device(td.get<float>(), scd.get<float>(), tiles, k, words_d, err_d, &ws,
                                s);
    GYRE_CUDA_CHECK(
        cudaMemcpyAsync(words, words_d, nw * sizeof(uint32_t), cudaMemcpyDeviceToHost, s));
    if (err != nullptr)
      GYRE_CUDA_CHECK(cudaMemcpyAsync(err, err_d, static_cast<size_t>(tiles) * sizeof(double),
                                      cudaMemcpyDeviceToHost, s));
    GYRE_CUDA_CHECK(cudaStreamSynchronize(s));
  } catch (...) {
    cudaStreamDestroy(s);
    throw;
  }
  GYRE_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace gyre::quant::cuda
