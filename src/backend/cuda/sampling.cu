// Token sampling on the GPU, one block per logits row, without sorting the vocabulary (each row's
// best token is found first by up to 64 blocks: row_best_kernel).
//
// Every FP16 logit maps to a 16-bit key whose integer order is the logit order (NaN -> 0,
// excluded; -0 -> +0 so that the two tie as on the host). "More likely" is (larger key, then
// lower id), the host reference's order. Each filter of the host reference (top-k, top-p, min-p)
// keeps a prefix of that order, so the kept set is one cut: key > cut.key, or key == cut.key and
// id <= cut.id. A cut is found by a radix select over the key: a histogram of the high byte
// (counts and fixed-point probability mass), a walk from the top bin down to where the running
// count or mass crosses the target, the same for the low byte inside that bin, and finally, for
// ties at the cut key, the m-th equal element in id order (a block prefix scan). The draw is one
// more prefix scan of the kept probabilities in ascending id order, the host's draw order.
// Masses are integer (2^40 = the most likely token's weight), so every sum is exact and
// independent of the order of the atomics: results are deterministic.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/sampling.h"
#include "backend/cuda/sampling_keys.cuh"

namespace gyre::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kCopies = 4;  // histogram copies (by warp) to spread the atomics on hot bins
using namespace sample_keys;
constexpr uint32_t kMinSampleKey = 0x0400;  // -inf is 0x03ff: left out of the sampling set
constexpr uint32_t kPosInfKey = 0xfc00;
constexpr float kMassScale = 1099511627776.0f;  // 2^40

__device__ __forceinline__ float value_of_key(uint32_t k) {
  const uint32_t b = (k & 0x8000u) ? (k & 0x7fffu) : (~k & 0xffffu);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}

struct Cut {  // kept: key > key, or key == key and id <= id
  uint32_t key;
  int id;
};

__device__ __forceinline__ bool kept(const Cut& c, uint32_t k, int i) {
  return k > c.key || (k == c.key && i <= c.id);
}

// The cut that keeps fewer of the two (both are prefixes of one order).
__device__ __forceinline__ Cut tighter(const Cut& a, const Cut& b) {
  return (a.key > b.key || (a.key == b.key && a.id < b.id)) ? a : b;
}

struct Shared {
  unsigned cnt[kCopies][256];
  unsigned long long mass[kCopies][256];
  unsigned long long hi_cnt[256], hi_mass[256];  // merged high-byte histogram (kept all along)
  unsigned long long lo_cnt[256], lo_mass[256];  // merged low-byte histogram of one select
  double dred[kWarps];
  unsigned long long ured[kWarps];
  int ired[kWarps];
  // Results of warp 0's walk, and of a found element.
  int walk_bin;
  unsigned long long walk_cnt_above, walk_mass_above;
  int found;
  int n_gathered;
  uint32_t gathered_key[kSampleMaxTop];
  int gathered_id[kSampleMaxTop];
};

struct Row {
  const half* logits;
  int vocab;
  float lmax;      // largest logit (raw)
  float inv_temp;  // 0 when greedy
  bool vec;        // 16-byte loads (the row is 16-byte aligned and they are enabled)
};

// f(id, key) for the 8 halves of one 16-byte load starting at id `base` (little-endian: the
// lower half of each word comes first). f returns true to stop; so does this.
template <typename F>
__device__ __forceinline__ bool keys_of8(const uint4& a, int base, F& f) {
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (f(base + j, key_of_bits((w[j >> 1] >> ((j & 1) * 16)) & 0xffffu))) return true;
  return false;
}

