// The 2/3/5/6-bit packed layout (backend/cpu/qlinear_ref.h, "Narrow widths"): the loader's repack
// of `gyre convert` files against a float64 evaluation of the converter's grid, the packed bytes
// against an independent decoder written from the header's layout text, RTN packing, the CPU
// backend's matmul against a float64 matmul, and stories260K converted at 3 and 6 bits loading
// packed and decoding the same greedy tokens as the same file dequantized to F32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/qlinear_ref.h"
#include "core/error.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "model/gyre_qformat.h"
#include "model/gyre_quant_loader.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "quant/convert.h"
#include "quant_file_test_util.h"

namespace gyre {
namespace {

struct Case {
  int bits, group;
  bool sym;
};

std::vector<Case> narrow_cases() {
  std::vector<Case> v;
  for (int bits : {2, 3, 5, 6})
    for (int g : {32, 64, 128})
      for (bool sym : {true, false}) v.push_back({bits, g, sym});
  return v;
}

// A layer as `gyre convert` writes it (model/gyre_qformat.h): random integers and f16 scales.
struct FileLayer {
  int rows, cols;
  Case c;
  std::vector<int> q;  // [rows, cols]
  std::vector<uint16_t> scales, mins;
  std::vector<uint32_t> words;
};

FileLayer random_layer(int rows, int cols, Case c, uint32_t seed) {
  FileLayer l{rows, cols, c, {}, {}, {}, {}};
  std::mt19937 rng(seed);
  l.q.resize(static_cast<size_t>(rows) * cols);
  for (int& x : l.q) x = static_cast<int>(rng() % (1u << c.bits));
  std::uniform_real_distribution<float> s(0.001f, 0.05f), m(-0.5f, 0.1f);
  const size_t groups = static_cast<size_t>(rows) * (cols / c.group);
  for (size_t i = 0; i < groups; ++i) {
    l.scales.push_back(f32_to_f16(s(rng)));
    if (!c.sym) l.mins.push_back(f32_to_f16(m(rng)));
  }
  const int64_t row_words = int64_t{cols} * c.bits / 32;
  l.words.resize(static_cast<size_t>(rows * row_words));
  for (int r = 0; r < rows; ++r)
    quant_pack_row(l.q.data() + int64_t{r} * cols, cols, c.bits, l.words.data() + r * row_words);
  return l;
}

TensorView view(const std::string& name, DType dt, std::vector<int64_t> shape, const void* data,
                size_t nbytes) {
  TensorView v;
  v.name = name;
  v.dtype = dt;
  v.shape = std::move(shape);
  v.data = data;
  v.nbytes = nbytes;
  return v;
}

const QWeightHost& load_layer(const FileLayer& l, WeightSet& raw, WeightSet& out) {
  raw.add(view("x.qweight", DType::I32, {l.rows, int64_t{l.cols} * l.c.bits / 32}, l.words.data(),
               l.words.size() * 4));
  raw.add(view("x.scales", DType::F16, {l.rows, l.cols / l.c.group}, l.scales.data(),
               l.scales.size() * 2));
  if (!l.c.sym)
    raw.add(
        view("x.mins", DType::F16, {l.rows, l.cols / l.c.group}, l.mins.data(), l.mins.size() * 2));
  nlohmann::json cfg;
  cfg["quantization_config"] = {{"quant_method", "gyre"}, {"version", 1}};
  cfg["quantization_config"]["layers"]["x"] = {
      {"bits", l.c.bits}, {"group_size", l.c.group}, {"sym", l.c.sym}, {"shape", {l.rows, l.cols}}};
  gyre_quant_load(cfg, raw, out, "test");
  return qweight_of_view(out.get("x.weight"));
}

// The converter's grid evaluated in float64: sym s * (q - 2^(bits-1)), asym s * q + m.
double grid_value(const FileLayer& l, int r, int c) {
  const size_t g = static_cast<size_t>(r) * (l.cols / l.c.group) + c / l.c.group;
  const double s = f16_to_f32(l.scales[g]);
  const int q = l.q[static_cast<size_t>(r) * l.cols + c];
  if (l.c.sym) return s * (q - (1 << (l.c.bits - 1)));
  return s * q + static_cast<double>(f16_to_f32(l.mins[g]));
}

// Stored integer of packed column c, decoded from the bytes as the header describes the layout
// (independently of qlinear_ref.cc's code).
int documented_q(const QWeightHost& w, int r, int c) {
  const int bits = w.desc.bits, lo = bits >= 5 ? 4 : 2;
  const int units = w.desc.cols / 32, unit = c / 32, tile = unit / 32;
  const int m = std::min(32, units - 32 * tile);
  auto word_at = [&](int j) {
    const size_t at =
        (static_cast<size_t>(r) * units * bits + 32 * bits * tile + j * m + unit % 32);
    uint32_t v;
    std::memcpy(&v, w.qweight.data() + at * 4, 4);
    return v;
  };
  auto plane = [&](int first_word, int p) {
    const int e_all = c % 32, per_word = 32 / p, e = e_all % per_word;
    const uint32_t word = word_at(first_word + e_all / per_word);
    return static_cast<int>((word >> ((e % 2) * 16 + p * (e / 2))) & ((1u << p) - 1));
  };
  int v = plane(0, lo);
  if (bits > lo) v |= plane(lo, bits - lo) << lo;
  return v;
}

// 1152 columns: one full tile of 32 units and a short tile of 4; 96 columns: one short tile.
TEST(QlinearBits, LoaderRepackMatchesTheConvertersGrid) {
  for (const Case& c : narrow_cases()) {
    for (const int cols : {1152, 384}) {
      if (cols % c.group != 0) continue;
      const FileLayer l = random_layer(3, cols, c, 11u + c.bits * 7u + c.group + cols);
      WeightSet raw, out;
      const QWeightHost& w = load_layer(l, raw, out);
      ASSERT_EQ(out.get("x.weight").dtype, DType::QPACKED);
      ASSERT_EQ(w.desc.bits, c.bits);
      EXPECT_EQ(static_cast<int64_t>(w.qweight.size()), int64_t{3} * cols * c.bits / 8);
      std::vector<float> row(static_cast<size_t>(cols));
      for (int r = 0; r < 3; ++r) {
        qweight_dequantize_row(w, r, row.data());
        for (int col = 0; col < cols; ++col) {
          const int want = l.q[static_cast<size_t>(r) * cols + col];
          ASSERT_EQ(w.q(r, col), want) << c.bits << "b at " << r << "," << col;
          ASSERT_EQ(documented_q(w, r, col), want) << c.bits << "b at " << r << "," << col;
          // One rounding of the exact value: float64 rounded to float is the float result.
          ASSERT_EQ(row[col], static_cast<float>(grid_value(l, r, col)))
              << c.bits << "b g" << c.group << (c.sym ? " sym" : " asym") << " at " << r << ","
              << col;
        }
      }
    }
  }
}

TEST(QlinearBits, SmallAndOddShapes) {
  for (const int cols : {32, 96, 1024, 1056, 2080}) {
    const FileLayer l = random_layer(5, cols, {3, 32, false}, 5u + cols);
    WeightSet raw, out;
    const QWeightHost& w = load_layer(l, raw, out);
    for (int r = 0; r < 5; ++r)
      for (int col = 0; col < cols; ++col)
        ASSERT_EQ(documented_q(w, r, col), l.q[static_cast<size_t>(r) * cols + col]) << cols;
  }
}

TEST(QlinearBits, RoundToNearestPackAtNarrowWidths) {
  const int rows = 4, cols = 1152;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows) * cols);
  for (float& x : w) x = nd(rng);
  for (const Case& c : narrow_cases()) {
    const QWeightHost q = qweight_pack_from_f32(w.data(), rows, cols, c.bits, c.group, !c.sym);
    const int levels = 1 << c.bits, offset = levels / 2;
    std::vector<float> deq(cols);
    for (int r = 0; r < rows; ++r) {
      qweight_dequantize_row(q, r, deq.data());
      for (int col = 0; col < cols; ++col) {
        const double s = q.scale(r, col / c.group), m = c.sym ? 0.0 : q.min(r, col / c.group);
        const double x = w[static_cast<size_t>(r) * cols + col];
        double best = INFINITY;
        for (int v = 0; v < levels; ++v)
          best = std::min(best, std::fabs((c.sym ? s * (v - offset) : s * v + m) - x));
        ASSERT_LE(std::fabs(deq[col] - x), best + 1e-6 * s + 1e-12) << c.bits << "b " << col;
      }
    }
  }
}

