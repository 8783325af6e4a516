// The CPU backend's RoPE and attention against naive float64 implementations written here:
// both RoPE conventions with partial rotation, and attention with GQA, sliding windows and a
// sequence split into prefill and continued decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_test_util.h"
#include "core/error.h"

namespace gyre {
namespace {

using btest::host;

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor activation(Backend& b, int64_t rows, int64_t cols, const float* values) {
  Tensor t = b.alloc(rows, cols);
  std::memcpy(t.data, values, static_cast<size_t>(rows * cols) * sizeof(float));
  return t;
}

struct RopeCase {
  int head_dim, rot_dim;
  bool interleaved;
  float attn_factor;
};

TEST(CpuOpsRope, BothConventionsPartialRotation) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(11);
  const int n_heads = 3, n = 5;
  for (RopeCase rc :
       {RopeCase{6, 6, false, 1.0f}, RopeCase{6, 4, true, 1.0f}, RopeCase{8, 8, true, 0.7f},
        RopeCase{18, 8, false, 1.0f}, RopeCase{18, 18, true, 1.0f}, RopeCase{18, 2, false, 1.3f}}) {
    RopeTable table;
    table.rot_dim = rc.rot_dim;
    table.interleaved = rc.interleaved;
    table.attn_factor = rc.attn_factor;
    for (int i = 0; i < rc.rot_dim / 2; ++i)
      table.inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / rc.rot_dim)));
    const std::vector<int32_t> positions = {0, 1, 17, 4000, 123456};
    const std::vector<float> x = random_floats(static_cast<size_t>(n * n_heads * rc.head_dim), rng);
    Tensor t = activation(*be, n, n_heads * rc.head_dim, x.data());
    be->rope(t, n_heads, rc.head_dim, positions.data(), table);
    const std::vector<float> got = host(*be, t);

    std::vector<double> want(x.begin(), x.end());
    const int half = rc.rot_dim / 2;
    for (int tok = 0; tok < n; ++tok)
      for (int h = 0; h < n_heads; ++h) {
        const size_t base = static_cast<size_t>((tok * n_heads + h) * rc.head_dim);
        for (int i = 0; i < half; ++i) {
          const size_t ia = base + static_cast<size_t>(rc.interleaved ? 2 * i : i);
          const size_t ib = base + static_cast<size_t>(rc.interleaved ? 2 * i + 1 : i + half);
          const double angle = positions[static_cast<size_t>(tok)] * double{table.inv_freq[i]};
          const double c = std::cos(angle) * rc.attn_factor, s = std::sin(angle) * rc.attn_factor;
          want[ia] = x[ia] * c - x[ib] * s;
          want[ib] = x[ib] * c + x[ia] * s;
        }
      }
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i])))
          << "rot " << rc.rot_dim << "/" << rc.head_dim << " interleaved " << rc.interleaved
          << " at " << i;
  }
  RopeTable bad;
  bad.rot_dim = 10;
  bad.inv_freq.assign(5, 1.0f);
  Tensor t = be->alloc(1, 8);
  const int32_t pos = 0;
  EXPECT_THROW(be->rope(t, 1, 8, &pos, bad), Error);
}

// Naive attention over the whole sequence: q [T, H*hd], k/v [T, KV*hd] of positions 0..T-1.
std::vector<double> attention_ref(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, int T, int H, int KV, int hd,
                                  double scale, int window) {
  std::vector<double> out(static_cast<size_t>(T * H * hd));
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const int kvh = h / (H / KV);
      const int first = window > 0 ? std::max(0, t - window + 1) : 0;
      std::vector<double> p;
      double mx = -1e300;
      for (int j = first; j <= t; ++j) {
        double s = 0;
        for (int d = 0; d < hd; ++d)
          s += double{q[(t * H + h) * hd + d]} * k[(j * KV + kvh) * hd + d];
        p.push_back(s * scale);
        mx = std::max(mx, p.back());
      }
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int d = 0; d < hd; ++d) {
        double acc = 0;
        for (int j = first; j <= t; ++j) acc += p[j - first] / sum * v[(j * KV + kvh) * hd + d];
        out[(t * H + h) * hd + d] = acc;
      }
    }
  return out;
}

struct AttnCase {
  int n_heads, n_kv_heads, head_dim, window;
};

