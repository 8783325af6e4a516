// Loading and running trellis-coded layers (quantization_config version 4) on the CPU, against
// references written here from the format's definition (TRELLIS.md, backend/cpu/trellis.h):
// files built by hand (random tile words, f16 scales and signs), decoded with this file's own
// bit reader, codebook and tile table, and rotated back with the explicit Hadamard matrix, in
// float64. Also: a whole model (stories260K's attention projections made trellis) against its
// float twin, every malformed file's one-line refusal, and concat/interleave of trellis weights.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/qlinear_ref.h"
#include "backend/cpu/trellis_layout.h"
#include "backend_test_util.h"
#include "core/half.h"
#include "engine/transformer.h"
#include "error_test_util.h"
#include "model/gyre_quant_loader.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "model_test_util.h"
#include "quant/st_writer.h"

namespace gyre {
namespace {

using quant::StTensor;

// ---- The reference decoder (from the spec, not from backend/cpu/trellis.h) ----

// Bit b of a tile's stream: bit b % 32 of little-endian word b / 32.
int stream_bit(const uint32_t* words, int b) {
  return int((words[b / 32] >> (b % 32)) & 1u);
}

// The 16-bit window at bit K * p, least significant bit first, wrapping at 256 K bits.
uint32_t ref_state(const uint32_t* words, int k, int p) {
  uint32_t s = 0;
  for (int i = 0; i < 16; ++i) s |= uint32_t(stream_bit(words, (k * p + i) % (256 * k))) << i;
  return s;
}

// The sum of the four signed bytes of s * 0x2C9277B5 + 0x7F4A7C15 (mod 2^32).
int ref_code(uint32_t s) {
  const uint32_t u = s * 0x2C9277B5u + 0x7F4A7C15u;
  int sum = 0;
  for (int i = 0; i < 4; ++i) {
    const int byte = int((u >> (8 * i)) & 0xFF);
    sum += byte >= 128 ? byte - 256 : byte;
  }
  return sum;
}

// The m16n8k16 A-fragment table: lane l = 4g + t, register j -> (row, col) in the tile.
void ref_position(int p, int& row, int& col) {
  const int l = p / 8, j = p % 8, g = l / 4, t = l % 4;
  static const int kRow[8] = {0, 0, 8, 8, 0, 0, 8, 8};
  static const int kCol[8] = {0, 1, 0, 1, 8, 9, 8, 9};
  row = g + kRow[j];
  col = 2 * t + kCol[j];
}

// A hand-made trellis layer: what goes into the file, and its float64 meaning.
struct Layer {
  std::string name;
  int rows = 0, cols = 0, k = 4, group = 32, block = 32;
  std::vector<uint32_t> words;   // [rows/16][cols/16][8K]
  std::vector<uint16_t> scales;  // f16 [rows][cols/group]
  std::vector<int16_t> signs;    // [cols]

  // The stored (rotated) value [r][c]: f16 scale times the code, in float64.
  std::vector<double> stored() const {
    std::vector<double> w(size_t(rows) * cols);
    const int tiles_per_row = cols / 16, tw = 8 * k;
    for (int tr = 0; tr < rows / 16; ++tr)
      for (int tc = 0; tc < tiles_per_row; ++tc) {
        const uint32_t* tile = words.data() + size_t(tr * tiles_per_row + tc) * tw;
        for (int p = 0; p < 256; ++p) {
          int row = 0, col = 0;
          ref_position(p, row, col);
          const int r = tr * 16 + row, c = tc * 16 + col;
          const double s = f16_to_f32(scales[size_t(r) * (cols / group) + c / group]);
          w[size_t(r) * cols + c] = s * ref_code(ref_state(tile, k, p));
        }
      }
    return w;
  }

