// The CUDA decode attention block (attention_decode.cuh: head dims % 8 == 0 up to 128, one to
// eight query heads per KV head) against the CPU backend, the reference, with the same cache
// type (f16, q8, q4): key counts 1, 31, 129 (one past a 128-key chunk), 4097, sliding windows,
// MHA, GQA 4 and 8, a group of 10 (two blocks per KV head) and several decode rows at once.
// Inputs are FP16-exact, so both backends store identical rows. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

using btest::random_f16;

using ctest::cuda_backend;

using btest::Pair;
using btest::rel_error;

using btest::upload_pair;

struct Case {
  int heads, kv_heads, head_dim, window;
  std::vector<int> steps;  // tokens per call; calls of < 16 tokens take the decode block
};

void run_case(const char* type, const Case& c, std::mt19937& rng) {
  auto cpu = make_cpu_backend(2, parse_kv_type(type));
  auto gpu = cuda_backend(type);
  int total = 0;
  for (int n : c.steps) total += n;
  auto cache_cpu = cpu->new_kv_cache(1, c.kv_heads, c.head_dim, total);
  auto cache_gpu = gpu->new_kv_cache(1, c.kv_heads, c.head_dim, total);
  AttentionParams p;
  p.n_heads = c.heads;
  p.n_kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.sliding_window = c.window;
  int pos = 0;
  for (int n : c.steps) {
    const int qd = c.heads * c.head_dim, kd = c.kv_heads * c.head_dim;
    Pair q = upload_pair(*cpu, *gpu, random_f16(size_t(n) * qd, rng), n, qd);
    Pair k = upload_pair(*cpu, *gpu, random_f16(size_t(n) * kd, rng), n, kd);
    Pair v = upload_pair(*cpu, *gpu, random_f16(size_t(n) * kd, rng), n, kd);
    Pair out{cpu->alloc(n, qd), gpu->alloc(n, qd), nullptr};
    cpu->attention(out.cpu, q.cpu, k.cpu, v.cpu, *cache_cpu, 0, pos, p);
    gpu->attention(out.gpu, q.gpu, k.gpu, v.gpu, *cache_gpu, 0, pos, p);
    EXPECT_LT(rel_error(*cpu, *gpu, out), 5e-3)
        << type << " heads " << c.heads << "/" << c.kv_heads << " dim " << c.head_dim << " window "
        << c.window << " n " << n << " keys " << pos + n;
    pos += n;
  }
}

TEST(CudaDecodeAttention, AwkwardKeyCountsAllCacheTypes) {
  GYRE_SKIP_WITHOUT_GPU();
  std::mt19937 rng(4242);
  // Steps: 1 key; 31 keys; 129 keys (prefill 98, flash); then decode rows of 1 and 3.
  const std::vector<int> steps = {1, 30, 98, 1, 3};
  for (const char* type : {"f16", "q8", "q4"})
    for (const Case& c :
         {Case{32, 32, 128, 0, steps}, Case{32, 8, 128, 0, steps}, Case{8, 8, 64, 0, steps},
          Case{4, 4, 80, 0, steps}, Case{12, 4, 96, 50, steps}, Case{64, 8, 128, 0, steps},
          Case{20, 2, 96, 0, steps}, Case{6, 2, 40, 17, steps}})
      run_case(type, c, rng);
}

TEST(CudaDecodeAttention, LongContextGqa) {
  GYRE_SKIP_WITHOUT_GPU();
  std::mt19937 rng(4343);
  // The CPU reference fills the cache by a causal prefill (quadratic): few heads keep it ~5 s.
  run_case("f16", Case{2, 1, 64, 0, {4096, 1}}, rng);     // 4097 keys, 2 heads on one KV head
  run_case("q4", Case{2, 2, 128, 1000, {2048, 1}}, rng);  // window inside a long context
}

}  // namespace
}  // namespace gyre
