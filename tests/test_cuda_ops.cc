// Every CUDA op against the CPU backend (the reference implementation) on random inputs of
// awkward sizes, at FP16 tolerances, and a whole stories260K forward: identical greedy tokens
// for 64 steps vs the CPU backend and the llama2.c golden. Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend_test_util.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "engine/transformer.h"
#include "model/config.h"
#include "model/safetensors.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gyre {
namespace {

using btest::host;

using ctest::cuda_backend;

using btest::random_f16;

using btest::Pair;

using btest::upload_pair;

using btest::rel_error;

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    GYRE_SKIP_WITHOUT_GPU();
    cpu = make_cpu_backend(2);
    gpu = cuda_backend();
  }
  void expect_close(const Pair& p, double tol, const char* what) {
    const std::vector<float> g = host(*gpu, p.gpu), c = host(*cpu, p.cpu);
    EXPECT_LT(rel_error(g, c), tol) << what << ": gpu[0..2] " << g[0] << " " << g[1] << " " << g[2]
                                    << ", cpu " << c[0] << " " << c[1] << " " << c[2];
  }
  std::unique_ptr<Backend> cpu, gpu;
  std::mt19937 rng{1234};
};

TEST_F(CudaOps, EmbedGathersRows) {
  const int vocab = 37, dim = 29, n = 11;
  Pair table = upload_pair(*cpu, *gpu, random_f16(vocab * dim, rng), vocab, dim);
  std::vector<int32_t> tokens = {0, 36, 5, 5, 17, 1, 2, 30, 29, 11, 36};
  Pair out{cpu->alloc(n, dim), gpu->alloc(n, dim)};
  cpu->embed(out.cpu, table.cpu, tokens.data(), n);
  gpu->embed(out.gpu, table.gpu, tokens.data(), n);
  expect_close(out, 1e-6, "embed");
}

TEST_F(CudaOps, RmsNormAndResidualAdd) {
  for (int cols : {8, 173, 4096, 20000}) {
    const int rows = 5;
    Pair x = upload_pair(*cpu, *gpu, random_f16(rows * cols, rng, 3.0f), rows, cols);
    Pair d = upload_pair(*cpu, *gpu, random_f16(rows * cols, rng), rows, cols);
    Pair w = upload_pair(*cpu, *gpu, random_f16(cols, rng), 1, cols);
    Pair out{cpu->alloc(rows, cols), gpu->alloc(rows, cols)};
    cpu->rmsnorm(out.cpu, x.cpu, w.cpu, 1e-5f);
    gpu->rmsnorm(out.gpu, x.gpu, w.gpu, 1e-5f);
    expect_close(out, 2e-3, "rmsnorm");
    cpu->add_rmsnorm(x.cpu, out.cpu, d.cpu, w.cpu, 1e-5f);
    gpu->add_rmsnorm(x.gpu, out.gpu, d.gpu, w.gpu, 1e-5f);
    expect_close(x, 2e-3, "add_rmsnorm residual");
    expect_close(out, 3e-3, "add_rmsnorm output");
  }
}

TEST_F(CudaOps, MatmulGemvAndGemmWithBias) {
  for (int n : {1, 3, 8, 9, 37}) {
    for (int in : {64, 172, 200, 1024, 2056}) {
      // 2056 takes the GEMV paths with several warps per row (few rows: 4, 2100 rows: 2).
      const int out_dim = in == 2056 && n == 3 ? 2100 : (n % 2 ? 33 : 100);
      Pair x = upload_pair(*cpu, *gpu, random_f16(n * in, rng), n, in);
      Pair w = upload_pair(*cpu, *gpu, random_f16(out_dim * in, rng, 0.1f), out_dim, in);
      Pair b = upload_pair(*cpu, *gpu, random_f16(out_dim, rng), 1, out_dim);
      Pair out{cpu->alloc(n, out_dim), gpu->alloc(n, out_dim)};
      const bool with_bias = in != 64;
      cpu->matmul(out.cpu, x.cpu, w.cpu, with_bias ? &b.cpu : nullptr);
      gpu->matmul(out.gpu, x.gpu, w.gpu, with_bias ? &b.gpu : nullptr);
      expect_close(out, 2e-3,
                   ("matmul n=" + std::to_string(n) + " in=" + std::to_string(in)).c_str());
    }
  }
}

