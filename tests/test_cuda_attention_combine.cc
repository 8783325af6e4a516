// The contiguous cache's decode attention with the split partials combined inside the attention
// kernel (attention_share.cuh: the last block of a head group combines; contexts up to the
// single-block span take one block) and the fused rope + KV store (rope_store.cuh via
// Backend::rope_attention; for decode rows inside the attention kernel), both against the CPU
// backend (the reference, checked against float64 in test_cpu_ops.cc) with the same cache type. Key
// counts 1, 7, 129, 250, 1000, 4100 and the steps after them (the counters must be left at zero for
// the next launch); head dims 13 (the generic block), 40, 64, 80, 96, 128, 256; GQA and MHA;
// f16/q8/q4 caches; every share mode through the environment switches read when a CUDA backend is
// made (GYRE_CUDA_ATTN_SINGLE: 0 = always split, huge = always one block;
// GYRE_CUDA_SPLIT_COMBINE=kernel: the separate combine kernel; GYRE_CUDA_ATTN_CHUNK: the smallest
// share; GYRE_CUDA_ATTN_MERGE=online: no weighted merge past 16 shares). Inputs are FP16-exact, so
// both backends store identical rows. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend_test_util.h"
#include "core/half.h"
#include "core/kv_quant.h"
#include "cuda_test_util.h"
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

// A CUDA backend made with the environment switches `env` (name=value pairs) set, then unset.
std::unique_ptr<Backend> cuda_backend(const std::string& kv,
                                      const std::vector<std::pair<const char*, std::string>>& env) {
  for (const auto& [name, value] : env) setenv(name, value.c_str(), 1);
  auto b = ctest::cuda_backend(kv);
  for (const auto& [name, value] : env) unsetenv(name);
  return b;
}

struct Shape {
  int heads, kv_heads, head_dim;
};

AttentionParams params(const Shape& s) {
  AttentionParams p;
  p.n_heads = s.heads;
  p.n_kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  return p;
}

// Calls of `steps` tokens each on the CPU and on a GPU backend made with `env`; every call's
// output is compared.
void run_attention(const char* type, const Shape& s, const std::vector<int>& steps,
                   const std::vector<std::pair<const char*, std::string>>& env, std::mt19937& rng) {
  auto cpu = make_cpu_backend(2, parse_kv_type(type));
  auto gpu = cuda_backend(type, env);
  int total = 0;
  for (int n : steps) total += n;
  auto cache_cpu = cpu->new_kv_cache(1, s.kv_heads, s.head_dim, total);
  auto cache_gpu = gpu->new_kv_cache(1, s.kv_heads, s.head_dim, total);
  const AttentionParams p = params(s);
  const int qd = s.heads * s.head_dim, kd = s.kv_heads * s.head_dim;
  int pos = 0;
  for (int n : steps) {
    const auto qv = random_f16(size_t(n) * qd, rng), kv = random_f16(size_t(n) * kd, rng),
               vv = random_f16(size_t(n) * kd, rng);
    std::vector<float> outs[2];
    for (int which = 0; which < 2; ++which) {
      Backend& be = which == 0 ? *cpu : *gpu;
      Act q = upload(be, qv, n, qd), k = upload(be, kv, n, kd), v = upload(be, vv, n, kd);
      Tensor out = be.alloc(n, qd);
      be.attention(out, q.t, k.t, v.t, which == 0 ? *cache_cpu : *cache_gpu, 0, pos, p);
      outs[which] = host(be, out);
    }
    pos += n;
    EXPECT_LT(rel_error(outs[1], outs[0]), 5e-3)
        << type << " heads " << s.heads << "/" << s.kv_heads << " dim " << s.head_dim << " n " << n
        << " keys " << pos
        << (env.empty() ? "" : std::string(" ") + env[0].first + "=" + env[0].second);
  }
}

