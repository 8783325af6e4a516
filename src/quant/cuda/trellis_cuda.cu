// The trellis encoder on the GPU (quant/cuda/trellis_cuda.h): one thread block per tile, the two
// Viterbi passes of quant/trellis_encode.cc.
//
// Formulation. The CPU keeps cost[s] for all 65536 states; here only the group minima are kept:
// with G = 2^(16-K) groups, B_i[u] = min over the 2^K predecessors of the states whose low 16-K
// bits are u, and cost_i[s] = B_i[s mod G] + (t_i - sc_i code(s))^2 is recomputed when needed.
// So one step reads B_i (shared memory), evaluates all 65536 states once and writes B_{i+1}:
//   B_{i+1}[u'] = min_low cost_i[(u' << K) | low],   and (u' << K | low) mod G = (v << K) | low
// with v = u' mod 2^(16-2K): the 2^K states sharing v read the same 2^K minima (a warp's lanes
// vary u's top K bits first, so their shared-memory reads are broadcasts). The same float
// expressions as the CPU (a - s*c then b + e*e, first minimum wins ties) keep the decisions
// equal up to FMA contraction.
//
// Pass 1 (rotated by half, free ends) needs only the state at position 0 of its best path: each
// group minimum carries that state's low 16-K bits as a label (shared memory), so pass 1 stores
// no backpointers. Pass 2 (constrained) writes each step's argmins, K bits per group packed into
// one u32 per thread, to global memory (1 MB per tile in flight at most) and one thread traces
// back.
//
// Speed (the fast kernel; GYRE_TRELLIS_ENCODER_OLD=1 selects the first version, kept for A/B).
// The step is issue-bound (~9.5 instructions per state in the old SASS, 3 of them the code:
// IADD, IDP4A, FADD). A thread evaluates the same 64 states (K <= 6) at every step, so their
// codes are computed once per kernel and kept in 32 half2 registers (integers in [-512, 508]
// are exact in fp16; one HADD2.F32 per use). Pass 1 needs no argmin before position 128
// (labels start there), so those steps keep only the minimum. The tail runs on the whole block:
// the words are packed one per thread from the states, and the error is a block reduction.
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

namespace gyre::quant::cuda {
namespace {

constexpr int kSteps = kTrellisTileElems;  // 256 positions per tile
constexpr int kMaxThreads = 1024;

template <int K>
struct Shape {
  static constexpr int kGroups = 1 << (16 - K);
  static constexpr int kFan = 1 << K;
  static constexpr int kThreads = kGroups < kMaxThreads ? kGroups : kMaxThreads;
  static constexpr int kOutputs = kGroups / kThreads;  // group minima per thread per step
  static constexpr int kVBits = 16 - 2 * K;            // bits of v (0 at K = 8)
  static_assert(kOutputs * K <= 32, "a thread's argmins must fit one u32");
};

template <int K>
size_t smem_bytes() {
  const size_t g = Shape<K>::kGroups;
  return 2 * g * sizeof(float) + (4 * kSteps + 32) * sizeof(float) +
         (kSteps + 64 + 32 + 4) * sizeof(uint32_t) + 2 * g * sizeof(uint16_t);
}

__device__ __forceinline__ float code_of(uint32_t x) {
  // x = state * kTrellisMul + kTrellisAdd: the sum of its four signed bytes, added to the bits of
  // 1.5 * 2^23 (whose float ulp is 1) so that one FADD replaces the slower int-to-float convert.
  constexpr int kMagicBits = 0x4B400000;
  constexpr float kMagic = 12582912.0f;
  return __int_as_float(__dp4a(static_cast<int>(x), 0x01010101, kMagicBits)) - kMagic;
}

__device__ __forceinline__ uint32_t state_at(const uint32_t* words, int k, int p) {
  const int b = k * p, nwords = 8 * k;
  const int w = b >> 5, sh = b & 31;
  const uint64_t win = words[w] | (static_cast<uint64_t>(words[(w + 1) % nwords]) << 32);
  return static_cast<uint32_t>(win >> sh) & 0xFFFFu;
}

// The codes of the states a thread evaluates at every step of forward_fast, state
// (group_j << K) | low with group_j = u' of its output j: two per half2 when they fit 32
// registers, else (K = 8) recomputed from the state as the old kernel does.
template <int K>
struct Codes {
  using S = Shape<K>;
  static constexpr int kStates = S::kOutputs * S::kFan;
  static constexpr bool kCached = kStates <= 64;
  // The first kKept states' codes stay in registers, the others are recomputed. ptxas converts
  // the kept halves to floats once, outside the step loop, so each costs a register: all 64
  // spill at 64 registers (1024-thread blocks); 32 do not (K = 5, fan 32 unrolled: 8).
  static constexpr int kKept = !kCached ? 0 : K == 5 ? 8 : 32;
  __half2 h[kKept > 0 ? kKept / 2 : 1];