// f(id, key) for every id of the row, split over the block's threads (each id once, in no
// particular order). Four independent 16-byte loads in flight per thread: a pass over a 128k row
// is then bound by bandwidth, not by the latency of one small load after another.
template <typename F>
__device__ __forceinline__ void for_each_key(const Row& r, F f) {
  auto g = [&f](int i, uint32_t k) {
    f(i, k);
    return false;
  };
  int scalar_from = 0;
  if (r.vec) {
    const int n8 = r.vocab >> 3;
    const uint4* v = reinterpret_cast<const uint4*>(r.logits);
    int i = threadIdx.x;
    for (; i + 3 * kThreads < n8; i += 4 * kThreads) {
      uint4 a[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) a[u] = __ldg(v + i + u * kThreads);
#pragma unroll
      for (int u = 0; u < 4; ++u) keys_of8(a[u], (i + u * kThreads) * 8, g);
    }
    for (; i < n8; i += kThreads) keys_of8(__ldg(v + i), i * 8, g);
    scalar_from = n8 * 8;
  }
  for (int i = scalar_from + threadIdx.x; i < r.vocab; i += kThreads) f(i, key_of(r.logits[i]));
}

// f(id, key) for ids begin, begin + 1, ... < end in order until f returns true. With vector
// loads `begin` must be a multiple of 8.
template <typename F>
__device__ __forceinline__ void walk_segment(const Row& r, int begin, int end, F f) {
  int i = begin;
  if (r.vec) {
    const uint4* v = reinterpret_cast<const uint4*>(r.logits);
    for (; i + 32 <= end; i += 32) {
      uint4 a[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) a[u] = __ldg(v + (i >> 3) + u);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (keys_of8(a[u], i + u * 8, f)) return;
    }
    for (; i + 8 <= end; i += 8)
      if (keys_of8(__ldg(v + (i >> 3)), i, f)) return;
  }
  for (; i < end; ++i)
    if (f(i, key_of(r.logits[i]))) return;
}

__device__ __forceinline__ unsigned long long mass_of(const Row& r, uint32_t k) {
  const float w = __expf((value_of_key(k) - r.lmax) * r.inv_temp);
  return static_cast<unsigned long long>(w * kMassScale);
}

__device__ __forceinline__ float weight_of(const Row& r, uint32_t k) {
  return __expf((value_of_key(k) - r.lmax) * r.inv_temp);
}

template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  __syncthreads();  // scratch may still be read by an earlier reduction
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, scratch[w]);
  return r;
}

// Exclusive prefix sum over threads in thread order; *total gets the sum of all.
__device__ double block_exclusive_scan(double v, double* scratch, double* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(kFull, x, o);
    if (lane >= o) x += y;
  }
  double excl = __shfl_up_sync(kFull, x, 1);
  if (lane == 0) excl = 0.0;
  __syncthreads();
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  double before = 0.0, all = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) before = all;
    all += scratch[w];
  }
  *total = all;
  return before + excl;
}

// The first id, in ascending order, where the running sum of weight(id, key) exceeds target
// (times the sum of all weights when `relative`). When rounding keeps the sum from exceeding it,
// the last id of positive weight; -1 when every weight is 0. Each thread owns a contiguous range
// of ids.
template <typename Weight>
__device__ int find_crossing(const Row& r, Shared& sh, Weight weight, double target,
                             bool relative) {
  int seg = (r.vocab + kThreads - 1) / kThreads;
  if (r.vec) seg = (seg + 7) & ~7;
  const int begin = min(r.vocab, static_cast<int>(threadIdx.x) * seg);
  const int end = min(r.vocab, begin + seg);
  double sum = 0.0;
  walk_segment(r, begin, end, [&](int i, uint32_t k) {
    sum += weight(i, k);
    return false;
  });
  double total = 0.0;
  const double excl = block_exclusive_scan(sum, sh.dred, &total);
  if (relative) target *= total;
  const bool crosses = sum > 0.0 && excl + sum > target;
  const int first = block_reduce(
      crosses ? static_cast<int>(threadIdx.x) : INT_MAX, [](int a, int b) { return min(a, b); },
      sh.ired);
  const int last = block_reduce(
      sum > 0.0 ? static_cast<int>(threadIdx.x) : -1, [](int a, int b) { return max(a, b); },
      sh.ired);
  if (threadIdx.x == 0) sh.found = -1;
  __syncthreads();
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == first) {
    // Summed from 0 in the same order as `sum`, so the last id of the range is sure to cross.
    double partial = 0.0;
    walk_segment(r, begin, end, [&](int i, uint32_t k) {
      partial += weight(i, k);
      if (excl + partial > target) {
        sh.found = i;
        return true;
      }
      return false;
    });
  } else if (first == INT_MAX && tid == last) {
    for (int i = end - 1; i >= begin; --i)
      if (weight(i, key_of(r.logits[i])) > 0.0) {
        sh.found = i;
        break;
      }
  }
  __syncthreads();
  return sh.found;
}

