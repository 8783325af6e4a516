// Standalone check and bench of the CUDA decode attention (contiguous and paged caches), built by
// bench/attention_device.sh as one static binary so a device run needs no project libraries.
// Check: every (shape, cache type, key count, window, queries) case against a float64 reference
// computed on the host from the cache rows as stored (read back, dequantized by core/kv_quant's
// CPU code), for the decode block (attention_decode.cuh) and the generic block (split_attend).
// Bench: one layer's decode attention at 100 to 32k keys for the llama2-7b (32/32 heads) and
// llama3-8b (32/8) shapes, head dim 128: median us of launches back to back in a graph, rotating
// over several caches so that L2 does not hold the keys, and GB/s of the cache read; per way of
// combining the split partials (attention_share.cuh).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/paged_attention.h"
#include "core/half.h"
#include "core/kv_quant.h"

using namespace gyre;
using namespace gyre::cuda;

namespace {

#define CK(x) GYRE_CUDA_CHECK(x)

int g_sms = 0;

struct Shape {
  int heads, kv_heads, dim;
};

// One layer's contiguous cache of `max_seq` rows per KV head, filled with `n` random tokens.
struct Cache {
  KvType type;
  Shape sh;
  int max_seq;
  void *k = nullptr, *v = nullptr;
  half *kp = nullptr, *vp = nullptr;
  size_t code_bytes, param_halves;  // per row
  void alloc(KvType t, Shape s, int rows_per_head) {
    type = t;
    sh = s;
    max_seq = rows_per_head;
    code_bytes = kv_code_bytes(t, s.dim);
    param_halves = kv_param_halves(t, s.dim);
    const size_t rows = static_cast<size_t>(s.kv_heads) * rows_per_head;
    CK(cudaMalloc(&k, rows * code_bytes));
    CK(cudaMalloc(&v, rows * code_bytes));
    if (param_halves > 0) {
      CK(cudaMalloc(&kp, rows * param_halves * 2));
      CK(cudaMalloc(&vp, rows * param_halves * 2));
    }
  }
  void free_all() {
    cudaFree(k);
    cudaFree(v);
    cudaFree(kp);
    cudaFree(vp);
  }
  size_t bytes_per_token() const { return 2 * sh.kv_heads * (code_bytes + 2 * param_halves); }
};

std::vector<uint16_t> random_halves(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<uint16_t> out(n);
  for (auto& x : out) x = f32_to_f16(d(rng));
  return out;
}

half* upload(const std::vector<uint16_t>& h) {
  half* d = nullptr;
  CK(cudaMalloc(&d, h.size() * 2));
  CK(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

// Stores n tokens of random k/v (drawn on the device) at positions 0..n-1 with the project's
// store kernel.
void fill(Cache& c, int n, uint64_t seed) {
  const size_t count = static_cast<size_t>(n) * c.sh.kv_heads * c.sh.dim;
  half *kd = nullptr, *vd = nullptr;
  CK(cudaMalloc(&kd, count * 2));
  CK(cudaMalloc(&vd, count * 2));
  fill_random(kd, static_cast<int64_t>(count), seed, 1.0f, 0.0f, nullptr);
  fill_random(vd, static_cast<int64_t>(count), seed + 1, 1.0f, 0.0f, nullptr);
  int32_t* pos0 = nullptr;
  CK(cudaMalloc(&pos0, 4));
  CK(cudaMemset(pos0, 0, 4));
  KvStoreArgs st;
  st.k_codes = c.k;
  st.v_codes = c.v;
  st.k_params = c.kp;
  st.v_params = c.vp;
  st.kv_type = static_cast<int>(c.type);
  st.n = n;
  st.n_kv_heads = c.sh.kv_heads;
  st.head_dim = c.sh.dim;
  st.max_seq = c.max_seq;
  kv_store(st, kd, vd, pos0, nullptr);
  CK(cudaDeviceSynchronize());
  cudaFree(kd);
  cudaFree(vd);
  cudaFree(pos0);
}

// Row r (kv head h, position j: r = h * max_seq + j) of a plane, dequantized on the host.
std::vector<float> host_plane(const Cache& c, bool values, int n) {
  const int D = c.sh.dim;
  const size_t rows = static_cast<size_t>(c.sh.kv_heads) * c.max_seq;
  std::vector<uint8_t> codes(rows * c.code_bytes);
  std::vector<uint16_t> params(rows * c.param_halves);
  CK(cudaMemcpy(codes.data(), values ? c.v : c.k, codes.size(), cudaMemcpyDeviceToHost));
  if (c.param_halves)
    CK(cudaMemcpy(params.data(), values ? c.vp : c.kp, params.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(static_cast<size_t>(c.sh.kv_heads) * n * D);
  for (int h = 0; h < c.sh.kv_heads; ++h)
    for (int j = 0; j < n; ++j) {
      const size_t r = static_cast<size_t>(h) * c.max_seq + j;
      float* dst = &out[(static_cast<size_t>(h) * n + j) * D];
      if (c.type == KvType::F16) {
        for (int d = 0; d < D; ++d) {
          uint16_t x;
          std::memcpy(&x, &codes[r * c.code_bytes + 2 * d], 2);
          dst[d] = f16_to_f32(x);
        }
      } else {
        kv_dequantize_row(c.type, &codes[r * c.code_bytes], &params[r * c.param_halves], D, dst);
      }
    }
  return out;
}

struct Case {
  Shape sh;
  KvType type;
  int keys, window, n_q;
};

// float64 attention of query qi (position keys - n_q + qi) over the stored rows.
std::vector<double> reference(const Case& cs, const std::vector<uint16_t>& q,
                              const std::vector<float>& K, const std::vector<float>& V,
                              float scale) {
  const Shape& s = cs.sh;
  const int D = s.dim, group = s.heads / s.kv_heads;
  std::vector<double> out(static_cast<size_t>(cs.n_q) * s.heads * D, 0.0);
  for (int qi = 0; qi < cs.n_q; ++qi) {
    const int pos = cs.keys - cs.n_q + qi;
    const int lo = cs.window > 0 ? std::max(0, pos - cs.window + 1) : 0;
    for (int h = 0; h < s.heads; ++h) {
      const int kvh = h / group;
      const uint16_t* qr = &q[(static_cast<size_t>(qi) * s.heads + h) * D];
      std::vector<double> sc(pos + 1 - lo);
      double mx = -1e300;
      for (int j = lo; j <= pos; ++j) {
        const float* kr = &K[(static_cast<size_t>(kvh) * cs.keys + j) * D];
        double a = 0;
        for (int d = 0; d < D; ++d) a += static_cast<double>(f16_to_f32(qr[d])) * scale * kr[d];
        sc[j - lo] = a;
        mx = std::max(mx, a);
      }
      double l = 0;
      for (auto& x : sc) l += (x = std::exp(x - mx));
      double* o = &out[(static_cast<size_t>(qi) * s.heads + h) * D];
      for (int j = lo; j <= pos; ++j) {
        const float* vr = &V[(static_cast<size_t>(kvh) * cs.keys + j) * D];
        for (int d = 0; d < D; ++d) o[d] += sc[j - lo] / l * vr[d];
      }
    }
  }
  return out;
}

double rel_err(const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = f16_to_f32(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

float* g_workspace = nullptr;
size_t g_workspace_floats = 0;
float* workspace(size_t floats) {
  if (floats > g_workspace_floats) {
    cudaFree(g_workspace);
    CK(cudaMalloc(&g_workspace, floats * 4));
    g_workspace_floats = floats;
  }
  return g_workspace;
}

// Combine counters (attention_share.cuh): zeroed once, the kernels leave them zero.
unsigned* counters() {
  static unsigned* c = [] {
    unsigned* p = nullptr;
    CK(cudaMalloc(&p, (1 << 16) * sizeof(unsigned)));
    CK(cudaMemset(p, 0, (1 << 16) * sizeof(unsigned)));
    return p;
  }();
  return c;
}

// How a split launch combines: the separate kernel (single < 0), else in the attention kernel
// with contexts of at most `single` keys taken by one block.
template <class Args>
void set_combine(Args& a, int single) {
  a.counters = single >= 0 && a.splits > 1 ? counters() : nullptr;
  a.single_span = std::max(0, single);
}

AttentionArgs contiguous_args(const Cache& c, const half* q, half* out, const int32_t* pos0,
                              int n_q, int window, bool generic, int single = -1) {
  AttentionArgs a;
  a.q = q;
  a.k_cache = c.k;
  a.v_cache = c.v;
  a.k_params = c.kp;
  a.v_params = c.vp;
  a.kv_type = static_cast<int>(c.type);
  a.out = out;
  a.pos0 = pos0;
  a.n_q = n_q;
  a.n_heads = c.sh.heads;
  a.n_kv_heads = c.sh.kv_heads;
  a.head_dim = c.sh.dim;
  a.max_seq = c.max_seq;
  a.window = window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.sh.dim));
  a.generic_block = generic;
  a.splits = attention_splits(n_q, a.n_heads, a.n_kv_heads, a.head_dim, a.kv_type, c.max_seq, g_sms,
                              generic);
  a.partial = workspace(attention_workspace_floats(n_q, a.n_heads, a.head_dim, a.splits));
  set_combine(a, single);
  return a;
}

// The same rows copied into a paged cache (page size 16, pages in shuffled order): the paged
// block must give the contiguous block's answer.
struct Paged {
  void *k = nullptr, *v = nullptr;
  half *kp = nullptr, *vp = nullptr;
  int32_t *table = nullptr, *positions = nullptr, *row_seq = nullptr, *split_rows = nullptr;
  int pages = 0;
};
constexpr int kPage = 16;

Paged make_paged(const Cache& c, int keys, int n_q, std::mt19937& rng) {
  Paged p;
  p.pages = (keys + kPage - 1) / kPage;
  std::vector<int32_t> table(p.pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const size_t rows = static_cast<size_t>(p.pages) * c.sh.kv_heads * kPage;
  CK(cudaMalloc(&p.k, rows * c.code_bytes));
  CK(cudaMalloc(&p.v, rows * c.code_bytes));
  if (c.param_halves) {
    CK(cudaMalloc(&p.kp, rows * c.param_halves * 2));
    CK(cudaMalloc(&p.vp, rows * c.param_halves * 2));
  }
  // Page i of every KV head at once: rows h * max_seq + i * kPage.. (the cache holds whole pages).
  auto copy_pages = [&](void* dst, const void* src, size_t row_bytes) {
    for (int i = 0; i < p.pages; ++i)
      CK(cudaMemcpy2D(
          static_cast<char*>(dst) + size_t(table[i]) * c.sh.kv_heads * kPage * row_bytes,
          kPage * row_bytes, static_cast<const char*>(src) + size_t(i) * kPage * row_bytes,
          size_t(c.max_seq) * row_bytes, kPage * row_bytes, c.sh.kv_heads,
          cudaMemcpyDeviceToDevice));
  };
  copy_pages(p.k, c.k, c.code_bytes);
  copy_pages(p.v, c.v, c.code_bytes);
  if (c.param_halves) {
    copy_pages(p.kp, c.kp, 2 * c.param_halves);
    copy_pages(p.vp, c.vp, 2 * c.param_halves);
  }
  std::vector<int32_t> positions(n_q), seqs(n_q, 0), split_rows(n_q);
  for (int i = 0; i < n_q; ++i) positions[i] = keys - n_q + i;
  std::iota(split_rows.begin(), split_rows.end(), 0);
  auto put = [](const std::vector<int32_t>& h) {
    int32_t* d = nullptr;
    CK(cudaMalloc(&d, h.size() * 4));
    CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  p.table = put(table);
  p.positions = put(positions);
  p.row_seq = put(seqs);
  p.split_rows = put(split_rows);
  return p;
}

void free_paged(Paged& p) {
  for (void* x : {p.k, p.v, static_cast<void*>(p.kp), static_cast<void*>(p.vp),
                  static_cast<void*>(p.table), static_cast<void*>(p.positions),
                  static_cast<void*>(p.row_seq), static_cast<void*>(p.split_rows)})
    cudaFree(x);
}

PagedAttentionArgs paged_args(const Cache& c, const Paged& p, const half* q, half* out, int n_q,
                              int keys, int window, bool generic, int single = -1) {
  PagedAttentionArgs a;
  a.q = q;
  a.out = out;
  a.k_cache = p.k;
  a.v_cache = p.v;
  a.k_params = p.kp;
  a.v_params = p.vp;
  a.kv_type = static_cast<int>(c.type);
  a.positions = p.positions;
  a.row_seq = p.row_seq;
  a.page_tables = p.table;
  a.max_pages = p.pages;
  a.page_size = kPage;
  a.n_heads = c.sh.heads;
  a.n_kv_heads = c.sh.kv_heads;
  a.head_dim = c.sh.dim;
  a.window = window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.sh.dim));
  a.split_rows = p.split_rows;
  a.n_split_rows = n_q;
  a.generic_block = generic;
  a.splits =
      attention_splits(n_q, a.n_heads, a.n_kv_heads, a.head_dim, a.kv_type, keys, g_sms, generic);
  a.partial = workspace(paged_workspace_floats(n_q, a.n_heads, a.head_dim, a.splits));
  set_combine(a, single);
  return a;
}

int check_all() {
  std::mt19937 rng(1234);
  const Shape shapes[] = {{32, 32, 128}, {32, 8, 128}, {8, 8, 64}, {4, 4, 80}, {12, 4, 96},
                          {64, 8, 128},  {20, 2, 96},  {6, 2, 40}, {4, 2, 13}};
  int failures = 0, cases = 0;
  for (const Shape& sh : shapes)
    for (KvType type : {KvType::F16, KvType::Q8, KvType::Q4})
      for (int keys : {1, 31, 129, 4097})
        for (int window : {0, 50})
          for (int n_q : {1, 3}) {
            if (n_q > keys || (window > 0 && keys < 129)) continue;
            const Case cs{sh, type, keys, window, n_q};
            Cache c;
            // max_seq past the keys (whole pages for the paged copy): rows beyond are never read.
            c.alloc(type, sh, (keys + kPage - 1) / kPage * kPage + 7);
            fill(c, keys, rng());
            const auto K = host_plane(c, false, keys), V = host_plane(c, true, keys);
            const auto qh = random_halves(static_cast<size_t>(n_q) * sh.heads * sh.dim, rng, 1.0f);
            half* q = upload(qh);
            half* out = nullptr;
            const size_t out_count = qh.size();
            CK(cudaMalloc(&out, out_count * 2));
            int32_t* pos0 = nullptr;
            CK(cudaMalloc(&pos0, 4));
            const int32_t p0 = keys - n_q;
            CK(cudaMemcpy(pos0, &p0, 4, cudaMemcpyHostToDevice));
            const auto ref = reference(cs, qh, K, V, 1.0f / std::sqrt(float(sh.dim)));
            Paged pg = make_paged(c, keys, n_q, rng);
            // Bits: generic block, paged cache; then the combine: kernel, in the attention
            // kernel with no single-block span, with a 64-key one.
            for (int variant = 0; variant < 12; ++variant) {
              const bool generic = variant & 1, paged = variant & 2;
              const int single = variant / 4 == 0 ? -1 : variant / 4 == 1 ? 0 : 64;
              CK(cudaMemset(out, 0xFF, out_count * 2));  // NaN: every output must be written
              if (paged)
                paged_attention(paged_args(c, pg, q, out, n_q, keys, window, generic, single),
                                nullptr);
              else
                attention(contiguous_args(c, q, out, pos0, n_q, window, generic, single), nullptr);
              CK(cudaDeviceSynchronize());
              std::vector<uint16_t> got(out_count);
              CK(cudaMemcpy(got.data(), out, out_count * 2, cudaMemcpyDeviceToHost));
              const double e = rel_err(got, ref);
              ++cases;
              if (!(e < 2e-3)) {
                ++failures;
                std::printf(
                    "FAIL %s heads %d/%d dim %d %s keys %d window %d n_q %d: %s block, single "
                    "%d: %g\n",
                    paged ? "paged" : "contiguous", sh.heads, sh.kv_heads, sh.dim,
                    kv_type_name(type), keys, window, n_q, generic ? "generic" : "decode", single,
                    e);
              }
            }
            free_paged(pg);
            cudaFree(q);
            cudaFree(out);
            cudaFree(pos0);
            c.free_all();
          }
  std::printf("check: %d cases, %d failures\n", cases, failures);
  return failures;
}

void bench_all() {
  struct Named {
    const char* name;
    Shape sh;
  };
  const Named shapes[] = {{"llama2-7b", {32, 32, 128}}, {"llama3-8b", {32, 8, 128}}};
  // Decode block, one query; the partials combined by: the separate kernel ("kernel"), the last
  // block in the attention kernel ("last"), or no split: one block per head group for the whole
  // context ("one", up to 1024 keys); and the paged cache with "last".
  std::printf("%-10s %-4s %6s %7s | %9s %9s %9s %9s | %7s %7s | %6s\n", "shape", "kv", "keys", "MB",
              "kernel us", "last us", "one us", "paged us", "GB/s k", "GB/s l", "splits");
  std::mt19937 rng(7);
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  for (const Named& nm : shapes)
    for (KvType type : {KvType::F16, KvType::Q8, KvType::Q4})
      for (int keys : {100, 256, 384, 512, 768, 1024, 8192, 32768}) {
        // Enough caches that their total exceeds L2 (50 MB) several times over.
        Cache one;
        one.alloc(type, nm.sh, keys);
        const double mb = one.bytes_per_token() * double(keys) / 1e6;
        one.free_all();
        const int copies = std::max(2, std::min(16, static_cast<int>(400.0 / mb)));
        std::vector<Cache> caches(copies);
        for (auto& c : caches) {
          // Short contexts in a cache of 8k rows (the split count follows max_seq, as in gyre).
          c.alloc(type, nm.sh, std::max(keys, 8192));
          fill(c, keys, rng());
        }
        half* q = upload(random_halves(size_t(nm.sh.heads) * nm.sh.dim, rng, 1.0f));
        half* out = nullptr;
        CK(cudaMalloc(&out, size_t(nm.sh.heads) * nm.sh.dim * 2));
        int32_t* pos0 = nullptr;
        CK(cudaMalloc(&pos0, 4));
        const int32_t p0 = keys - 1;
        CK(cudaMemcpy(pos0, &p0, 4, cudaMemcpyHostToDevice));
        std::vector<Paged> pgs;
        for (auto& c : caches) pgs.push_back(make_paged(c, keys, 1, rng));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        double us[4];
        int splits_new = 0;
        for (int variant = 0; variant < 4; ++variant) {
          if (variant == 2 && keys > 1024) {
            us[2] = 0;
            continue;
          }
          // One graph of launches back to back (as in a decode step), each on the next cache:
          // the median of 5 replays of the mean per launch. Arguments (and the workspace) are
          // made before the capture.
          const int per_round = 4 * copies;
          std::vector<AttentionArgs> cargs;
          std::vector<PagedAttentionArgs> pargs;
          for (int it = 0; it < per_round; ++it) {
            const int i = it % copies;
            if (variant == 3)
              pargs.push_back(paged_args(caches[i], pgs[i], q, out, 1, keys, 0, false, 0));
            else
              cargs.push_back(contiguous_args(caches[i], q, out, pos0, 1, 0, false,
                                              variant == 0   ? -1
                                              : variant == 1 ? 0
                                                             : 1 << 30));
          }
          if (variant == 1) splits_new = cargs[0].splits;
          CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
          for (int it = 0; it < per_round; ++it) {
            if (variant == 3)
              paged_attention(pargs[it], stream);
            else
              attention(cargs[it], stream);
          }
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CK(cudaStreamEndCapture(stream, &graph));
          CK(cudaGraphInstantiate(&exec, graph, 0));
          std::vector<float> times;
          for (int round = 0; round < 6; ++round) {
            CK(cudaEventRecord(e0, stream));
            CK(cudaGraphLaunch(exec, stream));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (round > 0) times.push_back(ms / per_round);  // round 0: warm-up
          }
          CK(cudaGraphExecDestroy(exec));
          CK(cudaGraphDestroy(graph));
          std::sort(times.begin(), times.end());
          us[variant] = 1000.0 * times[times.size() / 2];
        }
        std::printf("%-10s %-4s %6d %7.1f | %9.2f %9.2f %9.2f %9.2f | %7.0f %7.0f | %6d\n", nm.name,
                    kv_type_name(type), keys, mb, us[0], us[1], us[2], us[3],
                    mb * 1e-3 / (us[0] * 1e-6), mb * 1e-3 / (us[1] * 1e-6), splits_new);
        for (auto& pg : pgs) free_paged(pg);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaFree(q);
        cudaFree(out);
        cudaFree(pos0);
        for (auto& c : caches) c.free_all();
      }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  std::printf("device %s, %d SMs\n", prop.name, g_sms);
  int failures = 0;
  if (mode == "all" || mode == "check") failures = check_all();
  if (mode == "all" || mode == "bench") bench_all();
  return failures == 0 ? 0 : 1;
}