  __device__ static uint32_t group_of(int j) {
    const int o = j * S::kThreads + static_cast<int>(threadIdx.x);
    return static_cast<uint32_t>(((o & (S::kFan - 1)) << S::kVBits) | (o >> K));
  }
  __device__ static float compute(int j, int low) {
    return code_of(((group_of(j) << K) | static_cast<uint32_t>(low)) * kTrellisMul + kTrellisAdd);
  }
  __device__ void init() {
    if constexpr (kCached) {
#pragma unroll
      for (int n = 0; n < kKept; n += 2)
        h[n / 2] = __floats2half2_rn(compute(n / S::kFan, n % S::kFan),
                                     compute(n / S::kFan, n % S::kFan + 1));
    }
  }
  __device__ __forceinline__ float get(int j, int low, uint32_t x0) const {
    const int n = j * S::kFan + low;
    if (kCached && n < kKept) return (n & 1) ? __high2float(h[n / 2]) : __low2float(h[n / 2]);
    return code_of(x0 + static_cast<uint32_t>(low) * kTrellisMul);
  }
};

struct Smem {
  float *b, *t, *sc, *red_c, *tp, *scp;  // tp, scp: the previous tile's t, sc (fast kernel)
  uint32_t *states, *words, *red_s;
  int* misc;
  uint16_t* label;
};

template <int K>
__device__ Smem carve(unsigned char* raw) {
  constexpr int g = Shape<K>::kGroups;
  Smem m;
  m.b = reinterpret_cast<float*>(raw);
  m.t = m.b + 2 * g;
  m.sc = m.t + kSteps;
  m.red_c = m.sc + kSteps;
  m.states = reinterpret_cast<uint32_t*>(m.red_c + 32);
  m.words = m.states + kSteps;
  m.red_s = m.words + 64;
  m.misc = reinterpret_cast<int*>(m.red_s + 32);
  m.tp = reinterpret_cast<float*>(m.misc + 4);
  m.scp = m.tp + kSteps;
  m.label = reinterpret_cast<uint16_t*>(m.scp + kSteps);
  return m;
}

// Steps 0..254 of one pass over positions (i + shift) mod 256. overlap < 0: free start; else
// only states whose low 16-K bits equal it may start. With labels, B_255's label is the state at
// step 128 (mod G); with bp, step i's packed argmins go to bp[i * threads + tid]. Ends with
// B_255 (and its labels) in the second half of the buffers.
template <int K>
__device__ void forward(const Smem& m, int shift, int overlap, bool labels, uint32_t* bp) {
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
    uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < S::kOutputs; ++j) {
      const int o = j * S::kThreads + tid;
      const int hi = o & (S::kFan - 1), v = o >> K;
      const int group = (hi << S::kVBits) | v;  // u'
      const int p0 = v << K;
      const uint32_t x0 = (static_cast<uint32_t>(group) << K) * kTrellisMul + kTrellisAdd;
      float best = 0.0f;
      int arg = 0;
#pragma unroll 16
      for (int low = 0; low < S::kFan; ++low) {
        const float e = tv - s * code_of(x0 + static_cast<uint32_t>(low) * kTrellisMul);
        const float c = cur[p0 + low] + e * e;
        if (low == 0 || c < best) best = c, arg = low;
      }
      nxt[group] = best;
      packed |= static_cast<uint32_t>(arg) << (j * K);
      if (labels && i >= kSteps / 2)
        lnxt[group] = i == kSteps / 2 ? static_cast<uint16_t>(p0 + arg) : lcur[p0 + arg];
    }
    if (bp != nullptr) bp[static_cast<size_t>(i) * S::kThreads + tid] = packed;
    __syncthreads();
  }
}

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
        const float e = tv - s * codes.get(j, low, x0);
        const float c = bq[r] + e * e;
        if constexpr (kArg) {
          if (low == 0 || c < best) best = c, arg = low;
        } else {
          best = (low == 0 || c < best) ? c : best;
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

// Pass 1's end: the lowest state of least final cost over all 65536; returns (to every thread)
// its label, the low 16-K bits of the state at position 0.
template <int K>
__device__ int best_label(const Smem& m, int shift) {
  using S = Shape<K>;
  const int tid = threadIdx.x;
  const int pos = (kSteps - 1 + shift) & (kSteps - 1);
  const float tv = m.t[pos], s = m.sc[pos];
  const float* cur = m.b + S::kGroups;
  float bc = INFINITY;
  uint32_t bs = 0xFFFFFFFFu;
  for (int j = 0; j < S::kOutputs; ++j) {
    const int o = j * S::kThreads + tid;
    const int hi = o & (S::kFan - 1), v = o >> K;
    const uint32_t base = static_cast<uint32_t>((hi << S::kVBits) | v) << K;
    for (int low = 0; low < S::kFan; ++low) {
      const uint32_t st = base | static_cast<uint32_t>(low);
      const float e = tv - s * code_of(st * kTrellisMul + kTrellisAdd);
      const float c = cur[(v << K) + low] + e * e;
      if (c < bc || (c == bc && st < bs)) bc = c, bs = st;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float oc = __shfl_down_sync(0xFFFFFFFFu, bc, off);
    const uint32_t os = __shfl_down_sync(0xFFFFFFFFu, bs, off);
    if (oc < bc || (oc == bc && os < bs)) bc = oc, bs = os;
  }
  if ((tid & 31) == 0) m.red_c[tid >> 5] = bc, m.red_s[tid >> 5] = bs;
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < S::kThreads / 32; ++w)
      if (m.red_c[w] < bc || (m.red_c[w] == bc && m.red_s[w] < bs))
        bc = m.red_c[w], bs = m.red_s[w];
    // bs stays unset only for non-finite targets; any overlap then serves.
    m.misc[0] = bs == 0xFFFFFFFFu ? 0 : m.label[S::kGroups + (bs & (S::kGroups - 1))];
  }
  __syncthreads();
  return m.misc[0];
}

