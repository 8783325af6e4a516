// The CUDA backend's rope_attention_paged (q and k rotated by the paged KV-cache store kernel,
// paged_rope_store.cu) against the CPU backend's default of the same op (rope_qk, then
// attention_paged: the reference, itself checked against float64 in test_cpu_ops.cc and
// test_cpu_paged_attention.cc), and against the CUDA backend's own unfused pair on a second
// cache. Each case runs two steps: prompts as chunks (the fused kernel stores rotated keys), then
// decode rows and further chunks that attend over those stored keys, so both the in-place q and
// the cache contents are checked; then one decode row per sequence (the decode attention kernel
// rotates and stores itself, attention_decode.cuh). Shapes: head dims 8/40/64/80/96/128/256, GQA
// and none, page sizes 5/7/16/32, NeoX and interleaved pairs, partial rotation, a YaRN-style
// attn_factor, and f16/q8/q4 caches. Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend_test_util.h"
#include "core/half.h"
#include "core/kv_quant.h"
#include "cuda_test_util.h"
#include "paged_batch_util.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gyre {
namespace {

using btest::Act;
using btest::host;
using btest::random_f16;
using btest::rel_error;
using btest::upload;

using ctest::cuda_backend;

struct Case {
  int n_heads, n_kv_heads, head_dim, page_size;
  int rot_dim;  // <= head_dim
  bool interleaved;
  float attn_factor;
};

struct Seq {
  int prompt, rows;  // step 1: positions [0, prompt); step 2: [prompt, prompt + rows)
  std::vector<int32_t> pages;
};

RopeTable rope_table(const Case& c) {
  RopeTable t;
  t.rot_dim = c.rot_dim;
  t.interleaved = c.interleaved;
  t.attn_factor = c.attn_factor;
  for (int i = 0; i < c.rot_dim / 2; ++i)
    t.inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / c.rot_dim)));
  return t;
}

// One step: rows [first[s], first[s] + rows[s]) of each sequence, on the CPU reference (default
// op), the GPU's fused op and the GPU's unfused pair; returns the errors of out and rotated q.
struct StepErrors {
  double out_cpu, q_cpu, out_unfused, q_unfused;
};

class Runner {
 public:
  Runner(const Case& c, const char* kv, int num_pages)
      : c_(c), cpu_(make_cpu_backend(2, parse_kv_type(kv))), gpu_(cuda_backend(kv)) {
    for (int i = 0; i < 2; ++i)
      caches_[i] =
          (i == 0 ? *cpu_ : *gpu_)
              .new_paged_kv_cache(kLayers, c.n_kv_heads, c.head_dim, num_pages, c.page_size);
    gpu_unfused_cache_ =
        gpu_->new_paged_kv_cache(kLayers, c.n_kv_heads, c.head_dim, num_pages, c.page_size);
  }

  StepErrors step(const std::vector<Seq>& seqs, const std::vector<int>& first,
                  const std::vector<int>& rows, int layer, uint64_t generation, std::mt19937& rng) {
    std::vector<std::vector<int32_t>> pages;
    for (const Seq& q : seqs) pages.push_back(q.pages);
    const HostPagedBatch hb(pages, first, rows, c_.page_size, generation);
    const PagedBatch& b = hb.batch;
    const int64_t n = b.rows, qc = int64_t{c_.n_heads} * c_.head_dim,
                  kvc = int64_t{c_.n_kv_heads} * c_.head_dim;
    const std::vector<float> qv = random_f16(size_t(n * qc), rng),
                             kv = random_f16(size_t(n * kvc), rng),
                             vv = random_f16(size_t(n * kvc), rng);
    AttentionParams p;
    p.n_heads = c_.n_heads;
    p.n_kv_heads = c_.n_kv_heads;
    p.head_dim = c_.head_dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
    const RopeTable table = rope_table(c_);

    // [0] CPU default op, [1] GPU fused, [2] GPU rope_qk + attention_paged.
    std::vector<float> outs[3], qs[3];
    for (int which = 0; which < 3; ++which) {
      Backend& be = which == 0 ? *cpu_ : *gpu_;
      Act q = upload(be, qv, n, qc), k = upload(be, kv, n, kvc), v = upload(be, vv, n, kvc);
      Tensor out = be.alloc(n, qc);
      if (which < 2) {
        be.rope_attention_paged(out, q.t, k.t, v.t, *caches_[which], layer, b, p, table);
      } else {
        be.rope_qk(q.t, p.n_heads, k.t, p.n_kv_heads, p.head_dim, hb.positions.data(), table);
        be.attention_paged(out, q.t, k.t, v.t, *gpu_unfused_cache_, layer, b, p);
      }
      outs[which] = host(be, out);
      qs[which] = host(be, q.t);
    }
    return {rel_error(outs[1], outs[0]), rel_error(qs[1], qs[0]), rel_error(outs[1], outs[2]),
            rel_error(qs[1], qs[2])};
  }

