#include "quant/rotate.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "core/error.h"
#include "core/half.h"
#include "quant/block_forward.h"

namespace gyre::quant {

namespace {

// A dense float64 matrix, row-major.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  double& at(int64_t r, int64_t c) { return v[static_cast<size_t>(r * cols + c)]; }
  double at(int64_t r, int64_t c) const { return v[static_cast<size_t>(r * cols + c)]; }
};

Mat mat_of(const TensorView& t) {
  const std::vector<float> f = tensor_to_f32(t);
  Mat m{t.rows(), t.cols(), std::vector<double>(f.begin(), f.end())};
  return m;
}

// a [n, k] times b [k, m].
Mat matmul(const Mat& a, const Mat& b) {
  GYRE_CHECK(a.cols == b.rows, "internal: rotation shapes differ");
  Mat out{a.rows, b.cols, std::vector<double>(static_cast<size_t>(a.rows * b.cols), 0.0)};
  for (int64_t i = 0; i < a.rows; ++i) {
    double* o = out.v.data() + i * b.cols;
    for (int64_t k = 0; k < a.cols; ++k) {
      const double s = a.at(i, k);
      const double* br = b.v.data() + k * b.cols;
      for (int64_t j = 0; j < b.cols; ++j) o[j] += s * br[j];
    }
  }
  return out;
}

Mat transpose(const Mat& a) {
  Mat t{a.cols, a.rows, std::vector<double>(a.v.size())};
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < a.cols; ++j) t.at(j, i) = a.at(i, j);
  return t;
}

// Columns scaled: W diag(g).
void scale_cols(Mat& w, const std::vector<float>& g) {
  GYRE_CHECK(static_cast<int64_t>(g.size()) == w.cols, "internal: norm width differs");
  for (int64_t i = 0; i < w.rows; ++i)
    for (int64_t j = 0; j < w.cols; ++j) w.at(i, j) *= g[static_cast<size_t>(j)];
}

class Builder {
 public:
  Builder(WeightSet& out, DType dtype) : out_(out), dtype_(dtype) {}
  void add(const std::string& name, const Mat& m, std::vector<int64_t> shape, DType dtype) {
    auto buf = std::make_shared<std::vector<uint8_t>>();
    const size_t n = m.v.size();
    if (dtype == DType::F16) {
      buf->resize(n * 2);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(static_cast<float>(m.v[i]));
        std::memcpy(buf->data() + 2 * i, &h, 2);
      }
    } else {
      buf->resize(n * 4);
      for (size_t i = 0; i < n; ++i) {
        const float f = static_cast<float>(m.v[i]);
        std::memcpy(buf->data() + 4 * i, &f, 4);
      }
    }
    TensorView t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data = buf->data();
    t.nbytes = buf->size();
    out_.keep(buf);
    out_.add(t);
  }
  void add(const std::string& name, const Mat& m) {
    add(name, m, m.rows == 1 ? std::vector<int64_t>{m.cols} : std::vector<int64_t>{m.rows, m.cols},
        dtype_);
  }

 private:
  WeightSet& out_;
  DType dtype_;
};

}  // namespace

std::vector<double> random_orthogonal(int n, uint64_t seed) {
  GYRE_CHECK(n > 0, "internal: rotation size must be positive");
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  // Rows of a Gaussian matrix, orthonormalized (modified Gram-Schmidt, twice for accuracy).
  // Orthonormalizing Gaussian vectors in order is QR with a positive-diagonal R, which gives a
  // Haar-distributed orthogonal matrix.
  std::vector<double> q(static_cast<size_t>(n) * n);
  for (double& x : q) x = normal(rng);
  for (int i = 0; i < n; ++i) {
    double* r = q.data() + static_cast<size_t>(i) * n;
    for (int pass = 0; pass < 2; ++pass)
      for (int j = 0; j < i; ++j) {
        const double* p = q.data() + static_cast<size_t>(j) * n;
        double d = 0;
        for (int k = 0; k < n; ++k) d += r[k] * p[k];
        for (int k = 0; k < n; ++k) r[k] -= d * p[k];
      }
    double norm = 0;
    for (int k = 0; k < n; ++k) norm += r[k] * r[k];
    norm = std::sqrt(norm);
    GYRE_CHECK(norm > 1e-12, "internal: degenerate random rotation");
    for (int k = 0; k < n; ++k) r[k] /= norm;
  }
  return q;
}