// Pass 2's end on thread 0: the best admissible final state, the traceback through bp, the
// words (written as trellis_encode.cc's set_bits does) and the tile's error.
template <int K>
__device__ void finish_tile(const Smem& m, int overlap, const uint32_t* bp, uint32_t* words_out,
                            double* err_out) {
  using S = Shape<K>;
  constexpr int kMask = S::kGroups - 1, kNbits = kSteps * K, kWords = 8 * K;
  const float tv = m.t[kSteps - 1], s = m.sc[kSteps - 1];
  float best = 0.0f;
  uint32_t st = 0;
  for (int low = 0; low < S::kFan; ++low) {
    const uint32_t cand = (static_cast<uint32_t>(overlap) << K) | static_cast<uint32_t>(low);
    const float e = tv - s * code_of(cand * kTrellisMul + kTrellisAdd);
    const float c = m.b[S::kGroups + (cand & kMask)] + e * e;
    if (low == 0 || c < best) best = c, st = cand;
  }
  m.states[kSteps - 1] = st;
  for (int i = kSteps - 1; i > 0; --i) {
    const uint32_t u = st & kMask;
    const uint32_t o = ((u & ((1u << S::kVBits) - 1)) << K) | (u >> S::kVBits);
    const uint32_t packed = bp[static_cast<size_t>(i - 1) * S::kThreads + o % S::kThreads];
    const uint32_t arg = (packed >> ((o / S::kThreads) * K)) & (S::kFan - 1);
    st = ((st << K) & 0xFFFFu) | arg;
    m.states[i - 1] = st;
  }
  for (int w = 0; w < kWords; ++w) m.words[w] = 0;
  auto set_bits = [&](int b, uint32_t v, int n) {
    for (int i = 0; i < n; ++i) {
      const int bit = (b + i) % kNbits;
      const uint32_t mk = 1u << (bit & 31);
      m.words[bit >> 5] = (v >> i & 1u) ? (m.words[bit >> 5] | mk) : (m.words[bit >> 5] & ~mk);
    }
  };
  set_bits(0, m.states[0], 16);
  for (int p = 1; p < kSteps; ++p) set_bits(K * p + 16 - K, m.states[p] >> (16 - K), K);
  double err = 0.0;
  for (int p = 0; p < kSteps; ++p) {
    const float e = m.t[p] - m.sc[p] * code_of(state_at(m.words, K, p) * kTrellisMul + kTrellisAdd);
    err += static_cast<double>(e) * e;
  }
  for (int w = 0; w < kWords; ++w) words_out[w] = m.words[w];
  if (err_out != nullptr) *err_out = err;
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
  extern __shared__ __align__(16) unsigned char raw[];
  const Smem m = carve<K>(raw);
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
  const size_t smem = smem_bytes<K>();
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
