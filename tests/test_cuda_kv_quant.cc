// CUDA attention over q8/q4 KV caches (store kernel quantizes, the split decode kernel and the
// tensor-core prefill kernel dequantize on load) against the CPU backend with the same cache
// type, the reference. Inputs are FP16-exact, so both quantize identical values; the GPU rounds
// dequantized keys/values to FP16 for its tensor cores, hence FP16-level tolerances. Awkward
// sizes: head dims 8 (one short block), 13 (odd: scalar paths), 40 and 80 (a half block at the
// end), 128 with GQA 32/8 at long contexts (split decode), sliding windows. Skipped without GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/half.h"
#include "core/kv_quant.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include "backend_test_util.h"
#include "cuda_test_util.h"

namespace gyre {
namespace {

using ctest::cuda_backend;

std::vector<float> random_f16(size_t n, std::mt19937& rng, float scale, bool outliers) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    float x = u(rng);
    if (outliers && i % 13 == 5) x = 4.0f * scale + x;  // an offset channel, like real keys
    v[i] = f16_to_f32(f32_to_f16(x));
  }
  return v;
}

using btest::Pair;
using btest::rel_error;

using btest::upload_pair;

TEST(KvQuantCuda, AttentionPrefillAndDecodeMatchCpu) {
  GYRE_SKIP_WITHOUT_GPU();
  struct Case {
    int heads, kv_heads, head_dim, window, prefill;
  };
  std::mt19937 rng(99);
  for (const char* type : {"q8", "q4"}) {
    auto cpu = make_cpu_backend(2, parse_kv_type(type));
    auto gpu = cuda_backend(type);
    for (const Case& c :
         {Case{8, 4, 8, 0, 37}, Case{4, 2, 13, 0, 70}, Case{6, 2, 40, 0, 90},
          Case{4, 4, 80, 0, 300}, Case{32, 8, 128, 0, 700}, Case{6, 2, 64, 50, 130}}) {
      const int max_seq = 1024, layer = 1;
      auto cache_cpu = cpu->new_kv_cache(2, c.kv_heads, c.head_dim, max_seq);
      auto cache_gpu = gpu->new_kv_cache(2, c.kv_heads, c.head_dim, max_seq);
      EXPECT_EQ(cache_gpu->bytes(), cache_cpu->bytes());  // the same format on both
      AttentionParams p;
      p.n_heads = c.heads;
      p.n_kv_heads = c.kv_heads;
      p.head_dim = c.head_dim;
      p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      p.sliding_window = c.window;
      int pos = 0;
      for (int n : {c.prefill, 1, 1, 3, 70}) {  // 70: a second prefill chunk at pos0 > 0
        const int qd = c.heads * c.head_dim, kd = c.kv_heads * c.head_dim;
        Pair q = upload_pair(*cpu, *gpu, random_f16(size_t(n) * qd, rng, 1.0f, false), n, qd);
        Pair k = upload_pair(*cpu, *gpu, random_f16(size_t(n) * kd, rng, 1.0f, true), n, kd);
        Pair v = upload_pair(*cpu, *gpu, random_f16(size_t(n) * kd, rng, 1.0f, false), n, kd);
        Pair out{cpu->alloc(n, qd), gpu->alloc(n, qd), nullptr};
        cpu->attention(out.cpu, q.cpu, k.cpu, v.cpu, *cache_cpu, layer, pos, p);
        gpu->attention(out.gpu, q.gpu, k.gpu, v.gpu, *cache_gpu, layer, pos, p);
        EXPECT_LT(rel_error(*cpu, *gpu, out), 5e-3)
            << type << " heads " << c.heads << "/" << c.kv_heads << " dim " << c.head_dim << " n "
            << n << " pos " << pos;
        pos += n;
      }
    }
  }
}

}  // namespace
}  // namespace gyre