void rotate_model(LoadedModel& m, uint64_t seed, DType dtype) {
  GYRE_CHECK(dtype == DType::F16 || dtype == DType::F32, "internal: rotation dtype");
  const ModelConfig& c = m.config;
  GYRE_CHECK(c.n_heads % c.n_kv_heads == 0, "rotation: heads must be a multiple of KV heads");
  const Mat q{c.dim, c.dim, random_orthogonal(c.dim, seed)};
  const Mat qt = transpose(q);
  auto old = std::make_shared<WeightSet>(std::move(m.weights));
  WeightSet out;
  out.keep_owner(old);  // untouched tensors still point into the old files
  Builder put(out, dtype);
  const Mat ones{1, c.dim, std::vector<double>(static_cast<size_t>(c.dim), 1.0)};
  const std::vector<float> g_final = tensor_to_f32(old->get("model.norm.weight"));
  const bool own_head = !c.tie_embeddings && old->has("lm_head.weight");
  const TensorView& head = old->get(own_head ? "lm_head.weight" : "model.embed_tokens.weight");
  {
    Mat h = mat_of(head);
    scale_cols(h, g_final);
    put.add("lm_head.weight", matmul(h, q));
  }
  put.add("model.embed_tokens.weight", matmul(mat_of(old->get("model.embed_tokens.weight")), q));
  put.add("model.norm.weight", ones, {c.dim}, DType::F32);
  const int hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  for (int b = 0; b < c.n_layers; ++b) {
    auto name = [&](const char* s) { return layer_tensor(b, s); };
    const std::vector<float> g_in = tensor_to_f32(old->get(name("input_layernorm.weight")));
    const std::vector<float> g_post =
        tensor_to_f32(old->get(name("post_attention_layernorm.weight")));
    auto read_rotate = [&](const char* s, const std::vector<float>& g) {
      Mat w = mat_of(old->get(name(s)));
      scale_cols(w, g);
      return matmul(w, q);
    };
    // Per-KV-head value rotations R_h (block diagonal).
    std::vector<Mat> r;
    for (int h = 0; h < c.n_kv_heads; ++h)
      r.push_back({hd, hd,
                   random_orthogonal(hd, seed * 1000003u + static_cast<uint64_t>(b) * 64u +
                                             static_cast<uint64_t>(h) + 1u)});
    put.add(name("self_attn.q_proj.weight"), read_rotate("self_attn.q_proj.weight", g_in));
    put.add(name("self_attn.k_proj.weight"), read_rotate("self_attn.k_proj.weight", g_in));
    Mat v = read_rotate("self_attn.v_proj.weight", g_in), v2 = v;
    for (int h = 0; h < c.n_kv_heads; ++h)  // rows of head h: R^T W
      for (int a = 0; a < hd; ++a)
        for (int64_t col = 0; col < v.cols; ++col) {
          double s = 0;
          for (int k = 0; k < hd; ++k) s += r[h].at(k, a) * v.at(h * hd + k, col);
          v2.at(h * hd + a, col) = s;
        }
    put.add(name("self_attn.v_proj.weight"), v2);
    if (c.qkv_bias && old->has(name("self_attn.v_proj.bias"))) {
      const Mat bias = mat_of(old->get(name("self_attn.v_proj.bias")));
      Mat b2 = bias;
      for (int h = 0; h < c.n_kv_heads; ++h)
        for (int a = 0; a < hd; ++a) {
          double s = 0;
          for (int k = 0; k < hd; ++k) s += r[h].at(k, a) * bias.v[static_cast<size_t>(h * hd + k)];
          b2.v[static_cast<size_t>(h * hd + a)] = s;
        }
      put.add(name("self_attn.v_proj.bias"), b2, {c.kv_dim()}, DType::F32);
    }
    Mat o = mat_of(old->get(name("self_attn.o_proj.weight"))), o2 = o;
    for (int qh = 0; qh < c.n_heads; ++qh) {  // columns of query head qh: W R of its KV head
      const Mat& rh = r[qh / group];
      for (int64_t row = 0; row < o.rows; ++row)
        for (int a = 0; a < hd; ++a) {
          double s = 0;
          for (int k = 0; k < hd; ++k) s += o.at(row, qh * hd + k) * rh.at(k, a);
          o2.at(row, qh * hd + a) = s;
        }
    }
    put.add(name("self_attn.o_proj.weight"), matmul(qt, o2));
    put.add(name("mlp.gate_proj.weight"), read_rotate("mlp.gate_proj.weight", g_post));
    put.add(name("mlp.up_proj.weight"), read_rotate("mlp.up_proj.weight", g_post));
    put.add(name("mlp.down_proj.weight"),
            matmul(qt, mat_of(old->get(name("mlp.down_proj.weight")))));
    put.add(name("input_layernorm.weight"), ones, {c.dim}, DType::F32);
    put.add(name("post_attention_layernorm.weight"), ones, {c.dim}, DType::F32);
  }
  for (const auto& [n, t] : old->all())
    if (!out.has(n)) out.add(t);  // q/k biases and anything else the rotation leaves alone
  m.weights = std::move(out);
  m.config.tie_embeddings = false;
}

}  // namespace gyre::quant