  // The effective weight in the input space: stored R^T with R = diag(signs) blockdiag(H_B),
  // H_B[i][j] = (-1)^popcount(i & j) / sqrt(B), built explicitly.
  std::vector<double> effective() const {
    const std::vector<double> q = stored();
    std::vector<double> w(q.size(), 0.0);
    const double h = 1.0 / std::sqrt(double(block));
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < cols; ++i) {  // w[r][i] = sum_j q[r][j] R[i][j]
        double acc = 0;
        for (int j = (i / block) * block; j < (i / block + 1) * block; ++j) {
          const double rij =
              signs[i] * (std::popcount(unsigned((i % block) & (j % block))) % 2 ? -h : h);
          acc += q[size_t(r) * cols + j] * rij;
        }
        w[size_t(r) * cols + i] = acc;
      }
    return w;
  }

  nlohmann::json entry() const {
    return {{"bits", k},         {"group_size", group}, {"sym", true}, {"shape", {rows, cols}},
            {"hadamard", block}, {"trellis", true}};
  }

  void add_tensors(std::vector<StTensor>& out) const {
    auto bytes = [](const void* p, size_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      return std::vector<uint8_t>(b, b + n);
    };
    out.push_back({name + ".qweight",
                   "I32",
                   {rows / 16, (cols / 16) * 8 * k},
                   bytes(words.data(), words.size() * 4)});
    out.push_back(
        {name + ".scales", "F16", {rows, cols / group}, bytes(scales.data(), scales.size() * 2)});
    out.push_back({name + ".had_signs", "I16", {cols}, bytes(signs.data(), signs.size() * 2)});
  }
};

// Random words, scales (f16 around `rms` / 148 so values have about that RMS) and signs.
Layer random_layer(const std::string& name, int rows, int cols, int k, int group, int block,
                   uint32_t seed, double rms = 0.05) {
  std::mt19937 rng(seed);
  Layer l;
  l.name = name;
  l.rows = rows;
  l.cols = cols;
  l.k = k;
  l.group = group;
  l.block = block;
  l.words.resize(size_t(rows / 16) * (cols / 16) * 8 * k);
  for (uint32_t& w : l.words) w = rng();
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  l.scales.resize(size_t(rows) * (cols / group));
  for (uint16_t& s : l.scales) s = f32_to_f16(float(rms / 148.0) * u(rng));
  l.signs.resize(size_t(cols));
  for (int16_t& s : l.signs) s = (rng() & 1) ? 1 : -1;
  return l;
}

nlohmann::json quant_config(const std::vector<const Layer*>& layers, int version = 4) {
  nlohmann::json j = {{"quant_method", "gyre"}, {"version", version}};
  for (const Layer* l : layers) j["layers"][l->name] = l->entry();
  return {{"quantization_config", j}};
}

// Writes the tensors (after a 2-byte tensor, so every array after it is misaligned) and loads
// them through the gyre loader.
void load_layers(const nlohmann::json& config, std::vector<StTensor> tensors, WeightSet& raw,
                 WeightSet& out) {
  tensors.insert(tensors.begin(), StTensor{"pad", "F16", {1}, {0, 0}});
  // One file per process: ctest runs this file's tests in parallel processes.
  const std::string path =
      ::testing::TempDir() + "/gyre_trellis_load_" + std::to_string(::getpid()) + ".safetensors";
  quant::write_safetensors(path, tensors);
  safetensors_load(path, raw);
  gyre_quant_load(config, raw, out, "t");
  std::filesystem::remove(path);  // the mapping stays valid after the unlink
}

// y[t][o] = sum_c w[o][c] x[t][c] in float64.
std::vector<double> matmul_ref(const std::vector<double>& w, const std::vector<float>& x, int n,
                               int rows, int cols) {
  std::vector<double> y(size_t(n) * rows, 0.0);
  for (int t = 0; t < n; ++t)
    for (int o = 0; o < rows; ++o) {
      double acc = 0;
      for (int c = 0; c < cols; ++c) acc += w[size_t(o) * cols + c] * x[size_t(t) * cols + c];
      y[size_t(t) * rows + o] = acc;
    }
  return y;
}

TEST(TrellisLoad, LayersMatchFloat64ReferenceOnCpu) {
  auto backend = make_cpu_backend(2);
  struct Shape {
    int rows, cols, group, block;
  };
  for (const Shape s : {Shape{48, 96, 32, 32}, Shape{16, 128, 128, 128}}) {
    for (int k : {2, 3, 4, 5, 6, 8}) {
      const Layer l = random_layer("model.layers.0.self_attn.q_proj", s.rows, s.cols, k, s.group,
                                   s.block, uint32_t(100 * k + s.cols));
      std::vector<StTensor> tensors;
      l.add_tensors(tensors);
      WeightSet raw, out;
      load_layers(quant_config({&l}), tensors, raw, out);
      const TensorView& v = out.get(l.name + ".weight");
      const QWeightHost& q = qweight_of_view(v);
      ASSERT_TRUE(q.desc.trellis);
      ASSERT_EQ(q.desc.bits, k);
      ASSERT_EQ(q.had.block, s.block);
      // Stored values: scale * code is exact in float (11 + 9 significant bits).
      const std::vector<double> stored = l.stored();
      std::vector<float> row(size_t(l.cols));
      int mismatches = 0;
      for (int r = 0; r < l.rows; ++r) {
        trellis_dequantize_row(q, r, row.data());
        for (int c = 0; c < l.cols; ++c) mismatches += row[c] != stored[size_t(r) * l.cols + c];
      }
      EXPECT_EQ(mismatches, 0) << "k " << k << " cols " << s.cols;
      const std::vector<double> w = l.effective();
      const Tensor wt = backend->upload_weight(v);
      for (int n : {1, 3, 7}) {
        std::mt19937 rng(uint32_t(n + k));
        const std::vector<float> x = btest::random_f16(size_t(n) * l.cols, rng);
        const btest::Act xa = btest::upload(*backend, x, n, l.cols);
        Tensor y = backend->alloc(n, l.rows);
        backend->matmul(y, xa.t, wt, nullptr);
        EXPECT_LT(
            btest::max_rel_error(btest::host(*backend, y), matmul_ref(w, x, n, l.rows, l.cols)),
            1e-5)
            << "k " << k << " rows " << s.rows << " cols " << s.cols << " n " << n;
      }
    }
  }
}

// The tampered cases start from one valid layer; each edit must give exactly its refusal.
TEST(TrellisLoad, MalformedFilesGiveOneLineErrors) {
  const Layer l = random_layer("model.layers.0.self_attn.q_proj", 48, 96, 4, 32, 32, 7);
  std::vector<StTensor> good;
  l.add_tensors(good);
  const nlohmann::json good_cfg = quant_config({&l});
  {
    WeightSet raw, out;
    ASSERT_NO_THROW(load_layers(good_cfg, good, raw, out));
  }
  auto expect_error = [&](const std::function<void(nlohmann::json&, std::vector<StTensor>&)>& edit,
                          const std::string& needle) {
    nlohmann::json cfg = good_cfg;
    std::vector<StTensor> tensors = good;
    edit(cfg, tensors);
    WeightSet raw, out;
    testutil::expect_one_line_error([&] { load_layers(cfg, tensors, raw, out); }, needle);
  };
  auto entry = [&](nlohmann::json& c) -> nlohmann::json& {
    return c["quantization_config"]["layers"][l.name];
  };
  auto tensor = [&](std::vector<StTensor>& ts, const std::string& suffix) -> StTensor& {
    for (StTensor& t : ts)
      if (t.name == l.name + suffix) return t;
    throw std::runtime_error("no tensor " + suffix);
  };
  const std::string q = "model.layers.0.self_attn.q_proj";
  // Versions.
  expect_error([](nlohmann::json& c, auto&) { c["quantization_config"]["version"] = 3; },
               "layer '" + q + "' is trellis-coded, which needs version 4");
  expect_error([](nlohmann::json& c, auto&) { c["quantization_config"]["version"] = 5; },
               "this build reads versions 1 to 4");
  // Entries.
  expect_error([&](nlohmann::json& c, auto&) { entry(c)["trellis"] = 1; },
               "layer '" + q + "' has a non-boolean trellis flag");
  expect_error([&](nlohmann::json& c, auto&) { entry(c)["bits"] = 7; },
               "trellis-coded layer '" + q + "' has unsupported bits 7 (2, 3, 4, 5, 6 or 8)");
  expect_error(
      [&](nlohmann::json& c, auto&) {
        entry(c)["shape"] = {40, 96};
      },
      "trellis-coded layer '" + q + "' has shape [40, 96], not made of 16 x 16 tiles");
  expect_error(
      [&](nlohmann::json& c, auto&) {
        entry(c)["shape"] = {48, 104};
        entry(c)["hadamard"] = 8;
        entry(c)["group_size"] = 8;
      },
      "trellis-coded layer '" + q + "' has shape [48, 104], not made of 16 x 16 tiles");
  expect_error([&](nlohmann::json& c, auto&) { entry(c)["sym"] = false; },
               "trellis-coded layer '" + q + "' must be symmetric");
  expect_error(
      [&](nlohmann::json& c, auto&) {
        entry(c)["mix"] = {{"bits", 8}, {"hi_groups", 1}};
      },
      "trellis-coded layer '" + q + "' cannot be mixed");
  expect_error([&](nlohmann::json& c, auto&) { entry(c)["group_size"] = 64; },
               "trellis-coded layer '" + q +
                   "' has group size 64, not a multiple of 16 dividing its 96 columns");
  expect_error([&](nlohmann::json& c, auto&) { entry(c)["group_size"] = 8; },
               "trellis-coded layer '" + q +
                   "' has group size 8, not a multiple of 16 dividing its 96 columns");
  expect_error(
      [&](nlohmann::json& c, auto&) { entry(c).erase("hadamard"); },
      "trellis-coded layer '" + q + "' has no hadamard block (trellis layers are always rotated)");
  // Tensors.
  expect_error([&](nlohmann::json& c, auto&) { entry(c)["bits"] = 3; },
               "'" + q + ".qweight' has shape [3, 192], expected [3, 144]");
  expect_error([&](auto&, std::vector<StTensor>& ts) { tensor(ts, ".qweight").dtype = "F32"; },
               "'" + q + ".qweight' is F32, expected I32");
  expect_error(
      [&](auto&, std::vector<StTensor>& ts) {
        tensor(ts, ".scales").shape = {144, 1};
      },
      "'" + q + ".scales' has shape [144, 1], expected [48, 3]");
  expect_error([&](auto&, std::vector<StTensor>& ts) { tensor(ts, ".scales").dtype = "BF16"; },
               "'" + q + ".scales' is BF16, expected F16");
  expect_error(
      [&](auto&, std::vector<StTensor>& ts) {
        std::erase_if(ts, [&](const StTensor& t) { return t.name == q + ".had_signs"; });
      },
      "quantized layer tensor '" + q + ".had_signs' is missing");
  expect_error(
      [&](auto&, std::vector<StTensor>& ts) {
        StTensor& s = tensor(ts, ".had_signs");
        s.bytes[10] = 0;
        s.bytes[11] = 0;
      },
      "'" + q + ".had_signs' holds 0 at column 5, not +1 or -1");
  expect_error(
      [&](auto&, std::vector<StTensor>& ts) {
        StTensor m = tensor(ts, ".scales");
        m.name = q + ".mins";
        ts.push_back(m);
      },
      "trellis-coded layer '" + q + "' has mins");
}

// Row-stacked fusing (q|k|v, gate|up) of trellis weights: every row of the result equals the
// row of the part it came from, bit for bit; padding rows are zero; refusals are one line.
TEST(TrellisLoad, ConcatAndInterleaveKeepEveryRow) {
  const Layer la = random_layer("a", 32, 64, 3, 64, 64, 1);
  const Layer lb = random_layer("b", 32, 64, 3, 64, 64, 2);
  Layer lc = random_layer("c", 16, 64, 3, 64, 64, 3);
  lc.signs = la.signs;  // fusable parts share the rotation
  Layer lb2 = lb;
  lb2.signs = la.signs;
  lb2.name = "b2";
  std::vector<StTensor> tensors;
  for (const Layer* l : std::vector<const Layer*>{&la, &lb, &lc, &lb2}) l->add_tensors(tensors);
  WeightSet raw, out;
  load_layers(quant_config({&la, &lb, &lc, &lb2}), tensors, raw, out);
  const QWeightHost& a = qweight_of_view(out.get("a.weight"));
  const QWeightHost& b = qweight_of_view(out.get("b2.weight"));
  const QWeightHost& c = qweight_of_view(out.get("c.weight"));
  auto row_of = [](const QWeightHost& w, int64_t r) {
    std::vector<float> v(size_t(w.desc.cols));
    qweight_dequantize_row(w, r, v.data());
    return v;
  };
  const QWeightHost cat = qweight_concat_rows({&a, &c, &b});
  ASSERT_EQ(cat.desc.rows, 80);
  ASSERT_TRUE(cat.desc.trellis);
  for (int r = 0; r < 80; ++r) {
    const QWeightHost& src = r < 32 ? a : r < 48 ? c : b;
    const int sr = r < 32 ? r : r < 48 ? r - 32 : r - 48;
    EXPECT_EQ(row_of(cat, r), row_of(src, sr)) << "concat row " << r;
  }
  for (int block : {16, 48}) {
    const QWeightHost il = qweight_interleave_rows(a, b, block);
    const int padded = (32 + block - 1) / block * block;
    ASSERT_EQ(il.desc.rows, 2 * padded);
    const std::vector<float> zero(64, 0.0f);
    for (int r = 0; r < il.desc.rows; ++r) {
      const int kb = r / (2 * block) * block, in = r % (2 * block);
      const QWeightHost& src = in < block ? a : b;
      const int sr = kb + in % block;
      EXPECT_EQ(row_of(il, r), sr < 32 ? row_of(src, sr) : zero)
          << "block " << block << " row " << r;
    }
  }
  testutil::expect_one_line_error([&] { qweight_interleave_rows(a, b, 8); },
                                  "trellis weights interleave in blocks of a multiple of 16 rows");
  const QWeightHost& other_signs = qweight_of_view(out.get("b.weight"));
  testutil::expect_one_line_error(
      [&] {
        qweight_concat_rows({&a, &other_signs});
      },
      "weights differ in layout");
  // A scalar weight of the same shape and bits is a different layout.
  std::vector<float> wf(32 * 64, 0.01f);
  QWeightHost scalar = qweight_pack_from_f32(wf.data(), 32, 64, 3, 64, false);
  scalar.had = a.had;
  testutil::expect_one_line_error(
      [&] {
        qweight_concat_rows({&a, &scalar});
      },
      "weights differ in layout");
}

// stories260K with its attention projections (64 columns: tileable) replaced by hand-made
// trellis layers, loaded as a model and run on the CPU: its logits equal those of the same model
// whose projections are F32 weights decoded by this file's reference (within 1e-4 relative).
TEST(TrellisLoad, WholeModelMatchesItsDecodedFloatTwin) {
  const std::string src = std::string(GYRE_FIXTURES) + "/stories260K";
  const std::string dir =
      ::testing::TempDir() + "/gyre_trellis_load_model_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(src))
    if (e.path().filename() != "model.safetensors" && e.path().filename() != "config.json")
      std::filesystem::copy_file(e.path(), dir + "/" + e.path().filename().string());
  nlohmann::json cfg;
  std::ifstream(src + "/config.json") >> cfg;
  WeightSet orig;
  safetensors_load(src + "/model.safetensors", orig);
  std::vector<Layer> layers;
  uint32_t seed = 1;
  int k = 2;
  for (int b = 0; b < 5; ++b)
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      const std::string name = layer_tensor(b, "self_attn.") + p;
      const TensorView& t = orig.get(name + ".weight");
      const int rows = int(t.shape[0]);
      // Every supported K across the layers; q|k|v of a block share their signs (as written).
      layers.push_back(random_layer(name, rows, 64, k, 64, 64, seed++));
      if (std::string(p) != "q_proj" && std::string(p) != "o_proj")
        layers.back().signs = layers[layers.size() - 2].signs;
      k = k == 6 ? 8 : k == 8 ? 2 : k + 1;
    }
  std::vector<StTensor> tensors;
  std::vector<const Layer*> ptrs;
  for (const Layer& l : layers) {
    l.add_tensors(tensors);
    ptrs.push_back(&l);
  }
  for (const auto& [name, t] : orig.all()) {
    bool replaced = false;
    for (const Layer& l : layers) replaced |= name == l.name + ".weight";
    if (replaced) continue;
    const auto* b = static_cast<const uint8_t*>(t.data);
    tensors.push_back(
        {name, std::string(dtype_name(t.dtype)), t.shape, std::vector<uint8_t>(b, b + t.nbytes)});
  }
  cfg.update(quant_config(ptrs));
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  quant::write_safetensors(dir + "/model.safetensors", tensors);