TEST_F(CudaOps, RopeVariants) {
  const int n = 7, heads = 3;
  struct Case {
    int head_dim, rot_dim;
    bool interleaved;
    float attn_factor;
  };
  for (const Case& c : {Case{8, 8, false, 1.0f}, Case{64, 64, true, 1.0f},
                        Case{80, 32, false, 1.2f}, Case{128, 64, true, 0.9f}}) {
    RopeTable table;
    table.rot_dim = c.rot_dim;
    table.interleaved = c.interleaved;
    table.attn_factor = c.attn_factor;
    for (int i = 0; i < c.rot_dim / 2; ++i)
      table.inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / c.rot_dim)));
    std::vector<int32_t> pos = {0, 1, 2, 100, 4095, 31000, 7};
    Pair x =
        upload_pair(*cpu, *gpu, random_f16(n * heads * c.head_dim, rng), n, heads * c.head_dim);
    cpu->rope(x.cpu, heads, c.head_dim, pos.data(), table);
    gpu->rope(x.gpu, heads, c.head_dim, pos.data(), table);
    expect_close(x, 2e-3, "rope");
    // q and k in one launch (GQA: k has fewer heads) vs the CPU's two rope calls.
    const int kv_heads = 2;
    Pair q =
        upload_pair(*cpu, *gpu, random_f16(n * heads * c.head_dim, rng), n, heads * c.head_dim);
    Pair k = upload_pair(*cpu, *gpu, random_f16(n * kv_heads * c.head_dim, rng), n,
                         kv_heads * c.head_dim);
    cpu->rope(q.cpu, heads, c.head_dim, pos.data(), table);
    cpu->rope(k.cpu, kv_heads, c.head_dim, pos.data(), table);
    gpu->rope_qk(q.gpu, heads, k.gpu, kv_heads, c.head_dim, pos.data(), table);
    expect_close(q, 2e-3, "rope_qk q");
    expect_close(k, 2e-3, "rope_qk k");
  }
}

TEST_F(CudaOps, SiluMulAndAdd) {
  const int rows = 3, cols = 1001;
  Pair g = upload_pair(*cpu, *gpu, random_f16(rows * cols, rng, 4.0f), rows, cols);
  Pair u = upload_pair(*cpu, *gpu, random_f16(rows * cols, rng), rows, cols);
  Pair out{cpu->alloc(rows, cols), gpu->alloc(rows, cols)};
  cpu->silu_mul(out.cpu, g.cpu, u.cpu);
  gpu->silu_mul(out.gpu, g.gpu, u.gpu);
  expect_close(out, 2e-3, "silu_mul");
  cpu->add(out.cpu, u.cpu);
  gpu->add(out.gpu, u.gpu);
  expect_close(out, 2e-3, "add");
}