TEST(QlinearBits, ConcatAndInterleaveKeepRows) {
  const FileLayer a = random_layer(3, 1056, {5, 32, true}, 1),
                  b = random_layer(3, 1056, {5, 32, true}, 2);
  WeightSet ra, oa, rb, ob;
  const QWeightHost& wa = load_layer(a, ra, oa);
  const QWeightHost& wb = load_layer(b, rb, ob);
  const QWeightHost cat = qweight_concat_rows({&wa, &wb});
  const QWeightHost il = qweight_interleave_rows(wa, wb, 2);
  for (int c = 0; c < 1056; ++c) {
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(documented_q(cat, r, c), a.q[static_cast<size_t>(r) * 1056 + c]);
      ASSERT_EQ(documented_q(cat, 3 + r, c), b.q[static_cast<size_t>(r) * 1056 + c]);
    }
    ASSERT_EQ(documented_q(il, 2, c), b.q[c]);         // b's block of rows 0-1 follows a's
    ASSERT_EQ(documented_q(il, 4, c), a.q[2112 + c]);  // a's row 2 starts the next block
  }
}

TEST(QlinearBits, CpuBackendMatmulMatchesFloat64) {
  auto be = backend_create("cpu", 2);
  for (const Case& c :
       {Case{2, 32, true}, Case{3, 64, false}, Case{5, 128, true}, Case{6, 32, false}}) {
    const int rows = 37, cols = 1152, n = 3;
    const FileLayer l = random_layer(rows, cols, c, 100u + c.bits);
    WeightSet raw, out;
    load_layer(l, raw, out);
    Tensor wt = be->upload_weight(out.get("x.weight"));
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n) * cols);
    for (float& v : x) v = u(rng);
    Tensor xt = be->alloc(n, cols), yt = be->alloc(n, rows);
    std::memcpy(xt.data, x.data(), x.size() * 4);  // CPU memory is host memory
    be->matmul(yt, xt, wt, nullptr);
    std::vector<float> y(static_cast<size_t>(n) * rows);
    be->to_host(yt, y.data());
    for (int t = 0; t < n; ++t)
      for (int r = 0; r < rows; ++r) {
        double ref = 0, mag = 0;
        for (int col = 0; col < cols; ++col) {
          const double p = grid_value(l, r, col) * x[static_cast<size_t>(t) * cols + col];
          ref += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(y[static_cast<size_t>(t) * rows + r], ref, 1e-5 * mag + 1e-6) << c.bits;
      }
  }
}

