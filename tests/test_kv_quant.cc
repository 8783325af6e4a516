// Quantized KV cache (core/kv_quant.h, --cache q8|q4): the row format's round-trip error against
// bounds derived from the format's definition, and the CPU backend's contiguous and paged
// attention over q8/q4 caches against a naive float64 attention over the dequantized keys and
// values (the exact semantics of a quantized cache: attention reads what the rows decode to).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/kv_quant.h"

namespace gyre {
namespace {

// Rows like real keys: most channels small, a few outlier channels large and offset.
std::vector<float> key_like(size_t rows, int hd, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(rows * static_cast<size_t>(hd));
  for (size_t r = 0; r < rows; ++r)
    for (int d = 0; d < hd; ++d) {
      const bool outlier = d % 17 == 3;
      v[r * hd + d] = outlier ? 8.0f + 4.0f * n(rng) : n(rng);
    }
  return v;
}

std::vector<float> round_trip(KvType t, const std::vector<float>& x, int hd) {
  std::vector<float> y(x.size());
  std::vector<uint8_t> codes(kv_code_bytes(t, hd));
  std::vector<uint16_t> params(kv_param_halves(t, hd));
  for (size_t r = 0; r < x.size() / hd; ++r) {
    kv_quantize_row(t, x.data() + r * hd, hd, codes.data(), params.data());
    kv_dequantize_row(t, codes.data(), params.data(), hd, y.data() + r * hd);
  }
  return y;
}

TEST(KvQuant, SizesAndNames) {
  EXPECT_EQ(kv_row_bytes(KvType::Q8, 128), 128u + 4 * 2);
  EXPECT_EQ(kv_row_bytes(KvType::Q4, 128), 64u + 8 * 2);
  EXPECT_EQ(kv_row_bytes(KvType::Q4, 40), 20u + 4 * 2);  // a short last block
  EXPECT_EQ(kv_row_bytes(KvType::F16, 64), 128u);
  EXPECT_EQ(parse_kv_type("q8"), KvType::Q8);
  EXPECT_STREQ(kv_type_name(parse_kv_type("q4")), "q4");
  EXPECT_THROW(parse_kv_type("q5"), Error);
  EXPECT_THROW(parse_kv_type(""), Error);
}

// Every value within half a quantization step of itself (plus FP16 rounding of scale and min),
// block by block; bounds from each block's own range, computed here.
TEST(KvQuant, RoundTripErrorWithinHalfAStep) {
  std::mt19937 rng(5);
  for (int hd : {8, 12, 32, 40, 64, 100, 128}) {
    const std::vector<float> x = key_like(40, hd, rng);
    for (KvType t : {KvType::Q8, KvType::Q4}) {
      const std::vector<float> y = round_trip(t, x, hd);
      for (size_t r = 0; r < 40; ++r)
        for (int b0 = 0; b0 < hd; b0 += 32) {
          const int n = std::min(32, hd - b0);
          const float* xb = x.data() + r * hd + b0;
          double lo = xb[0], hi = xb[0], amax = 0;
          for (int i = 0; i < n; ++i) {
            lo = std::min<double>(lo, xb[i]);
            hi = std::max<double>(hi, xb[i]);
            amax = std::max<double>(amax, std::fabs(xb[i]));
          }
          // FP16 keeps 11 significant bits: relative 2^-11 on scale (times up to 127 or 15
          // steps) and on the minimum.
          const double bound = t == KvType::Q8
                                   ? amax / 254.0 + amax * 127.0 / 127.0 / 1024.0
                                   : (hi - lo) / 30.0 + (hi - lo) / 1024.0 + std::fabs(lo) / 1024.0;
          for (int i = 0; i < n; ++i)
            ASSERT_LE(std::fabs(double(y[r * hd + b0 + i]) - xb[i]), bound + 1e-7)
                << kv_type_name(t) << " hd " << hd << " row " << r << " dim " << b0 + i;
        }
    }
  }
}

TEST(KvQuant, ConstantBlocksAndNonFiniteValues) {
  const int hd = 40;
  std::vector<float> x(hd, 2.5f);
  for (KvType t : {KvType::Q8, KvType::Q4}) {
    const std::vector<float> y = round_trip(t, x, hd);
    for (int d = 0; d < hd; ++d) EXPECT_NEAR(y[d], 2.5f, 2.5f / 254) << kv_type_name(t);
  }
  std::vector<float> z(hd, 0.0f);
  z[1] = std::numeric_limits<float>::quiet_NaN();
  z[2] = std::numeric_limits<float>::infinity();
  z[3] = 1.0f;
  for (KvType t : {KvType::Q8, KvType::Q4}) {
    const std::vector<float> y = round_trip(t, z, hd);
    for (int d = 0; d < hd; ++d) {
      ASSERT_TRUE(std::isfinite(y[d])) << kv_type_name(t) << " dim " << d;
      EXPECT_NEAR(y[d], d == 3 ? 1.0f : 0.0f, 1.0 / 29) << kv_type_name(t) << " dim " << d;
    }
  }
}

// ---- attention over quantized caches ----

struct Shape {
  int heads, kv_heads, hd, window;
};

// Naive float64 causal attention of query row i (position pos) over rows [first, pos] of k/v
// (already dequantized), all heads.
std::vector<double> reference(const Shape& s, const float* q, const std::vector<float>& k,
                              const std::vector<float>& v, int pos) {
  const int kv_cols = s.kv_heads * s.hd;
  std::vector<double> out(static_cast<size_t>(s.heads * s.hd), 0.0);
  const int first = s.window > 0 ? std::max(0, pos - s.window + 1) : 0;
  for (int h = 0; h < s.heads; ++h) {
    const int kh = h / (s.heads / s.kv_heads);
    std::vector<double> w;
    for (int j = first; j <= pos; ++j) {
      double dot = 0;
      for (int d = 0; d < s.hd; ++d)
        dot += double(q[h * s.hd + d]) * k[size_t(j) * kv_cols + kh * s.hd + d];
      w.push_back(dot / std::sqrt(double(s.hd)));
    }
    const double mx = *std::max_element(w.begin(), w.end());
    double z = 0;
    for (double& x : w) z += (x = std::exp(x - mx));
    for (int j = first; j <= pos; ++j)
      for (int d = 0; d < s.hd; ++d)
        out[size_t(h * s.hd + d)] +=
            w[size_t(j - first)] / z * v[size_t(j) * kv_cols + kh * s.hd + d];
  }
  return out;
}

Tensor activation(Backend& b, int64_t rows, int64_t cols, const float* values) {
  Tensor t = b.alloc(rows, cols);
  std::memcpy(t.data, values, static_cast<size_t>(rows * cols) * sizeof(float));
  return t;
}

AttentionParams params_of(const Shape& s) {
  AttentionParams p;
  p.n_heads = s.heads;
  p.n_kv_heads = s.kv_heads;
  p.head_dim = s.hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  p.sliding_window = s.window;
  return p;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << what << " at " << i;
}

TEST(KvQuantCpuAttention, MatchesFloat64OnDequantizedRows) {
  std::mt19937 rng(11);
  const int len = 37;
  for (KvType t : {KvType::Q8, KvType::Q4})
    for (const Shape& s : {Shape{6, 2, 40, 0}, Shape{4, 4, 12, 9}, Shape{8, 2, 64, 0}}) {
      auto be = make_cpu_backend(2, t);
      const int q_cols = s.heads * s.hd, kv_cols = s.kv_heads * s.hd;
      std::vector<float> q = key_like(size_t(len) * s.heads, s.hd, rng);
      std::vector<float> k = key_like(size_t(len) * s.kv_heads, s.hd, rng);
      std::vector<float> v = key_like(size_t(len) * s.kv_heads, s.hd, rng);
      for (float& x : q) x *= 0.3f;
      const std::vector<float> kd = round_trip(t, k, s.hd), vd = round_trip(t, v, s.hd);
      auto cache = be->new_kv_cache(2, s.kv_heads, s.hd, len);
      EXPECT_EQ(cache->bytes(), 2u * 2 * s.kv_heads * len * kv_row_bytes(t, s.hd));
      // A prefill chunk, then single-token steps: both paths read what earlier calls stored.
      for (int pos0 = 0; pos0 < len;) {
        const int n = pos0 == 0 ? 20 : 1;
        Tensor tq = activation(*be, n, q_cols, q.data() + size_t(pos0) * q_cols);
        Tensor tk = activation(*be, n, kv_cols, k.data() + size_t(pos0) * kv_cols);
        Tensor tv = activation(*be, n, kv_cols, v.data() + size_t(pos0) * kv_cols);
        Tensor out = be->alloc(n, q_cols);
        be->attention(out, tq, tk, tv, *cache, 1, pos0, params_of(s));
        std::vector<float> got(size_t(n) * q_cols);
        be->to_host(out, got.data());
        for (int i = 0; i < n; ++i) {
          const std::vector<float> row(got.begin() + i * q_cols, got.begin() + (i + 1) * q_cols);
          expect_close(row, reference(s, q.data() + size_t(pos0 + i) * q_cols, kd, vd, pos0 + i),
                       kv_type_name(t));
        }
        pos0 += n;
      }
    }
}

// Two sequences in one ragged batch on scattered pages, then one sequence's pages copied
// (copy-on-write) and read through the copy: every output matches float64 on dequantized rows.
TEST(KvQuantCpuPagedAttention, MatchesFloat64AndCopiesPages) {
  std::mt19937 rng(3);
  const Shape s{6, 2, 40, 0};
  const int ps = 5, num_pages = 16, q_cols = s.heads * s.hd, kv_cols = s.kv_heads * s.hd;
  const std::vector<int> lens = {13, 7};
  for (KvType t : {KvType::Q8, KvType::Q4}) {
    auto be = make_cpu_backend(2, t);
    auto kv = be->new_paged_kv_cache(2, s.kv_heads, s.hd, num_pages, ps);
    EXPECT_EQ(kv->bytes(), 2u * 2 * num_pages * ps * s.kv_heads * kv_row_bytes(t, s.hd));
    std::vector<std::vector<float>> q, k, v;
    std::vector<std::vector<int32_t>> tables = {{9, 2, 14}, {4, 11}};
    std::vector<float> bq, bk, bv;
    std::vector<int32_t> positions, starts = {0}, ctx, flat_tables;
    std::vector<int64_t> slots;
    for (size_t i = 0; i < lens.size(); ++i) {
      q.push_back(key_like(size_t(lens[i]) * s.heads, s.hd, rng));
      for (float& x : q.back()) x *= 0.3f;
      k.push_back(key_like(size_t(lens[i]) * s.kv_heads, s.hd, rng));
      v.push_back(key_like(size_t(lens[i]) * s.kv_heads, s.hd, rng));
      bq.insert(bq.end(), q[i].begin(), q[i].end());
      bk.insert(bk.end(), k[i].begin(), k[i].end());
      bv.insert(bv.end(), v[i].begin(), v[i].end());
      for (int p = 0; p < lens[i]; ++p) {
        positions.push_back(p);
        slots.push_back(int64_t(tables[i][size_t(p / ps)]) * ps + p % ps);
      }
      starts.push_back(int32_t(positions.size()));
      ctx.push_back(lens[i]);
      std::vector<int32_t> row = tables[i];
      row.resize(3, -1);
      flat_tables.insert(flat_tables.end(), row.begin(), row.end());
    }
    PagedBatch b;
    b.rows = int(positions.size());
    b.seqs = 2;
    b.positions = positions.data();
    b.slots = slots.data();
    b.seq_starts = starts.data();
    b.context_lens = ctx.data();
    b.page_tables = flat_tables.data();
    b.max_pages = 3;
    Tensor tq = activation(*be, b.rows, q_cols, bq.data());
    Tensor tk = activation(*be, b.rows, kv_cols, bk.data());
    Tensor tv = activation(*be, b.rows, kv_cols, bv.data());
    Tensor out = be->alloc(b.rows, q_cols);
    be->attention_paged(out, tq, tk, tv, *kv, 0, b, params_of(s));
    std::vector<float> got(size_t(b.rows) * q_cols);
    be->to_host(out, got.data());
    for (size_t i = 0; i < lens.size(); ++i) {
      const std::vector<float> kd = round_trip(t, k[i], s.hd), vd = round_trip(t, v[i], s.hd);
      for (int p = 0; p < lens[i]; ++p) {
        const size_t r = size_t(starts[i] + p);
        const std::vector<float> row(got.begin() + r * q_cols, got.begin() + (r + 1) * q_cols);
        expect_close(row, reference(s, q[i].data() + size_t(p) * q_cols, kd, vd, p),
                     kv_type_name(t));
      }
    }
    // Sequence 0's last page (3 tokens) copied to page 0; its last position re-attended through
    // the copy (the query row only: k/v of position 12 are stored again, to the copy).
    be->copy_kv_page(*kv, 14, 0, 3);
    const std::vector<int32_t> table2 = {9, 2, 0};
    const int p = 12;
    const int32_t pos1[] = {p}, st[] = {0, 1}, cl[] = {p + 1};
    const int64_t sl[] = {int64_t{0} * ps + p % ps};
    PagedBatch b2;
    b2.rows = 1;
    b2.seqs = 1;
    b2.positions = pos1;
    b2.slots = sl;
    b2.seq_starts = st;
    b2.context_lens = cl;
    b2.page_tables = table2.data();
    b2.max_pages = 3;
    Tensor q1 = activation(*be, 1, q_cols, q[0].data() + size_t(p) * q_cols);
    Tensor k1 = activation(*be, 1, kv_cols, k[0].data() + size_t(p) * kv_cols);
    Tensor v1 = activation(*be, 1, kv_cols, v[0].data() + size_t(p) * kv_cols);
    Tensor o1 = be->alloc(1, q_cols);
    be->attention_paged(o1, q1, k1, v1, *kv, 0, b2, params_of(s));
    std::vector<float> got1(static_cast<size_t>(q_cols));
    be->to_host(o1, got1.data());
    expect_close(got1,
                 reference(s, q[0].data() + size_t(p) * q_cols, round_trip(t, k[0], s.hd),
                           round_trip(t, v[0], s.hd), p),
                 "copied page");
  }
}

TEST(KvQuantCpuAttention, BackendRejectsUnknownCacheType) {
  BackendOptions o;
  o.kv_cache = "q3";
  EXPECT_THROW(backend_create("cpu", o), Error);
}

}  // namespace
}  // namespace gyre