  static constexpr int kLayers = 2;

 private:
  Case c_;
  std::unique_ptr<Backend> cpu_, gpu_;
  std::unique_ptr<PagedKvCache> caches_[2], gpu_unfused_cache_;
};

void run_case(const Case& c, std::vector<Seq> seqs, uint32_t seed, const char* kv) {
  SCOPED_TRACE(std::string("cache ") + kv + ", head_dim " + std::to_string(c.head_dim) +
               ", rot_dim " + std::to_string(c.rot_dim) +
               (c.interleaved ? ", interleaved" : ", neox"));
  std::mt19937 rng(seed);
  // Pages scattered over the pool.
  int total = 0;
  for (const Seq& q : seqs) total += (q.prompt + q.rows + 1 + c.page_size - 1) / c.page_size;
  std::vector<int32_t> pool(size_t(total + 5));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t at = 0;
  for (Seq& q : seqs)
    for (int i = 0; i < (q.prompt + q.rows + 1 + c.page_size - 1) / c.page_size; ++i)
      q.pages.push_back(pool[at++]);
  Runner runner(c, kv, static_cast<int>(pool.size()));

  const bool quantized = parse_kv_type(kv) != KvType::F16;
  const double tol = quantized ? 5e-3 : 3e-3;
  std::vector<int> zeros(seqs.size(), 0), prompts, rows, ends, ones(seqs.size(), 1);
  for (const Seq& q : seqs)
    prompts.push_back(q.prompt), rows.push_back(q.rows), ends.push_back(q.prompt + q.rows);
  for (int layer = 0; layer < Runner::kLayers; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    const StepErrors prompt = runner.step(seqs, zeros, prompts, layer, 1 + uint64_t(layer), rng);
    const StepErrors next = runner.step(seqs, prompts, rows, layer, 10 + uint64_t(layer), rng);
    // One decode row per sequence: the decode kernel rotates and stores itself (q's contents
    // afterwards are unspecified, so only the outputs are compared).
    const StepErrors decode = runner.step(seqs, ends, ones, layer, 20 + uint64_t(layer), rng);
    for (const StepErrors& e : {prompt, next, decode}) {
      EXPECT_LT(e.out_cpu, tol);
      // The same FP16 rounding as rope then store: equal up to the odd last-bit difference.
      EXPECT_LT(e.out_unfused, 1e-3);
    }
    for (const StepErrors& e : {prompt, next}) {  // steps the separate rope/store kernel runs
      EXPECT_LT(e.q_cpu, 1e-3);
      EXPECT_LT(e.q_unfused, 1e-3);
    }
  }
}

const char* const kCaches[] = {"f16", "q8", "q4"};

TEST(CudaRopeStore, Llama8bShapeNeox) {
  GYRE_SKIP_WITHOUT_GPU();
  for (const char* kv : kCaches)
    run_case({32, 8, 128, 16, 128, false, 1.0f},
             {{120, 1, {}}, {33, 1, {}}, {0, 16, {}}, {40, 40, {}}, {1, 1, {}}}, 1, kv);
}

TEST(CudaRopeStore, InterleavedOddPagesAttnFactor) {
  GYRE_SKIP_WITHOUT_GPU();
  for (const char* kv : kCaches)
    run_case({12, 4, 64, 7, 64, true, 1.2f}, {{200, 1, {}}, {3, 1, {}}, {40, 30, {}}}, 2, kv);
}

TEST(CudaRopeStore, PartialRotationNoGqa) {
  GYRE_SKIP_WITHOUT_GPU();
  for (const char* kv : kCaches) {
    run_case({10, 10, 80, 32, 40, false, 1.0f}, {{150, 1, {}}, {33, 20, {}}}, 3, kv);
    run_case({32, 2, 96, 16, 64, true, 1.0f}, {{90, 1, {}}, {16, 17, {}}}, 4, kv);
  }
}

TEST(CudaRopeStore, SmallAndLargeHeads) {
  GYRE_SKIP_WITHOUT_GPU();
  for (const char* kv : kCaches) {
    run_case({8, 4, 8, 16, 8, false, 1.0f}, {{60, 1, {}}, {10, 20, {}}}, 5, kv);
    run_case({16, 2, 40, 5, 40, true, 1.0f}, {{70, 1, {}}, {30, 33, {}}}, 6, kv);
    run_case({4, 2, 256, 16, 256, false, 1.0f}, {{40, 1, {}}, {20, 5, {}}}, 7, kv);
  }
}

}  // namespace
}  // namespace gyre