// Prefill then single-token steps, through the split (flash-decoding) path at longer contexts.
TEST_F(CudaOps, AttentionPrefillAndDecode) {
  struct Case {
    int heads, kv_heads, head_dim, window, prefill;
  };
  for (const Case& c : {Case{8, 4, 8, 0, 37}, Case{4, 4, 80, 0, 300}, Case{32, 8, 128, 0, 700},
                        Case{6, 2, 64, 50, 130}, Case{20, 2, 96, 0, 129}}) {
    const int max_seq = 1024, layer = 1;
    auto cache_cpu = cpu->new_kv_cache(2, c.kv_heads, c.head_dim, max_seq);
    auto cache_gpu = gpu->new_kv_cache(2, c.kv_heads, c.head_dim, max_seq);
    AttentionParams p;
    p.n_heads = c.heads;
    p.n_kv_heads = c.kv_heads;
    p.head_dim = c.head_dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    p.sliding_window = c.window;
    int pos = 0;
    for (int n : {c.prefill, 1, 1, 3, 20}) {  // 20: a second prefill chunk at pos0 > 0
      const int qd = c.heads * c.head_dim, kd = c.kv_heads * c.head_dim;
      Pair q = upload_pair(*cpu, *gpu, random_f16(n * qd, rng, 2.0f), n, qd);
      Pair k = upload_pair(*cpu, *gpu, random_f16(n * kd, rng, 2.0f), n, kd);
      Pair v = upload_pair(*cpu, *gpu, random_f16(n * kd, rng), n, kd);
      Pair out{cpu->alloc(n, qd), gpu->alloc(n, qd)};
      cpu->attention(out.cpu, q.cpu, k.cpu, v.cpu, *cache_cpu, layer, pos, p);
      gpu->attention(out.gpu, q.gpu, k.gpu, v.gpu, *cache_gpu, layer, pos, p);
      expect_close(out, 5e-3,
                   ("attention heads " + std::to_string(c.heads) + "/" +
                    std::to_string(c.kv_heads) + " dim " + std::to_string(c.head_dim) + " n " +
                    std::to_string(n) + " pos " + std::to_string(pos))
                       .c_str());
      pos += n;
    }
  }
}

// GGUF blocks of random bytes with a sane f16 scale in front: valid Q4_0 (18-byte) or Q8_0
// (34-byte) blocks whatever the nibble layout. The CPU backend dequantizes them at upload (the
// oracle), the CUDA backend repacks them for qlinear's GEMV (n <= 8) and GEMM.
std::vector<uint8_t> random_blocks(DType t, int rows, int cols, std::mt19937& rng) {
  const int block_bytes = dtype_info(t).block_bytes;
  std::vector<uint8_t> data(dtype_row_bytes(t, cols) * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : data) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.001f, 0.01f);
  for (size_t i = 0; i < data.size(); i += block_bytes) {
    const uint16_t d = f32_to_f16(scale(rng));
    std::memcpy(&data[i], &d, 2);
  }
  return data;
}

TEST_F(CudaOps, QuantizedGgufMatmul) {
  for (DType t : {DType::Q4_0, DType::Q8_0}) {
    const int rows = 96, cols = 512;
    const std::vector<uint8_t> blocks = random_blocks(t, rows, cols, rng);
    TensorView w;
    w.name = "model.layers.0.mlp.up_proj.weight";
    w.dtype = t;
    w.shape = {rows, cols};
    w.data = blocks.data();
    w.nbytes = blocks.size();
    Pair wp{cpu->upload_weight(w), gpu->upload_weight(w)};
    for (int n : {1, 5, 37, 70}) {  // 70: dequantized weight + cuBLAS
      Pair x = upload_pair(*cpu, *gpu, random_f16(n * cols, rng), n, cols);
      Pair out{cpu->alloc(n, rows), gpu->alloc(n, rows)};
      cpu->matmul(out.cpu, x.cpu, wp.cpu, nullptr);
      gpu->matmul(out.gpu, x.gpu, wp.gpu, nullptr);
      expect_close(out, 3e-3, (std::string(dtype_name(t)) + " n=" + std::to_string(n)).c_str());
    }
  }
}

