// The trellis encoder on the GPU, shared by both versions of trellis_cuda.cu (included only
// there): the shapes, the shared-memory layout, pass 1's end, and the first version's step
// and tail (forward, finish_tile; selected by GYRE_TRELLIS_ENCODER_OLD=1).
//
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
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cpu/trellis.h"

namespace gyre::quant::cuda::trellis_gpu {

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
constexpr size_t smem_bytes() {  // a multiple of 16 (12 g + 5648 bytes)
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

}  // namespace gyre::quant::cuda::trellis_gpu
