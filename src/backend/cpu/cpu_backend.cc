// The CPU backend. Activations and the KV cache are f32. F32/F16/BF16 weights are used in place
// from the model file (an aligned copy is made only when the file's data is misaligned for its
// element type). Quantized GGUF weights are dequantized once, at upload, to F32: this backend is
// the reference the GPU kernels are checked against, and F32 holds every dequantized value
// exactly (F16 would round the products of block scales and quants), at the price of 4 bytes per
// weight; the models it serves are small, or the GPU backend is the one to use. Weights already in
// Gyre's quantized layout (QPACKED, e.g. from GPTQ) are dequantized the same way.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_paged_attention.h"
#include "backend/cpu/qlinear_ref.h"
#include "backend/cpu/qmixed.h"
#include "backend/cpu/thread_pool.h"
#include "core/error.h"

namespace gyre {

namespace {

// Below this many multiply-adds a job runs on the calling thread: waking workers costs more.
constexpr int64_t kMinWorkPerChunk = 16 * 1024;

float* f32(const Tensor& t) {
  return static_cast<float*>(t.data);
}

void check_activation(const Tensor& t, const char* what) {
  GYRE_CHECK(t.dtype == DType::F32, "CPU backend: ", what, " must be an F32 activation, got ",
             dtype_name(t.dtype));
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  GYRE_CHECK(a.rows == b.rows && a.cols == b.cols, op, ": shapes [", a.rows, ", ", a.cols,
             "] and [", b.rows, ", ", b.cols, "] differ");
}

// A norm weight or bias: one F32 row of `cols` values.
void check_vector(const Tensor& w, int64_t cols, const char* op) {
  GYRE_CHECK(w.dtype == DType::F32 && w.rows == 1 && w.cols == cols, op,
             ": expected an F32 vector of ", cols, ", got ", dtype_name(w.dtype), " [", w.rows,
             ", ", w.cols, "]");
}

void rmsnorm_row(float* out, const float* x, const float* w, int64_t n, float eps) {
  float acc[8] = {};
  const int64_t full = n - n % 8;
  for (int64_t i = 0; i < full; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j] * x[i + j];
  double ss = 0;
  for (float a : acc) ss += a;
  for (int64_t i = full; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

class CpuBackend : public Backend {
 public:
  CpuBackend(int n_threads, KvType kv_type) : pool_(n_threads), kv_type_(kv_type) {}
  std::string name() const override { return "cpu (" + std::to_string(pool_.size()) + " threads)"; }

  Tensor alloc(int64_t rows, int64_t cols) override {
    GYRE_CHECK(rows >= 0 && cols >= 0, "cannot allocate a tensor of [", rows, ", ", cols, "]");
    GYRE_CHECK(cols == 0 || rows <= (int64_t{1} << 40) / cols, "tensor [", rows, ", ", cols,
               "] is too large");
    Tensor t;
    t.dtype = DType::F32;
    t.rows = rows;
    t.cols = cols;
    t.owner = alloc_aligned(static_cast<size_t>(rows * cols) * sizeof(float));
    t.data = t.owner.get();
    return t;
  }

  Tensor upload_weight(const TensorView& w) override;

  void to_host(const Tensor& t, float* dst) override {
    check_activation(t, "to_host source");
    std::memcpy(dst, t.data, static_cast<size_t>(t.rows * t.cols) * sizeof(float));
  }

  std::unique_ptr<KvCache> new_kv_cache(int n_layers, int n_kv_heads, int head_dim,
                                        int max_seq) override {
    return cpu_new_kv_cache(n_layers, n_kv_heads, head_dim, max_seq, kv_type_);
  }

  void embed(Tensor& out, const Tensor& table, const int32_t* tokens, int n) override {
    check_activation(out, "embed output");
    GYRE_CHECK(out.rows == n && out.cols == table.cols, "embed: output [", out.rows, ", ", out.cols,
               "] does not fit ", n, " tokens of ", table.cols);
    for (int i = 0; i < n; ++i) {
      GYRE_CHECK(tokens[i] >= 0 && tokens[i] < table.rows, "token id ", tokens[i],
                 " is outside the embedding table of ", table.rows);
      const auto* row = static_cast<const uint8_t*>(table.data) +
                        static_cast<size_t>(tokens[i]) * table.row_bytes();
      convert_row_to_f32(table.dtype, row, f32(out) + i * out.cols, out.cols);
    }
  }

  void rmsnorm(Tensor& out, const Tensor& x, const Tensor& w, float eps) override {
    check_activation(x, "rmsnorm input");
    check_activation(out, "rmsnorm output");
    check_same_shape(out, x, "rmsnorm");
    check_vector(w, x.cols, "rmsnorm weight");
    rows_parallel(x.rows, x.cols, [&](int64_t r) {
      rmsnorm_row(f32(out) + r * x.cols, f32(x) + r * x.cols, f32(w), x.cols, eps);
    });
  }

  void add_rmsnorm(Tensor& residual, Tensor& out, const Tensor& delta, const Tensor& w,
                   float eps) override {
    check_activation(residual, "residual");
    check_activation(out, "add_rmsnorm output");
    check_activation(delta, "add_rmsnorm delta");
    check_same_shape(residual, delta, "add_rmsnorm");
    check_same_shape(residual, out, "add_rmsnorm");
    check_vector(w, residual.cols, "rmsnorm weight");
    const int64_t c = residual.cols;
    rows_parallel(residual.rows, c, [&](int64_t r) {
      float* res = f32(residual) + r * c;
      const float* d = f32(delta) + r * c;
      for (int64_t i = 0; i < c; ++i) res[i] += d[i];
      rmsnorm_row(f32(out) + r * c, res, f32(w), c, eps);
    });
  }

  void matmul(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) override;
  void rope(Tensor& x, int n_heads, int head_dim, const int32_t* positions,
            const RopeTable& table) override {
    cpu_rope(pool_, x, n_heads, head_dim, positions, table);
  }
  void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, KvCache& cache,
                 int layer, int pos0, const AttentionParams& p) override {
    cpu_attention(pool_, out, q, k, v, cache, layer, pos0, p);
  }

  std::unique_ptr<PagedKvCache> new_paged_kv_cache(int n_layers, int n_kv_heads, int head_dim,
                                                   int num_pages, int page_size) override {
    return cpu_new_paged_kv_cache(n_layers, n_kv_heads, head_dim, num_pages, page_size, kv_type_);
  }
  void copy_kv_page(PagedKvCache& cache, int src, int dst, int num_tokens) override {
    cpu_copy_kv_page(cache, src, dst, num_tokens);
  }
  void attention_paged(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                       PagedKvCache& cache, int layer, const PagedBatch& batch,
                       const AttentionParams& p) override {
    cpu_attention_paged(pool_, out, q, k, v, cache, layer, batch, p);
  }

  void silu_mul(Tensor& out, const Tensor& gate, const Tensor& up) override {
    check_activation(out, "silu_mul output");
    check_activation(gate, "silu_mul gate");
    check_activation(up, "silu_mul up");
    check_same_shape(out, gate, "silu_mul");
    check_same_shape(out, up, "silu_mul");
    const int64_t c = out.cols;
    // out may alias gate: each element is read before it is written.
    rows_parallel(out.rows, c * 8, [&](int64_t r) {
      float* o = f32(out) + r * c;
      const float* g = f32(gate) + r * c;
      const float* u = f32(up) + r * c;
      for (int64_t i = 0; i < c; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    });
  }

  void add(Tensor& x, const Tensor& y) override {
    check_activation(x, "add destination");
    check_activation(y, "add source");
    check_same_shape(x, y, "add");
    const int64_t c = x.cols;
    rows_parallel(x.rows, c, [&](int64_t r) {
      float* a = f32(x) + r * c;
      const float* b = f32(y) + r * c;
      for (int64_t i = 0; i < c; ++i) a[i] += b[i];
    });
  }

 private:
  // fn(row) for every row, in parallel when rows * work_per_row is worth it.
  template <typename Fn>
  void rows_parallel(int64_t rows, int64_t work_per_row, Fn&& fn) {
    const int64_t grain =
        std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(work_per_row, 1));
    pool_.parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) fn(r);
    });
  }