// --bits 8: F32 weights requantized at upload (group 32); the error is the 8-bit rounding.
TEST_F(CudaOps, RequantizedEightBitMatmul) {
#ifdef GYRE_HAVE_CUDA
  BackendOptions o;
  o.weight_bits = 8;
  o.group_size = 32;
  auto q8 = make_cuda_backend(0, o);
  const int rows = 80, cols = 256, n = 3;
  auto wv = std::make_shared<std::vector<float>>(random_f16(rows * cols, rng, 0.1f));
  TensorView w;
  w.name = "model.layers.0.self_attn.o_proj.weight";
  w.dtype = DType::F32;
  w.shape = {rows, cols};
  w.data = wv->data();
  w.nbytes = wv->size() * sizeof(float);
  Tensor wc = cpu->upload_weight(w), wg = q8->upload_weight(w);
  auto xv = random_f16(n * cols, rng);
  Pair x{cpu->upload_weight({"x", DType::F32, {n, cols}, xv.data(), xv.size() * 4}),
         q8->upload_weight({"x", DType::F32, {n, cols}, xv.data(), xv.size() * 4}), nullptr};
  Tensor oc = cpu->alloc(n, rows), og = q8->alloc(n, rows);
  cpu->matmul(oc, x.cpu, wc, nullptr);
  q8->matmul(og, x.gpu, wg, nullptr);
  EXPECT_LT(rel_error(host(*q8, og), host(*cpu, oc)), 1e-2);
#endif
}

TEST_F(CudaOps, OutOfMemoryIsAClearError) {
  try {
    gpu->new_kv_cache(1000, 64, 128, 1 << 20);
    FAIL() << "allocation of ~32 TB succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MiB needed"), std::string::npos) << e.what();
  }
}

std::vector<int> greedy(Transformer& t, int first, int steps) {
  std::vector<float> logits(static_cast<size_t>(t.config().vocab_size));
  std::vector<int> out;
  int token = first;
  for (int pos = 0; pos < steps; ++pos) {
    t.forward(&token, 1, pos, logits.data(), false);
    token = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(token);
  }
  return out;
}

TEST(CudaForward, Stories260KGreedyMatchesCpuAndGolden) {
  GYRE_SKIP_WITHOUT_GPU();
  const std::string dir = std::string(GYRE_FIXTURES) + "/stories260K";
  nlohmann::json config_json, golden;
  std::ifstream(dir + "/config.json") >> config_json;
  std::ifstream(dir + "/golden.json") >> golden;
  const ModelConfig config = config_from_hf_json(config_json, nullptr);
  WeightSet weights;
  safetensors_load(dir + "/model.safetensors", weights);
  auto cpu = make_cpu_backend(2);
  auto gpu = cuda_backend();
  Transformer tc(config, weights, *cpu, 128), tg(config, weights, *gpu, 128);
  constexpr int kSteps = 64;
  const std::vector<int> expect_cpu = greedy(tc, 1, kSteps);
  const std::vector<int> got = greedy(tg, 1, kSteps);  // steps 2.. replay a CUDA graph
  EXPECT_EQ(got, expect_cpu);
  const std::vector<int> gold = golden["cases"][0]["generated_ids"].get<std::vector<int>>();
  ASSERT_GE(gold.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(got, std::vector<int>(gold.begin(), gold.begin() + kSteps));

  // Two models decoding in turn on one backend: neither may replay the other's recorded step.
  Transformer ta(config, weights, *gpu, 64), tb(config, weights, *gpu, 64);
  std::vector<float> la(512), lb(512);
  int token_a = 1, token_b = 1;
  for (int pos = 0; pos < 16; ++pos) {
    ta.forward(&token_a, 1, pos, la.data(), false);
    tb.forward(&token_b, 1, pos, lb.data(), false);
    token_a = static_cast<int>(std::max_element(la.begin(), la.end()) - la.begin());
    token_b = static_cast<int>(std::max_element(lb.begin(), lb.end()) - lb.begin());
    ASSERT_EQ(token_a, expect_cpu[static_cast<size_t>(pos)]) << "step " << pos;
    ASSERT_EQ(token_b, expect_cpu[static_cast<size_t>(pos)]) << "step " << pos;
  }

  // A prompt prefill through cuBLAS (n > 8) then decode must give the CPU's logits too.
  std::vector<int32_t> prompt(20);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(got[i]);
  std::vector<float> lc(prompt.size() * 512), lg(prompt.size() * 512);
  tc.forward(prompt.data(), 20, 0, lc.data(), true);
  tg.forward(prompt.data(), 20, 0, lg.data(), true);
  EXPECT_LT(rel_error(lg, lc), 1e-2);
}

}  // namespace
}  // namespace gyre