// Steps leaving 1, 7, 129 and 250 keys, with decode rows after them; one shape also goes to
// 1000 keys. Few KV heads: the CPU reference's prefill is quadratic.
const std::vector<int> kSteps = {1, 6, 122, 1, 120, 1};
const std::vector<int> kLongSteps = {1, 6, 122, 1, 870, 1, 1};
const char* const kTypes[] = {"f16", "q8", "q4"};

TEST(CudaAttentionCombine, InKernelCombineAllShapesAndTypes) {
  GYRE_SKIP_WITHOUT_GPU();
  std::mt19937 rng(777);
  // GQA 4 and 3, MHA, head dims 128/64/80/96/40 and 13 (the generic block), and a group of 10
  // (two head groups per KV head).
  for (const char* type : kTypes) {
    run_attention(type, Shape{4, 1, 128}, kLongSteps, {}, rng);
    for (const Shape& s : {Shape{3, 1, 64}, Shape{2, 2, 80}, Shape{2, 1, 96}, Shape{2, 1, 40},
                           Shape{2, 1, 13}, Shape{10, 1, 64}})
      run_attention(type, s, kSteps, {}, rng);
  }
}

TEST(CudaAttentionCombine, EveryShareMode) {
  GYRE_SKIP_WITHOUT_GPU();
  std::mt19937 rng(778);
  const std::vector<std::vector<std::pair<const char*, std::string>>> modes = {
      {{"GYRE_CUDA_ATTN_SINGLE", "0"}},    {{"GYRE_CUDA_ATTN_SINGLE", "100000"}},
      {{"GYRE_CUDA_ATTN_SINGLE", "200"}},  {{"GYRE_CUDA_SPLIT_COMBINE", "kernel"}},
      {{"GYRE_CUDA_ATTN_CHUNK", "32"}},    {{"GYRE_CUDA_ATTN_CHUNK", "200"}},
      {{"GYRE_CUDA_ATTN_MERGE", "online"}}};
  for (const auto& env : modes)
    for (const char* type : {"f16", "q4"})
      for (const Shape& s : {Shape{4, 1, 128}, Shape{2, 1, 13}})
        run_attention(type, s, kSteps, env, rng);
}

TEST(CudaAttentionCombine, LongContextManyShares) {
  GYRE_SKIP_WITHOUT_GPU();
  std::mt19937 rng(779);
  // 4100 keys: 128 splits of >= 32 keys (125 shares: the weighted merge, and the online one).
  run_attention("f16", Shape{2, 1, 64}, {4099, 1}, {}, rng);
  run_attention("f16", Shape{2, 1, 64}, {4099, 1}, {{"GYRE_CUDA_ATTN_MERGE", "online"}}, rng);
  run_attention("q8", Shape{8, 2, 128}, {4099, 1}, {}, rng);
  run_attention("f16", Shape{8, 1, 128}, {4099, 1}, {}, rng);  // the tensor-core loop, 8 heads
  run_attention("f16", Shape{8, 2, 96}, {2999, 1}, {}, rng);
}

// rope_attention: CPU default (rope_qk + attention) vs the GPU's fused kernel, and vs the GPU's
// own unfused pair on a second cache.
struct RopeCase {
  Shape s;
  int rot_dim;
  bool interleaved;
  float attn_factor;
};