  const auto model = load_model(dir);
  // The twin: the same weights, the trellis layers as F32 from the reference decoder.
  auto decoded = std::make_shared<std::vector<std::vector<float>>>();
  WeightSet twin;
  twin.keep_owner(decoded);
  for (const Layer& l : layers) {
    const std::vector<double> w = l.effective();
    decoded->emplace_back(w.begin(), w.end());
    TensorView v;
    v.name = l.name + ".weight";
    v.dtype = DType::F32;
    v.shape = {l.rows, l.cols};
    v.data = decoded->back().data();
    v.nbytes = decoded->back().size() * 4;
    twin.add(v);
  }
  for (const auto& [name, t] : model->weights.all()) {
    if (twin.has(name)) {
      ASSERT_EQ(t.dtype, DType::QPACKED) << name;
      continue;
    }
    twin.add(t);
  }
  auto backend = make_cpu_backend(2);
  Transformer quantized(model->config, model->weights, *backend, 64);
  Transformer reference(model->config, twin, *backend, 64);
  const mtest::LogitsDiff d =
      mtest::compare_prompt_logits(reference, quantized, model->config.vocab_size);
  EXPECT_GT(d.max_abs, 0.1);
  EXPECT_LE(d.max_diff, 1e-4 * d.max_abs);
  EXPECT_EQ(d.same_argmax, d.positions);

  // `gyre info --json` (when the binary is known, as under ctest) lists the layers by scheme,
  // with the bytes the file's tensors hold (tile words and f16 scales).
  const char* bin = std::getenv("GYRE_BIN");
  if (bin == nullptr) return;
  nlohmann::json want = nlohmann::json::object();
  for (const Layer& l : layers) {
    nlohmann::json& e = want[std::to_string(l.k) + "b trellis g64 rotated"];
    if (e.is_null()) e = {{"tensors", 0}, {"params", 0}, {"bytes", 0}};
    e["tensors"] = e["tensors"].get<int>() + 1;
    e["params"] = e["params"].get<int>() + l.rows * l.cols;
    e["bytes"] = e["bytes"].get<int>() + int(l.words.size() * 4 + l.scales.size() * 2);
  }
  const std::string cmd = std::string(bin) + " info -m " + dir + " --json";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  ASSERT_EQ(pclose(f), 0) << text;
  EXPECT_EQ(nlohmann::json::parse(text)["quantization"], want);
}

}  // namespace
}  // namespace gyre
