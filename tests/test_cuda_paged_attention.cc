// The CUDA backend's paged KV cache and batched attention against the CPU backend's (the
// reference, itself checked against float64 attention in test_cpu_paged_attention.cc), on random
// FP16-exact inputs: ragged steps mixing prefill chunks (tile kernel) and decode rows (split
// kernel), page sizes 16 and others, GQA ratios, head dims 8/64/80/96/128, sliding windows and
// contexts of several thousand positions; the same with q8/q4 caches against the CPU's q8/q4
// paged caches; copy_kv_page; and the Engine on the CUDA backend with stories260K against the
// single-sequence generators. Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
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
#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/transformer.h"
#include "model/loader.h"
#include "paged_batch_util.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gyre {
namespace {

using btest::host;
using btest::random_f16;

using ctest::cuda_backend;

// Random values already rounded to FP16, so both backends start from identical inputs.
using btest::Pair;
using btest::rel_error;

using btest::upload_pair;

struct Shape {
  int n_heads, n_kv_heads, head_dim, page_size, window;
};

// A sequence of the test: `history` positions already cached, then `rows` new ones this step.
struct Seq {
  int history, rows;
  std::vector<int32_t> pages;
};

// Runs the same steps on both backends and compares every output.
class PagedPair {
 public:
  PagedPair(Backend& cpu, Backend& gpu, const Shape& s, int layers, int num_pages)
      : cpu_(cpu), gpu_(gpu), s_(s) {
    kc_ = cpu.new_paged_kv_cache(layers, s.n_kv_heads, s.head_dim, num_pages, s.page_size);
    kg_ = gpu.new_paged_kv_cache(layers, s.n_kv_heads, s.head_dim, num_pages, s.page_size);
  }
  // Positions [first[i], first[i] + rows[i]) of each sequence, attended with `window`; returns
  // the relative error of the GPU output.
  double step(const std::vector<Seq>& seqs, const std::vector<int>& first,
              const std::vector<int>& rows, int layer, int window, uint64_t generation,
              std::mt19937& rng) {
    std::vector<std::vector<int32_t>> pages;
    for (const Seq& q : seqs) pages.push_back(q.pages);
    const HostPagedBatch hb(pages, first, rows, s_.page_size, generation);
    const PagedBatch& b = hb.batch;
    const int64_t n = b.rows, qc = int64_t{s_.n_heads} * s_.head_dim,
                  kvc = int64_t{s_.n_kv_heads} * s_.head_dim;
    Pair q = upload_pair(cpu_, gpu_, random_f16(size_t(n * qc), rng), n, qc);
    Pair k = upload_pair(cpu_, gpu_, random_f16(size_t(n * kvc), rng), n, kvc);
    Pair v = upload_pair(cpu_, gpu_, random_f16(size_t(n * kvc), rng), n, kvc);
    Tensor oc = cpu_.alloc(n, qc), og = gpu_.alloc(n, qc);
    AttentionParams p;
    p.n_heads = s_.n_heads;
    p.n_kv_heads = s_.n_kv_heads;
    p.head_dim = s_.head_dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(s_.head_dim));
    p.sliding_window = window;
    cpu_.attention_paged(oc, q.cpu, k.cpu, v.cpu, *kc_, layer, b, p);
    gpu_.attention_paged(og, q.gpu, k.gpu, v.gpu, *kg_, layer, b, p);
    return rel_error(host(gpu_, og), host(cpu_, oc));
  }
  PagedKvCache& cpu_cache() { return *kc_; }
  PagedKvCache& gpu_cache() { return *kg_; }

 private:
  Backend &cpu_, &gpu_;
  Shape s_;
  std::unique_ptr<PagedKvCache> kc_, kg_;
};

