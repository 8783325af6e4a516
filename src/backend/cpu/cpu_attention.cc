#include "backend/cpu/cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_kv_rows.h"
#include "core/error.h"

namespace gyre {

namespace {

// Below this many multiply-adds a job runs on the calling thread.
constexpr int64_t kMinWorkPerChunk = 16 * 1024;

class CpuKvCache : public KvCache {
 public:
  CpuKvCache(int n_layers, int n_kv_heads, int head_dim, int max_seq, KvType type)
      : n_layers(n_layers),
        n_kv_heads(n_kv_heads),
        head_dim(head_dim),
        max_seq_(max_seq),
        rows(type, head_dim, checked_rows(n_layers, n_kv_heads, head_dim, max_seq)) {
    filled.assign(static_cast<size_t>(n_layers), 0);
  }
  int max_seq() const override { return max_seq_; }
  size_t bytes() const override { return rows.bytes(); }

  // Layout: [layer][k, v][kv head][position] rows, so one head's keys are consecutive rows.
  size_t key(int layer, int head, int pos) const { return at(layer, 0, head, pos); }
  size_t value(int layer, int head, int pos) const { return at(layer, 1, head, pos); }

  const int n_layers, n_kv_heads, head_dim;

 private:
  static size_t checked_rows(int n_layers, int n_kv_heads, int head_dim, int max_seq) {
    GYRE_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && max_seq > 0,
               "KV cache sizes must be positive, got ", n_layers, " layers, ", n_kv_heads,
               " heads of ", head_dim, ", ", max_seq, " positions");
    return 2 * static_cast<size_t>(n_layers) * static_cast<size_t>(n_kv_heads) *
           static_cast<size_t>(max_seq);
  }
  size_t at(int layer, int kv, int head, int pos) const {
    const size_t plane = (static_cast<size_t>(layer) * 2 + static_cast<size_t>(kv)) *
                             static_cast<size_t>(n_kv_heads) +
                         static_cast<size_t>(head);
    return plane * static_cast<size_t>(max_seq_) + static_cast<size_t>(pos);
  }
  int max_seq_;

 public:
  CpuKvRows rows;
  std::vector<int> filled;  // positions 0..filled-1 of each layer hold keys and values
};

float* f32(const Tensor& t) {
  return static_cast<float*>(t.data);
}

// One query head against cache positions [first, last] of one KV head.
void attend_one(float* out, const float* q, CpuKvCache& c, int layer, int kv_head, int first,
                int last, float scale) {
  const int hd = c.head_dim;
  const int span = last - first + 1;
  float* scores = thread_buffer(static_cast<size_t>(span)).data();
  float* row = kv_row_scratch(hd);
  float max_score = -INFINITY;
  for (int j = 0; j < span; ++j) {
    scores[j] = dot_f32(q, c.rows.load(c.key(layer, kv_head, first + j), row), hd) * scale;
    max_score = std::max(max_score, scores[j]);
  }
  double denom = 0;  // a long sum of positive terms: double keeps it exact enough at any length
  for (int j = 0; j < span; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    denom += scores[j];
  }
  for (int d = 0; d < hd; ++d) out[d] = 0.0f;
  for (int j = 0; j < span; ++j) {
    const float* v = c.rows.load(c.value(layer, kv_head, first + j), row);
    const float pj = scores[j];
    for (int d = 0; d < hd; ++d) out[d] += pj * v[d];
  }
  const float inv = static_cast<float>(1.0 / denom);
  for (int d = 0; d < hd; ++d) out[d] *= inv;
}

}  // namespace

std::unique_ptr<KvCache> cpu_new_kv_cache(int n_layers, int n_kv_heads, int head_dim, int max_seq,
                                          KvType type) {
  return std::make_unique<CpuKvCache>(n_layers, n_kv_heads, head_dim, max_seq, type);
}