  ThreadPool pool_;
  KvType kv_type_;
};

Tensor CpuBackend::upload_weight(const TensorView& w) {
  GYRE_CHECK(w.dtype != DType::I32, "tensor ", w.name, " is I32, not a weight");
  for (int64_t d : w.shape)
    GYRE_CHECK(d > 0, "tensor ", w.name, " has an empty shape ", shape_str(w.shape));
  Tensor t;
  t.rows = w.rows();
  t.cols = w.cols();
  // Gyre's own quantized layouts (GPTQ, `gyre convert`, mixes of two widths): F32 like GGUF.
  auto dequantized = [&](auto&& dequantize_row) {
    t.dtype = DType::F32;
    t.owner = alloc_aligned(static_cast<size_t>(t.rows * t.cols) * sizeof(float));
    t.data = t.owner.get();
    pool_.parallel_for(t.rows, std::max<int64_t>(1, kMinWorkPerChunk / t.cols),
                       [&](int64_t r0, int64_t r1) {
                         for (int64_t r = r0; r < r1; ++r) dequantize_row(r, f32(t) + r * t.cols);
                       });
    return t;
  };
  if (is_qmixed_view(w)) {
    const QMixedHost& m = qmixed_of_view(w);
    return dequantized([&](int64_t r, float* dst) { qmixed_dequantize_row(m, r, dst); });
  }
  if (w.dtype == DType::QPACKED) {
    const QWeightHost& q = qweight_of_view(w);
    return dequantized([&](int64_t r, float* dst) { qweight_dequantize_row(q, r, dst); });
  }
  const size_t row_bytes = dtype_row_bytes(w.dtype, t.cols);
  GYRE_CHECK(w.data != nullptr && w.nbytes == row_bytes * static_cast<size_t>(t.rows), "tensor ",
             w.name, " ", shape_str(w.shape), " of ", dtype_name(w.dtype), " has ", w.nbytes,
             " bytes, expected ", row_bytes * static_cast<size_t>(t.rows));
  const bool plain = w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16;
  const size_t elem = w.dtype == DType::F32 ? 4 : 2;
  // 1-D tensors (norms, biases) are tiny and the ops read them as f32: convert them.
  if (plain && w.shape.size() >= 2) {
    t.dtype = w.dtype;
    if (reinterpret_cast<uintptr_t>(w.data) % elem == 0) {
      t.data = const_cast<void*>(w.data);  // in place; the WeightSet keeps the file mapped
    } else {
      t.owner = alloc_aligned(w.nbytes);
      std::memcpy(t.owner.get(), w.data, w.nbytes);
      t.data = t.owner.get();
    }
    return t;
  }
  t.dtype = DType::F32;
  t.owner = alloc_aligned(static_cast<size_t>(t.rows * t.cols) * sizeof(float));
  t.data = t.owner.get();
  pool_.parallel_for(
      t.rows, std::max<int64_t>(1, kMinWorkPerChunk / t.cols), [&](int64_t r0, int64_t r1) {
        std::vector<uint8_t> aligned_row(row_bytes);
        for (int64_t r = r0; r < r1; ++r) {
          // A copy of the row keeps every block read aligned, whatever the file offset.
          std::memcpy(aligned_row.data(), static_cast<const uint8_t*>(w.data) + r * row_bytes,
                      row_bytes);
          dequantize_row(w.dtype, aligned_row.data(), f32(t) + r * t.cols, t.cols);
        }
      });
  return t;
}

void CpuBackend::matmul(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) {
  check_activation(x, "matmul input");
  check_activation(out, "matmul output");
  GYRE_CHECK(x.cols == w.cols && out.rows == x.rows && out.cols == w.rows, "matmul: [", x.rows,
             ", ", x.cols, "] x [", w.rows, ", ", w.cols, "]^T does not fit output [", out.rows,
             ", ", out.cols, "]");
  if (bias) check_vector(*bias, w.rows, "matmul bias");
  const int64_t n = x.rows, cols = x.cols;
  const int64_t grain = std::max<int64_t>(2, kMinWorkPerChunk / std::max<int64_t>(n * cols, 1));
  pool_.parallel_for(w.rows, grain, [&](int64_t o0, int64_t o1) {
    matmul_rows(f32(out), out.cols, f32(x), n, w.data, w.dtype, cols, o0, o1);
    if (!bias) return;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = o0; o < o1; ++o) f32(out)[t * out.cols + o] += f32(*bias)[o];
  });
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads, KvType kv_type) {
  return std::make_unique<CpuBackend>(n_threads, kv_type);
}

}  // namespace gyre