void run_rope(const char* type, const RopeCase& c, const std::vector<int>& steps,
              const std::vector<std::pair<const char*, std::string>>& env, std::mt19937& rng) {
  SCOPED_TRACE(std::string(type) + " dim " + std::to_string(c.s.head_dim) + " rot " +
               std::to_string(c.rot_dim) + (c.interleaved ? " interleaved" : " neox") +
               (env.empty() ? "" : std::string(" ") + env[0].first + "=" + env[0].second));
  auto cpu = make_cpu_backend(2, parse_kv_type(type));
  auto gpu = cuda_backend(type, env);
  int total = 0;
  for (int n : steps) total += n;
  std::unique_ptr<KvCache> caches[3] = {cpu->new_kv_cache(1, c.s.kv_heads, c.s.head_dim, total),
                                        gpu->new_kv_cache(1, c.s.kv_heads, c.s.head_dim, total),
                                        gpu->new_kv_cache(1, c.s.kv_heads, c.s.head_dim, total)};
  const AttentionParams p = params(c.s);
  RopeTable table;
  table.rot_dim = c.rot_dim;
  table.interleaved = c.interleaved;
  table.attn_factor = c.attn_factor;
  for (int i = 0; i < c.rot_dim / 2; ++i)
    table.inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / c.rot_dim)));
  const int qd = c.s.heads * c.s.head_dim, kd = c.s.kv_heads * c.s.head_dim;
  int pos = 0;
  for (int n : steps) {
    const auto qv = random_f16(size_t(n) * qd, rng), kv = random_f16(size_t(n) * kd, rng),
               vv = random_f16(size_t(n) * kd, rng);
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) positions[size_t(i)] = pos + i;
    // [0] CPU default op, [1] GPU fused, [2] GPU rope_qk + attention.
    std::vector<float> outs[3];
    for (int which = 0; which < 3; ++which) {
      Backend& be = which == 0 ? *cpu : *gpu;
      Act q = upload(be, qv, n, qd), k = upload(be, kv, n, kd), v = upload(be, vv, n, kd);
      Tensor out = be.alloc(n, qd);
      if (which < 2) {
        be.rope_attention(out, q.t, k.t, v.t, *caches[which], 0, pos, p, table);
      } else {
        be.rope_qk(q.t, p.n_heads, k.t, p.n_kv_heads, p.head_dim, positions.data(), table);
        be.attention(out, q.t, k.t, v.t, *caches[2], 0, pos, p);
      }
      outs[which] = host(be, out);
    }
    pos += n;
    SCOPED_TRACE("keys " + std::to_string(pos));
    // (q's contents afterwards are unspecified: decode rows rotate it as the kernel reads it.)
    EXPECT_LT(rel_error(outs[1], outs[0]), parse_kv_type(type) == KvType::F16 ? 3e-3 : 5e-3);
    // The same FP16 rounding as rope then store: equal up to the odd last-bit difference.
    EXPECT_LT(rel_error(outs[1], outs[2]), 1e-3);
  }
}

TEST(CudaAttentionCombine, FusedRopeStoreContiguous) {
  GYRE_SKIP_WITHOUT_GPU();
  std::mt19937 rng(780);
  const std::vector<int> steps = {37, 1, 1, 5, 90, 1};
  // Decode rows rotate and store inside the attention kernel by default: with one share at
  // these contexts, with every context split, and not at all (the separate rope_kv_store
  // launch). Rotations of 40 of 80 dims (neox: 20 pairs) keep the separate launch; group 10: two
  // query-head groups per KV head.
  const std::vector<std::vector<std::pair<const char*, std::string>>> modes = {
      {}, {{"GYRE_CUDA_ATTN_SINGLE", "0"}}, {{"GYRE_CUDA_ROPE_IN_ATTENTION", "0"}}};
  for (const auto& env : modes)
    for (const char* type : kTypes)
      for (const RopeCase& c :
           {RopeCase{{32, 8, 128}, 128, false, 1.0f}, RopeCase{{12, 4, 64}, 64, true, 1.2f},
            RopeCase{{6, 6, 80}, 40, false, 1.0f}, RopeCase{{8, 2, 96}, 64, true, 1.0f},
            RopeCase{{4, 2, 256}, 256, false, 1.0f}, RopeCase{{8, 4, 8}, 8, false, 1.0f},
            RopeCase{{10, 1, 64}, 48, false, 1.0f}})
        run_rope(type, c, steps, env, rng);
}

}  // namespace
}  // namespace gyre