// Gives each sequence its pages, scattered over the pool.
int assign_pages(std::vector<Seq>& seqs, int page_size, std::mt19937& rng) {
  int total = 0;
  for (const Seq& q : seqs) total += (q.history + q.rows + page_size - 1) / page_size;
  std::vector<int32_t> pool(size_t(total + 7));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t at = 0;
  for (Seq& q : seqs)
    for (int i = 0; i < (q.history + q.rows + page_size - 1) / page_size; ++i)
      q.pages.push_back(pool[at++]);
  return static_cast<int>(pool.size());
}

// Fills every history (window 1 keeps the CPU reference cheap: the stores are what matter),
// then runs the ragged step at layers 1 and 0 with the shape's window.
// kv: the cache type of both backends; q8/q4 caches must have the same page size on both (one
// row format; the CUDA cache holds one scratch page more, for padded decode-graph rows), and the
// GPU rounds dequantized rows to FP16 for its tensor cores (kept in tolerance).
void run_case(const Shape& s, std::vector<Seq> seqs, uint32_t seed, const char* kv = "f16") {
  SCOPED_TRACE(std::string("cache ") + kv);
  std::mt19937 rng(seed);
  auto cpu = make_cpu_backend(2, parse_kv_type(kv));
  auto gpu = cuda_backend(kv);
  const int num_pages = assign_pages(seqs, s.page_size, rng);
  PagedPair pair(*cpu, *gpu, s, 2, num_pages);
  const bool quantized = parse_kv_type(kv) != KvType::F16;
  if (quantized) {
    EXPECT_EQ(pair.gpu_cache().bytes() * static_cast<size_t>(num_pages),
              pair.cpu_cache().bytes() * static_cast<size_t>(num_pages + 1));
  }
  const double tol = quantized ? 5e-3 : 3e-3;
  std::vector<int> zeros(seqs.size(), 0), hist, rows;
  for (const Seq& q : seqs) hist.push_back(q.history), rows.push_back(q.rows);
  for (int layer = 0; layer < 2; ++layer)
    EXPECT_LT(pair.step(seqs, zeros, hist, layer, 1, 10 + uint64_t(layer), rng), tol)
        << "history fill, layer " << layer;
  const double e1 = pair.step(seqs, hist, rows, 1, s.window, 20, rng);
  const double e0 = pair.step(seqs, hist, rows, 0, s.window, 20, rng);  // same generation
  EXPECT_LT(e1, tol) << "head_dim " << s.head_dim << " window " << s.window;
  EXPECT_LT(e0, tol) << "head_dim " << s.head_dim << " window " << s.window;
}

TEST(CudaPagedAttention, Llama8bShapeLongDecodesAndChunks) {
  GYRE_SKIP_WITHOUT_GPU();
  // Decode rows at 2.5k/4.1k/50 positions, a 77-row chunk after 300, a fresh 16-row chunk.
  run_case({32, 8, 128, 16, 0},
           {{2500, 1, {}}, {4100, 1, {}}, {50, 1, {}}, {300, 77, {}}, {0, 16, {}}}, 1);
}

TEST(CudaPagedAttention, HeadDim64OddPagesWindow) {
  GYRE_SKIP_WITHOUT_GPU();
  run_case({12, 4, 64, 7, 500},
           {{2000, 1, {}}, {3, 1, {}}, {1000, 130, {}}, {499, 1, {}}, {0, 40, {}}}, 2);
}

TEST(CudaPagedAttention, HeadDim80NoGqaPage32) {
  GYRE_SKIP_WITHOUT_GPU();
  run_case({10, 10, 80, 32, 0}, {{1500, 1, {}}, {33, 65, {}}, {0, 1, {}}, {700, 3, {}}}, 3);
}

TEST(CudaPagedAttention, HeadDim96AndWideGqa) {
  GYRE_SKIP_WITHOUT_GPU();
  run_case({32, 2, 96, 16, 0}, {{900, 1, {}}, {64, 64, {}}, {5, 20, {}}}, 4);
  run_case({32, 2, 64, 16, 256}, {{5000, 1, {}}, {200, 100, {}}}, 5);
}