// Histogram of the high byte (bin < 0: every key >= min_key) or of the low byte of the keys
// whose high byte is `bin`, into sh.hi_* or sh.lo_*. Mass only for keys >= kMinSampleKey and
// when sampling (inv_temp > 0).
__device__ void histogram(const Row& r, Shared& sh, int hi_bin, uint32_t min_key) {
  for (int i = threadIdx.x; i < kCopies * 256; i += kThreads) {
    (&sh.cnt[0][0])[i] = 0;
    (&sh.mass[0][0])[i] = 0;
  }
  __syncthreads();
  const int copy = (threadIdx.x >> 5) % kCopies;
  const bool with_mass = r.inv_temp > 0.0f;
  for_each_key(r, [&](int, uint32_t k) {
    const bool in = k >= min_key && (hi_bin < 0 || static_cast<int>(k >> 8) == hi_bin);
    const int bin = !in ? -1 : hi_bin >= 0 ? static_cast<int>(k & 0xff) : static_cast<int>(k >> 8);
    const unsigned long long m = in && with_mass && k >= kMinSampleKey ? mass_of(r, k) : 0;
    if (bin >= 0) {
      atomicAdd(&sh.cnt[copy][bin], 1u);
      if (m) atomicAdd(&sh.mass[copy][bin], m);
    }
  });
  __syncthreads();
  unsigned long long* out_cnt = hi_bin >= 0 ? sh.lo_cnt : sh.hi_cnt;
  unsigned long long* out_mass = hi_bin >= 0 ? sh.lo_mass : sh.hi_mass;
  for (int b = threadIdx.x; b < 256; b += kThreads) {
    unsigned long long c = 0, m = 0;
    for (int j = 0; j < kCopies; ++j) {
      c += sh.cnt[j][b];
      m += sh.mass[j][b];
    }
    out_cnt[b] = c;
    out_mass[b] = m;
  }
  __syncthreads();
}

// Warp 0 walks the bins from 255 down (bins below min_bin count as empty) and finds the first
// where (count or mass) above + in the bin reaches target, with `above0` ahead of bin 255.
// Writes sh.walk_bin (-1: never reached) and the count and mass of the bins above it.
__device__ void walk(Shared& sh, const unsigned long long* cnt, const unsigned long long* mass,
                     bool by_mass, double target, unsigned long long cnt0, unsigned long long mass0,
                     int min_bin) {
  __syncthreads();  // every thread has read the previous walk's results
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    unsigned long long lc = 0, lm = 0;
    for (int b = lane * 8; b < lane * 8 + 8; ++b)
      if (b >= min_bin) {
        lc += cnt[b];
        lm += mass[b];
      }
    unsigned long long sc = lc, sm = lm;  // inclusive sums from this lane up
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long yc = __shfl_down_sync(kFull, sc, o);
      const unsigned long long ym = __shfl_down_sync(kFull, sm, o);
      if (lane + o < 32) {
        sc += yc;
        sm += ym;
      }
    }
    unsigned long long c = cnt0 + sc - lc, m = mass0 + sm - lm;  // above this lane's bins
    const double before = static_cast<double>(by_mass ? m : c);
    const double after = static_cast<double>(by_mass ? mass0 + sm : cnt0 + sc);
    if (lane == 0) sh.walk_bin = -1;
    __syncwarp();
    if (before < target && after >= target) {
      for (int b = lane * 8 + 7; b >= lane * 8; --b) {
        if (b < min_bin) break;
        const unsigned long long nc = c + cnt[b], nm = m + mass[b];
        if (static_cast<double>(by_mass ? nm : nc) >= target) {
          sh.walk_bin = b;
          sh.walk_cnt_above = c;
          sh.walk_mass_above = m;
          break;
        }
        c = nc;
        m = nm;
      }
    }
  }
  __syncthreads();
}