void cpu_rope(ThreadPool& pool, Tensor& x, int n_heads, int head_dim, const int32_t* positions,
              const RopeTable& table) {
  const int rot = table.rot_dim;
  GYRE_CHECK(x.dtype == DType::F32 && n_heads > 0 && head_dim > 0 &&
                 x.cols == static_cast<int64_t>(n_heads) * head_dim,
             "rope: input [", x.rows, ", ", x.cols, "] is not ", n_heads, " heads of ", head_dim);
  GYRE_CHECK(rot > 0 && rot % 2 == 0 && rot <= head_dim &&
                 table.inv_freq.size() == static_cast<size_t>(rot / 2),
             "rope: rot_dim ", rot, " with ", table.inv_freq.size(),
             " frequencies does not fit a head of ", head_dim);
  const int half = rot / 2;
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerChunk / (x.cols * 4));
  pool.parallel_for(x.rows, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float>& buf = thread_buffer(static_cast<size_t>(rot));
    float* cos_t = buf.data();
    float* sin_t = buf.data() + half;
    for (int64_t t = t0; t < t1; ++t) {
      // The angle in double: pos * inv_freq loses nothing even at long positions.
      for (int i = 0; i < half; ++i) {
        const double angle = static_cast<double>(positions[t]) * table.inv_freq[i];
        cos_t[i] = static_cast<float>(std::cos(angle)) * table.attn_factor;
        sin_t[i] = static_cast<float>(std::sin(angle)) * table.attn_factor;
      }
      for (int h = 0; h < n_heads; ++h) {
        float* v = f32(x) + t * x.cols + static_cast<int64_t>(h) * head_dim;
        // Interleaved rotates (v[2i], v[2i+1]); rotate_half rotates (v[i], v[i + half]).
        const int stride = table.interleaved ? 2 : 1;
        const int other = table.interleaved ? 1 : half;
        for (int i = 0; i < half; ++i) {
          const float a = v[i * stride], b = v[i * stride + other];
          v[i * stride] = a * cos_t[i] - b * sin_t[i];
          v[i * stride + other] = b * cos_t[i] + a * sin_t[i];
        }
      }
    }
  });
}

void cpu_attention(ThreadPool& pool, Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                   KvCache& cache, int layer, int pos0, const AttentionParams& p) {
  auto* c = dynamic_cast<CpuKvCache*>(&cache);
  GYRE_CHECK(c != nullptr, "attention: the KV cache was not made by the CPU backend");
  GYRE_CHECK(p.n_heads > 0 && p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0,
             "attention: ", p.n_heads, " query heads cannot share ", p.n_kv_heads, " KV heads");
  GYRE_CHECK(p.n_kv_heads == c->n_kv_heads && p.head_dim == c->head_dim,
             "attention: ", p.n_kv_heads, " KV heads of ", p.head_dim, " do not match the cache's ",
             c->n_kv_heads, " of ", c->head_dim);
  GYRE_CHECK(layer >= 0 && layer < c->n_layers, "attention: layer ", layer, " out of ",
             c->n_layers);
  const int64_t n = q.rows, hd = p.head_dim;
  const int64_t q_cols = static_cast<int64_t>(p.n_heads) * hd;
  const int64_t kv_cols = static_cast<int64_t>(p.n_kv_heads) * hd;
  for (const Tensor* t : {static_cast<const Tensor*>(&out), &q, &k, &v})
    GYRE_CHECK(t->dtype == DType::F32 && t->rows == n, "attention: inputs must be F32 with ", n,
               " rows");
  GYRE_CHECK(q.cols == q_cols && out.cols == q_cols && k.cols == kv_cols && v.cols == kv_cols,
             "attention: q/out need ", q_cols, " columns and k/v ", kv_cols);
  GYRE_CHECK(pos0 >= 0 && pos0 + n <= c->max_seq(), "attention: positions ", pos0, "..",
             pos0 + n - 1, " exceed the cache of ", c->max_seq());
  int& filled = c->filled[static_cast<size_t>(layer)];
  GYRE_CHECK(pos0 <= filled, "attention: position ", pos0, " does not continue the cached ", filled,
             " positions");

  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < p.n_kv_heads; ++h) {
      const int pos = pos0 + static_cast<int>(i);
      c->rows.store(c->key(layer, h, pos), f32(k) + i * kv_cols + h * hd);
      c->rows.store(c->value(layer, h, pos), f32(v) + i * kv_cols + h * hd);
    }
  filled = pos0 + static_cast<int>(n);  // later positions, if any, are stale now

  const int group = p.n_heads / p.n_kv_heads;
  const int64_t work = static_cast<int64_t>(pos0 + n) * hd * 2;
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(work, 1));
  pool.parallel_for(n * p.n_heads, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t i = task / p.n_heads;
      const int h = static_cast<int>(task % p.n_heads);
      const int pos = pos0 + static_cast<int>(i);
      const int first = p.sliding_window > 0 ? std::max(0, pos - p.sliding_window + 1) : 0;
      attend_one(f32(out) + i * q_cols + h * hd, f32(q) + i * q_cols + h * hd, *c, layer, h / group,
                 first, pos, p.scale);
    }
  });
}

}  // namespace gyre