TEST(CudaPagedAttention, GenericHeadDims) {
  GYRE_SKIP_WITHOUT_GPU();
  // stories260K's head_dim 8 and an odd one: the split kernel takes every row.
  run_case({8, 4, 8, 16, 0}, {{300, 1, {}}, {10, 50, {}}, {0, 3, {}}}, 6);
  run_case({6, 2, 13, 5, 9}, {{100, 1, {}}, {40, 30, {}}}, 7);
}

// q8/q4 paged caches: the store kernel quantizes, the tile and split kernels dequantize.
TEST(CudaPagedAttention, QuantizedLlama8bShape) {
  GYRE_SKIP_WITHOUT_GPU();
  for (const char* kv : {"q8", "q4"})
    run_case({32, 8, 128, 16, 0}, {{2500, 1, {}}, {50, 1, {}}, {300, 77, {}}, {0, 16, {}}}, 11, kv);
}

TEST(CudaPagedAttention, QuantizedAwkwardShapes) {
  GYRE_SKIP_WITHOUT_GPU();
  for (const char* kv : {"q8", "q4"}) {
    // Head dim 80 (a half block at the end of each row) with a window and odd pages; 40 with
    // wide GQA; 8 (one short block, split kernel only); 13 (odd: the scalar paths).
    run_case({10, 2, 80, 7, 300}, {{1200, 1, {}}, {3, 1, {}}, {400, 70, {}}, {0, 20, {}}}, 12, kv);
    run_case({16, 2, 40, 16, 0}, {{700, 1, {}}, {30, 33, {}}}, 13, kv);
    run_case({8, 4, 8, 16, 0}, {{300, 1, {}}, {10, 50, {}}, {0, 3, {}}}, 14, kv);
    run_case({6, 2, 13, 5, 9}, {{100, 1, {}}, {40, 30, {}}}, 15, kv);
  }
}

// Pages copied on both backends; a decode through the copies must match (codes and params
// copied).
void copy_then_attend(const char* kv) {
  SCOPED_TRACE(std::string("cache ") + kv);
  std::mt19937 rng(8);
  auto cpu = make_cpu_backend(2, parse_kv_type(kv));
  auto gpu = cuda_backend(kv);
  const Shape s{8, 2, 64, 16, 0};
  const double tol = parse_kv_type(kv) == KvType::F16 ? 3e-3 : 5e-3;
  PagedPair pair(*cpu, *gpu, s, 2, 12);
  // 20 positions in pages 3 and 7; then pages 3 -> 9 (16 tokens) and 7 -> 10 (4 tokens).
  std::vector<Seq> seqs{{0, 20, {3, 7}}};
  for (int layer = 0; layer < 2; ++layer)
    EXPECT_LT(pair.step(seqs, {0}, {20}, layer, 0, 1 + uint64_t(layer), rng), tol);
  for (Backend* b : {cpu.get(), gpu.get()}) {
    PagedKvCache& c = b == cpu.get() ? pair.cpu_cache() : pair.gpu_cache();
    b->copy_kv_page(c, 3, 9, 16);
    b->copy_kv_page(c, 7, 10, 4);
  }
  // The copies must hold the original keys: a decode through them matches the CPU.
  std::vector<Seq> copied{{20, 1, {9, 10}}};
  for (int layer = 0; layer < 2; ++layer)
    EXPECT_LT(pair.step(copied, {20}, {1}, layer, 0, 5, rng), tol) << "layer " << layer;
  EXPECT_THROW(gpu->copy_kv_page(pair.gpu_cache(), 3, 3, 4), Error);
  EXPECT_THROW(gpu->copy_kv_page(pair.gpu_cache(), 3, 12, 4), Error);
  EXPECT_THROW(gpu->copy_kv_page(pair.gpu_cache(), 3, 4, 17), Error);
}