struct Selected {
  Cut cut;
  unsigned long long cnt, mass;  // of the kept prefix
  bool all;                      // the target was never reached: everything >= min_key is kept
};

// The smallest more-likely prefix of {key >= min_key} whose count (or mass) reaches target.
// Needs sh.hi_* filled by histogram(r, sh, -1, min_key).
__device__ Selected select_prefix(const Row& r, Shared& sh, bool by_mass, double target,
                                  uint32_t min_key) {
  Selected s;
  s.all = false;
  walk(sh, sh.hi_cnt, sh.hi_mass, by_mass, target, 0, 0, static_cast<int>(min_key >> 8));
  const int hi = sh.walk_bin;
  if (hi < 0) {
    s.all = true;
    s.cut = {min_key, r.vocab};
    return s;
  }
  const unsigned long long cnt_hi = sh.walk_cnt_above, mass_hi = sh.walk_mass_above;
  histogram(r, sh, hi, min_key);
  walk(sh, sh.lo_cnt, sh.lo_mass, by_mass, target, cnt_hi, mass_hi, 0);
  const int lo = sh.walk_bin;
  if (lo < 0) {  // rounding: the bin's total reached target, its parts did not; keep it all
    s.cut = {static_cast<uint32_t>(hi << 8), r.vocab};
    s.cnt = cnt_hi + sh.hi_cnt[hi];
    s.mass = mass_hi + sh.hi_mass[hi];
    return s;
  }
  const uint32_t key = static_cast<uint32_t>((hi << 8) | lo);
  const unsigned long long above_c = sh.walk_cnt_above, above_m = sh.walk_mass_above;
  const unsigned long long n_eq = sh.lo_cnt[lo];
  const unsigned long long w = (r.inv_temp > 0.0f && key >= kMinSampleKey) ? mass_of(r, key) : 0;
  // Equal keys in id order until the target is reached (host: ties by lowest id first).
  double need = by_mass ? (w > 0 ? ceil((target - static_cast<double>(above_m)) / w)
                                 : static_cast<double>(n_eq))
                        : ceil(target - static_cast<double>(above_c));
  unsigned long long m = need < 1.0 ? 1 : static_cast<unsigned long long>(need);
  if (m > n_eq) m = n_eq;
  s.cnt = above_c + m;
  s.mass = above_m + m * w;
  if (m == n_eq) {
    s.cut = {key, r.vocab};
    return s;
  }
  const int id = find_crossing(
      r, sh, [key](int, uint32_t k) { return k == key ? 1.0 : 0.0; }, static_cast<double>(m) - 0.5,
      false);
  s.cut = {key, id};
  return s;
}

constexpr int kBestThreads = 256;
constexpr int kBestBlocks = 64;  // per row, at most