TEST(CpuOpsAttention, PrefillThenDecodeMatchesOneShotAndReference) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(12);
  const int T = 23;
  for (AttnCase ac : {AttnCase{3, 1, 6, 0}, AttnCase{4, 2, 8, 0}, AttnCase{2, 2, 18, 0},
                      AttnCase{3, 1, 8, 4}, AttnCase{4, 4, 6, 1}, AttnCase{6, 2, 18, 7}}) {
    const int H = ac.n_heads, KV = ac.n_kv_heads, hd = ac.head_dim;
    AttentionParams p;
    p.n_heads = H;
    p.n_kv_heads = KV;
    p.head_dim = hd;
    p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    p.sliding_window = ac.window;
    // Larger q and k make the softmax peaked, the harder case for accuracy.
    std::vector<float> q = random_floats(static_cast<size_t>(T * H * hd), rng);
    for (float& x : q) x *= 3;
    const std::vector<float> k = random_floats(static_cast<size_t>(T * KV * hd), rng);
    const std::vector<float> v = random_floats(static_cast<size_t>(T * KV * hd), rng);
    const std::vector<double> want = attention_ref(q, k, v, T, H, KV, hd, p.scale, ac.window);

    // One shot on layer 0, and pieces 9 + 1 + 1 + 12 on layer 1 of the same cache.
    auto cache = be->new_kv_cache(2, KV, hd, 32);
    std::vector<float> one_shot, pieces;
    auto run = [&](int layer, int pos0, int n, std::vector<float>& sink) {
      Tensor qt = activation(*be, n, H * hd, &q[static_cast<size_t>(pos0 * H * hd)]);
      Tensor kt = activation(*be, n, KV * hd, &k[static_cast<size_t>(pos0 * KV * hd)]);
      Tensor vt = activation(*be, n, KV * hd, &v[static_cast<size_t>(pos0 * KV * hd)]);
      Tensor out = be->alloc(n, H * hd);
      be->attention(out, qt, kt, vt, *cache, layer, pos0, p);
      const std::vector<float> got = host(*be, out);
      sink.insert(sink.end(), got.begin(), got.end());
    };
    run(0, 0, T, one_shot);
    run(1, 0, 9, pieces);
    run(1, 9, 1, pieces);
    run(1, 10, 1, pieces);
    run(1, 11, T - 11, pieces);

    ASSERT_EQ(one_shot.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      // Outputs are averages of values in [-1, 1]: 1e-5 of that scale.
      ASSERT_NEAR(one_shot[i], want[i], 1e-5)
          << "H" << H << " KV" << KV << " hd" << hd << " w" << ac.window << " at " << i;
      ASSERT_EQ(pieces[i], one_shot[i]) << "continued decode differs from one shot at " << i;
    }
  }
}

TEST(CpuOpsAttention, RejectsGapsOverflowAndMismatchedShapes) {
  auto be = make_cpu_backend(1);
  AttentionParams p;
  p.n_heads = 2;
  p.n_kv_heads = 1;
  p.head_dim = 8;
  p.scale = 0.35f;
  auto cache = be->new_kv_cache(1, 1, 8, 4);
  Tensor q = be->alloc(2, 16), k = be->alloc(2, 8), v = be->alloc(2, 8), out = be->alloc(2, 16);
  std::memset(q.data, 0, 2 * 16 * 4);
  std::memset(k.data, 0, 2 * 8 * 4);
  std::memset(v.data, 0, 2 * 8 * 4);
  EXPECT_THROW(be->attention(out, q, k, v, *cache, 0, 1, p), Error);  // position 0 never stored
  EXPECT_THROW(be->attention(out, q, k, v, *cache, 1, 0, p), Error);  // no layer 1
  be->attention(out, q, k, v, *cache, 0, 0, p);
  be->attention(out, q, k, v, *cache, 0, 2, p);
  EXPECT_THROW(be->attention(out, q, k, v, *cache, 0, 3, p), Error);  // past max_seq
  AttentionParams wrong = p;
  wrong.head_dim = 4;
  EXPECT_THROW(be->attention(out, q, k, v, *cache, 0, 0, wrong), Error);
  EXPECT_EQ(cache->bytes(), size_t{2 * 4 * 8 * 4});
}

}  // namespace
}  // namespace gyre