TEST(CudaPagedAttention, CopyKvPageThenAttend) {
  GYRE_SKIP_WITHOUT_GPU();
  copy_then_attend("f16");
}

TEST(CudaPagedAttention, QuantizedCopyKvPageThenAttend) {
  GYRE_SKIP_WITHOUT_GPU();
  copy_then_attend("q8");
  copy_then_attend("q4");
}

TEST(CudaPagedAttention, RejectsBadPlans) {
  GYRE_SKIP_WITHOUT_GPU();
  auto gpu = cuda_backend();
  auto cache = gpu->new_paged_kv_cache(1, 1, 8, 4, 4);
  Tensor q = gpu->alloc(1, 8), o = gpu->alloc(1, 8);
  const int32_t pos = 2, start[2] = {0, 1}, ctx = 3, table = 9;  // page 9 of 4
  const int64_t slot = 9 * 4 + 2;
  PagedBatch b;
  b.rows = b.seqs = b.max_pages = 1;
  b.positions = &pos;
  b.slots = &slot;
  b.seq_starts = start;
  b.context_lens = &ctx;
  b.page_tables = &table;
  AttentionParams p{1, 1, 8, 0.3f, 0};
  EXPECT_THROW(gpu->attention_paged(o, q, q, q, *cache, 0, b, p), Error);
}

// ---- the Engine on the CUDA backend ----

std::string fixture(const std::string& rel) {
  return std::string(GYRE_FIXTURES) + "/" + rel;
}

struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> tokens;
  bool done = false;
  std::string error;
};

TEST(CudaPagedEngine, ConcurrentGreedyRequestsMatchSingleSequence) {
  GYRE_SKIP_WITHOUT_GPU();
  auto model = load_model(fixture("stories260K"));
  auto gpu = cuda_backend();
  auto cpu = make_cpu_backend(2);
  Transformer gpu_tf(model->config, model->weights, *gpu, 512);
  Transformer cpu_tf(model->config, model->weights, *cpu, 512);
  Generator gpu_gen(gpu_tf, *model->tokenizer), cpu_gen(cpu_tf, *model->tokenizer);

  const std::string shared =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "sun with her friends. One day,";
  const std::vector<std::string> texts = {"The little dog",     shared + " she",
                                          shared + " Ben",      "One day, a big cat",
                                          shared + " the sun",  "Lily and Ben went to the park",
                                          shared + " it was",   shared + " they saw",
                                          "Tim had a red ball", shared};
  GenerationSettings g;
  g.max_tokens = 40;
  g.sampler.temperature = 0.0f;
  g.stop_ids = {1};
  EngineConfig ec;
  ec.max_batch = 6;         // fewer slots than requests: some wait, then join running batches
  ec.max_step_tokens = 48;  // prompts are prefilled in chunks next to running decodes
  ec.max_seq_len = 256;
  std::vector<Collected> got(texts.size());
  {
    Engine engine(*model, *gpu, ec);
    for (size_t i = 0; i < texts.size(); ++i) {
      RequestOptions o;
      o.gen = g;
      Collected* c = &got[i];
      engine.submit(model->tokenizer->encode(texts[i], true), o, [c](const TokenEvent& e) {
        std::lock_guard<std::mutex> lock(c->mu);
        if (e.token >= 0) c->tokens.push_back(e.token);
        if (!e.error.empty()) c->error = e.error;
        c->done = e.done;
      });
    }
    engine.drain();
  }
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int> prompt = model->tokenizer->encode(texts[i], true);
    EXPECT_TRUE(got[i].done) << texts[i];
    EXPECT_EQ(got[i].error, "") << texts[i];
    EXPECT_EQ(got[i].tokens, gpu_gen.generate_ids(prompt, g).tokens)
        << "vs CUDA single sequence: " << texts[i];
    EXPECT_EQ(got[i].tokens, cpu_gen.generate_ids(prompt, g).tokens) << "vs CPU: " << texts[i];
  }
}

}  // namespace
}  // namespace gyre