// The spread first pass: each block's best of its slice of row blockIdx.y, merged into best[row]
// by one 64-bit atomicMax (the row's sampling block reads and clears it).
__global__ void __launch_bounds__(kBestThreads)
    row_best_kernel(const half* __restrict__ logits, int64_t ld, int vocab,
                    unsigned long long* __restrict__ best) {
  __shared__ unsigned long long warp_best[kBestThreads / 32];
  const unsigned long long b =
      block_best(logits + static_cast<int64_t>(blockIdx.y) * ld, vocab,
                 blockIdx.x * kBestThreads + threadIdx.x, gridDim.x * kBestThreads, warp_best);
  if (threadIdx.x == 0 && b != 0) atomicMax(best + blockIdx.y, b);
}

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const half* __restrict__ logits, int64_t ld, int vocab,
                       const SampleRowParams* __restrict__ params, SampleRowOut* __restrict__ outs,
                       int mode, unsigned long long* __restrict__ spread_best,
                       const int32_t* __restrict__ params_slot, int slot_mask) {
  __shared__ unsigned long long spread_s;
  if (spread_best != nullptr) {  // read and cleared for the next call, skipped rows included
    if (threadIdx.x == 0) {
      spread_s = spread_best[blockIdx.x];
      spread_best[blockIdx.x] = 0;
    }
    __syncthreads();
  }
  const SampleRowParams p = params[params_slot ? (*params_slot & slot_mask) : blockIdx.x];
  if (p.skip) return;
  __shared__ Shared sh;
  SampleRowOut* out = outs + blockIdx.x;
  Row r;
  r.logits = logits + static_cast<int64_t>(blockIdx.x) * ld;
  r.vocab = vocab;
  r.inv_temp = 0.0f;
  r.vec = (mode & kSampleVectorLoads) && (reinterpret_cast<uintptr_t>(r.logits) & 15) == 0;

  unsigned long long best = 0;
  if (spread_best != nullptr) {
    best = spread_s;
  } else {
    for_each_key(r, [&](int i, uint32_t k) {
      const unsigned long long c = best_of(i, k);
      best = c > best ? c : best;
    });
    best = block_reduce(
        best, [](unsigned long long a, unsigned long long b) { return a > b ? a : b; }, sh.ured);
  }
  const uint32_t max_key = static_cast<uint32_t>(best >> 32);
  const int argmax = id_of_best(best);
  if (max_key == 0) {
    if (threadIdx.x == 0) out->error = kSampleAllNan;
    return;
  }
  r.lmax = value_of_key(max_key);

  int chosen = argmax;
  const bool sampling = p.inv_temp > 0.0f;
  if (sampling) {
    if (max_key < kMinSampleKey || max_key >= kPosInfKey) {
      if (threadIdx.x == 0) out->error = kSampleNoFinite;
      return;
    }
    r.inv_temp = p.inv_temp;
  }
  if (sampling || p.top_n > 0) histogram(r, sh, -1, 1);
  if (sampling) {
    unsigned long long n_valid = 0, total_mass = 0;
    for (int b = kMinSampleKey >> 8; b < 256; ++b) {
      n_valid += sh.hi_cnt[b];
      total_mass += sh.hi_mass[b];
    }
    Cut cut = {kMinSampleKey, vocab};
    unsigned long long kept_cnt = n_valid, kept_mass = total_mass;
    if (p.top_k > 0 && static_cast<unsigned long long>(p.top_k) < n_valid) {
      const Selected s = select_prefix(r, sh, false, p.top_k, kMinSampleKey);
      cut = s.cut;
      kept_cnt = s.cnt;
      kept_mass = s.mass;
    }
    if (p.top_p < 1.0f && kept_cnt > 1) {
      const double target = static_cast<double>(p.top_p) * static_cast<double>(kept_mass);
      const Selected s = select_prefix(r, sh, true, target, kMinSampleKey);
      if (!s.all) cut = tighter(cut, s.cut);
    }
    if (p.min_p > 0.0f) {
      // The lowest key whose weight (relative to the best, monotone in the key) reaches min_p.
      uint32_t lo = kMinSampleKey, hi = max_key;
      while (lo < hi) {
        const uint32_t mid = (lo + hi) / 2;
        if (weight_of(r, mid) >= p.min_p)
          hi = mid;
        else
          lo = mid + 1;
      }
      cut = tighter(cut, Cut{lo, vocab});
    }
    const Row& rr = r;
    auto kept_weight = [&rr, cut](int i, uint32_t k) {
      return kept(cut, k, i) ? static_cast<double>(weight_of(rr, k)) : 0.0;
    };
    // The kept probabilities in id order: the first id whose running sum exceeds u * total.
    chosen = find_crossing(r, sh, kept_weight, p.uniform, true);
    if (chosen < 0) chosen = argmax;  // not reached: the best token always has weight 1
  }

  if (p.want_logprob || p.top_n > 0) {
    double sum = 0.0;
    for_each_key(r, [&](int, uint32_t k) {
      if (k != 0) sum += __expf(value_of_key(k) - r.lmax);
    });
    sum = block_reduce(
        sum, [](double a, double b) { return a + b; }, sh.dred);
    const double log_z = static_cast<double>(r.lmax) + log(sum);
    if (threadIdx.x == 0) out->logprob = static_cast<float>(__half2float(r.logits[chosen]) - log_z);
    if (p.top_n > 0) {
      const Selected s = select_prefix(r, sh, false, p.top_n, 1);
      if (threadIdx.x == 0) sh.n_gathered = 0;
      __syncthreads();
      for_each_key(r, [&](int i, uint32_t k) {
        if (k == 0 || !kept(s.cut, k, i)) return;
        const int slot = atomicAdd(&sh.n_gathered, 1);
        if (slot < kSampleMaxTop) {
          sh.gathered_key[slot] = k;
          sh.gathered_id[slot] = i;
        }
      });
      __syncthreads();
      if (threadIdx.x == 0) {
        const int n = min(min(sh.n_gathered, p.top_n), kSampleMaxTop);
        // Insertion sort of at most 20: more likely first.
        for (int a = 1; a < n; ++a) {
          const uint32_t k = sh.gathered_key[a];
          const int id = sh.gathered_id[a];
          int b = a - 1;
          while (b >= 0 &&
                 (sh.gathered_key[b] < k || (sh.gathered_key[b] == k && sh.gathered_id[b] > id))) {
            sh.gathered_key[b + 1] = sh.gathered_key[b];
            sh.gathered_id[b + 1] = sh.gathered_id[b];
            --b;
          }
          sh.gathered_key[b + 1] = k;
          sh.gathered_id[b + 1] = id;
        }
        out->n_top = n;
        for (int a = 0; a < n; ++a) {
          out->top_ids[a] = sh.gathered_id[a];
          out->top_logprobs[a] =
              static_cast<float>(static_cast<double>(value_of_key(sh.gathered_key[a])) - log_z);
        }
      }
    }
  }
  if (threadIdx.x == 0) {  // every field: the results buffer is reused between calls
    out->id = chosen;
    out->error = kSampleOk;
    if (p.top_n <= 0) out->n_top = 0;
    if (!p.want_logprob && p.top_n <= 0) out->logprob = 0.0f;
  }
}

}  // namespace

void sample_rows(const half* logits, int64_t ld, int vocab, int rows, const SampleRowParams* params,
                 SampleRowOut* out, int mode, cudaStream_t s, unsigned long long* best,
                 const int32_t* params_slot, int slot_mask) {
  if (rows <= 0) return;
  if (!(mode & kSampleSpreadArgmax)) best = nullptr;
  if (best != nullptr) {
    const int blocks = std::min(kBestBlocks, (vocab + 8 * kBestThreads - 1) / (8 * kBestThreads));
    row_best_kernel<<<dim3(static_cast<unsigned>(std::max(blocks, 1)), static_cast<unsigned>(rows)),
                      kBestThreads, 0, s>>>(logits, ld, vocab, best);
    GYRE_CUDA_LAUNCHED();
  }
  sample_rows_kernel<<<rows, kThreads, 0, s>>>(logits, ld, vocab, params, out, mode, best,
                                               params_slot, slot_mask);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