// The converted folder's packed layers dequantized to F32 straight from the file's bit streams
// through the converter's own unpacking and grid (quant_unpack, quant_dequant_value): an oracle
// that never touches the packed kernel layout.
void dequantized_copy(const std::string& dir, const nlohmann::json& cfg, const WeightSet& packed,
                      WeightSet& raw, WeightSet& out,
                      std::vector<std::shared_ptr<std::vector<uint8_t>>>& keep) {
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") safetensors_load(e.path().string(), raw);
  for (const auto& [name, t] : packed.all()) {
    if (t.dtype != DType::QPACKED) {
      out.add(t);
      continue;
    }
    const std::string layer = name.substr(0, name.size() - std::string(".weight").size());
    const auto& j = cfg["quantization_config"]["layers"][layer];
    const QuantSetting st{j["bits"].get<int>(), j["group_size"].get<int>(), j["sym"].get<bool>()};
    const int64_t rows = t.shape[0], cols = t.shape[1], words = cols * st.bits / 32;
    const int64_t groups = cols / st.group_size;
    const auto* qw = static_cast<const uint8_t*>(raw.get(layer + ".qweight").data);
    const auto* sc = static_cast<const uint8_t*>(raw.get(layer + ".scales").data);
    const auto* mn = st.sym ? nullptr : static_cast<const uint8_t*>(raw.get(layer + ".mins").data);
    auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * cols) * 4);
    std::vector<uint32_t> row(static_cast<size_t>(words));
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(row.data(), qw + r * words * 4, static_cast<size_t>(words) * 4);
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t g = r * groups + c / st.group_size;
        uint16_t s, m = 0;
        std::memcpy(&s, sc + g * 2, 2);
        if (mn) std::memcpy(&m, mn + g * 2, 2);
        const float v = quant_dequant_value(st, quant_unpack(row.data(), c, st.bits), f16_to_f32(s),
                                            f16_to_f32(m));
        std::memcpy(buf->data() + (r * cols + c) * 4, &v, 4);
      }
    }
    TensorView f = t;
    f.dtype = DType::F32;
    f.data = buf->data();
    f.nbytes = buf->size();
    out.add(f);
    keep.push_back(buf);
  }
}

std::vector<int> greedy(const LoadedModel& m, const WeightSet& w, int steps) {
  auto be = backend_create("cpu", 2);
  Transformer tf(m.config, w, *be, 64);
  std::vector<float> logits(static_cast<size_t>(m.config.vocab_size));
  int tok = 1;  // BOS
  std::vector<int> out;
  for (int pos = 0; pos < steps; ++pos) {
    const int32_t t = tok;
    tf.forward(&t, 1, pos, logits.data(), false);
    tok = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(tok);
  }
  return out;
}

TEST(QlinearBits, Stories260KAtThreeAndSixBitsLoadsPacked) {
  for (const char* uniform : {"3:32", "6:32:asym"}) {
    quant::ConvertOptions o =
        qfile::stories_convert_options(std::string("gyre_qbits_") + uniform[0]);
    o.length = 32;
    o.head_bits = 8;
    o.uniform = uniform;
    quant::convert_model(o);
    const std::string dir = o.out;
    auto m = load_model(dir);
    const nlohmann::json cfg = nlohmann::json::parse(read_text_file(dir + "/config.json"));
    int narrow = 0;
    for (const auto& [name, j] : cfg["quantization_config"]["layers"].items()) {
      const TensorView& t = m->weights.get(name + ".weight");
      ASSERT_EQ(t.dtype, DType::QPACKED) << name;
      EXPECT_EQ(qweight_of_view(t).desc.bits, j["bits"].get<int>()) << name;
      narrow += j["bits"].get<int>() == uniform[0] - '0';
    }
    EXPECT_GE(narrow, 5 * 6) << uniform;  // every quantizable projection at the uniform width
    WeightSet raw, f32;
    std::vector<std::shared_ptr<std::vector<uint8_t>>> keep;
    dequantized_copy(dir, cfg, m->weights, raw, f32, keep);
    EXPECT_EQ(greedy(*m, m->weights, 40), greedy(*m, f32, 40)) << uniform;
  }
}

}  // namespace
}  // namespace gyre
