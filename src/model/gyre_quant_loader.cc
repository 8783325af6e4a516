#include "model/gyre_quant_loader.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cpu/qmixed.h"
#include "backend/cpu/trellis.h"
#include "core/error.h"
#include "core/half.h"
#include "model/gyre_qformat.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace gyre {

namespace {

const TensorView& part(const WeightSet& raw, const std::string& name, DType dtype,
                       const std::vector<int64_t>& shape, const std::string& where) {
  GYRE_CHECK(raw.has(name), where, ": quantized layer tensor '", name, "' is missing");
  const TensorView& t = raw.get(name);
  GYRE_CHECK(t.dtype == dtype, where, ": '", name, "' is ", dtype_name(t.dtype), ", expected ",
             dtype_name(dtype));
  GYRE_CHECK(t.shape == shape, where, ": '", name, "' has shape ", shape_str(t.shape),
             ", expected ", shape_str(shape));
  GYRE_CHECK(t.data != nullptr &&
                 t.nbytes == static_cast<size_t>(t.numel()) * dtype_info(dtype).block_bytes,
             where, ": '", name, "' has the wrong byte size");
  return t;
}

uint16_t half_at(const TensorView& t, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(t.data) + i * 2, 2);
  return h;
}

struct Layer {
  std::string name;
  QuantSetting st;
  int64_t rows = 0, cols = 0;
  int64_t hi_groups = 0;  // a mix: groups at st.mix_bits
  int hadamard = 0;       // a rotated layer: its block B (NAME.had_signs holds the signs)
};

// A trellis-coded entry (version 4; backend/cpu/trellis.h): what the tiles and the kernels need,
// each refusal naming the one thing wrong. The scalar rules (quant_setting_validate) do not apply.
void check_trellis_layer(const Layer& l, int version, const std::string& where) {
  const std::string& name = l.name;
  GYRE_CHECK(version >= 4, where, ": layer '", name, "' is trellis-coded, which needs version 4");
  GYRE_CHECK(!l.st.mixed(), where, ": trellis-coded layer '", name, "' cannot be mixed");
  GYRE_CHECK(l.st.sym, where, ": trellis-coded layer '", name, "' must be symmetric");
  GYRE_CHECK(trellis_bits_supported(l.st.bits), where, ": trellis-coded layer '", name,
             "' has unsupported bits ", l.st.bits, " (2, 3, 4, 5, 6 or 8)");
  GYRE_CHECK(l.rows % kTrellisTileDim == 0 && l.cols > 0 && l.cols % kTrellisTileDim == 0, where,
             ": trellis-coded layer '", name, "' has shape [", l.rows, ", ", l.cols,
             "], not made of 16 x 16 tiles");
  GYRE_CHECK(l.st.group_size % kTrellisTileDim == 0 && l.cols % l.st.group_size == 0, where,
             ": trellis-coded layer '", name, "' has group size ", l.st.group_size,
             ", not a multiple of 16 dividing its ", l.cols, " columns");
  GYRE_CHECK(l.hadamard != 0, where, ": trellis-coded layer '", name,
             "' has no hadamard block (trellis layers are always rotated)");
}

Layer parse_layer(const std::string& name, const nlohmann::json& j, int version,
                  const std::string& where) {
  GYRE_CHECK(j.is_object() && j.contains("bits") && j["bits"].is_number_integer() &&
                 j.contains("group_size") && j["group_size"].is_number_integer() &&
                 j.contains("sym") && j["sym"].is_boolean() && j.contains("shape") &&
                 j["shape"].is_array() && j["shape"].size() == 2 &&
                 j["shape"][0].is_number_integer() && j["shape"][1].is_number_integer(),
             where, ": quantization_config layer '", name,
             "' needs integer bits, group_size, boolean sym and a [rows, cols] shape");
  Layer l;
  l.name = name;
  const int64_t bits = j["bits"].get<int64_t>(), group = j["group_size"].get<int64_t>();
  GYRE_CHECK(bits > 0 && bits <= 8 && group > 0 && group <= 128, where, ": layer '", name,
             "' has unsupported bits ", bits, " / group size ", group);
  l.st.bits = static_cast<int>(bits);
  l.st.group_size = static_cast<int>(group);
  l.st.sym = j["sym"].get<bool>();
  l.rows = j["shape"][0].get<int64_t>();
  l.cols = j["shape"][1].get<int64_t>();
  GYRE_CHECK(l.rows > 0 && l.rows <= (int64_t{1} << 24) && l.cols <= (int64_t{1} << 24), where,
             ": layer '", name, "' has an unsupported shape");
  if (j.contains("mix")) {
    const nlohmann::json& mix = j["mix"];
    GYRE_CHECK(version >= 2, where, ": layer '", name, "' is mixed, which needs version 2");
    GYRE_CHECK(mix.is_object() && mix.contains("bits") && mix["bits"].is_number_integer() &&
                   mix.contains("hi_groups") && mix["hi_groups"].is_number_integer(),
               where, ": layer '", name, "' needs an integer mix.bits and mix.hi_groups");
    const int64_t mb = mix["bits"].get<int64_t>(), k = mix["hi_groups"].get<int64_t>();
    GYRE_CHECK(mb > 0 && mb <= 8 && mb != l.st.bits, where, ": layer '", name,
               "' has unsupported mix bits ", mb);
    GYRE_CHECK(l.cols > 0 && k >= 1 && k < l.cols / l.st.group_size, where, ": layer '", name,
               "' has ", k, " mixed groups of ", l.cols / std::max<int64_t>(l.st.group_size, 1));
    l.st.mix_bits = static_cast<int>(mb);
    l.st.mix_eighths = 4;  // only the count matters when loading; validated as a mix
    l.hi_groups = k;
  }
  if (j.contains("hadamard")) {
    GYRE_CHECK(version >= 3, where, ": layer '", name, "' is rotated, which needs version 3");
    GYRE_CHECK(j["hadamard"].is_number_integer(), where, ": layer '", name,
               "' has a non-integer hadamard block");
    const int64_t b = j["hadamard"].get<int64_t>();
    GYRE_CHECK(b >= 2 && b <= 4096 && (b & (b - 1)) == 0 && l.cols % b == 0, where, ": layer '",
               name, "' has hadamard block ", b, ", not a power of two dividing its ", l.cols,
               " columns");
    l.hadamard = static_cast<int>(b);
  }
  if (j.contains("trellis")) {
    GYRE_CHECK(j["trellis"].is_boolean(), where, ": layer '", name,
               "' has a non-boolean trellis flag");
    l.st.trellis = j["trellis"].get<bool>();
  }
  if (l.st.trellis)
    check_trellis_layer(l, version, where);
  else
    quant_setting_validate(l.st, l.cols, where + ": layer '" + name + "'");
  return l;
}

// The stored integers of row r (unpacked from its bit stream, copied first: file data may be
// unaligned).
void unpack_row(const TensorView& qw, int64_t r, int64_t words, int64_t cols, int bits,
                std::vector<uint32_t>& row_words, std::vector<int>& q) {
  std::memcpy(row_words.data(), static_cast<const uint8_t*>(qw.data) + r * words * 4,
              static_cast<size_t>(words) * 4);
  for (int64_t c = 0; c < cols; ++c) q[c] = quant_unpack(row_words.data(), c, bits);
}

// Every width (2, 3, 4, 5, 6, 8 bits) becomes Gyre's kernel layout (QPACKED,
// backend/cpu/qlinear_ref.h) with the same group size, symmetry and f16 scales/mins, so the values
// are the file's exactly and the memory cost is the file's bits per weight. The file's bit stream
// is repacked here (rather than read by the kernels) because a plain stream makes 3/5/6-bit
// values straddle words; the split-plane layout keeps every GPU extraction one shift and mask.
// One width's packed weight of `cols` columns from PREFIX.qweight / .scales / .mins.
std::shared_ptr<QWeightHost> read_part(const WeightSet& raw, const std::string& prefix,
                                       const QuantSetting& st, int64_t rows, int64_t cols,
                                       const std::string& where) {
  const int64_t groups = cols / st.group_size, words = cols * st.bits / 32;
  const TensorView& qw = part(raw, prefix + ".qweight", DType::I32, {rows, words}, where);
  const TensorView& sc = part(raw, prefix + ".scales", DType::F16, {rows, groups}, where);
  const TensorView* mn =
      st.sym ? nullptr : &part(raw, prefix + ".mins", DType::F16, {rows, groups}, where);
  if (st.sym)
    GYRE_CHECK(!raw.has(prefix + ".mins"), where, ": symmetric layer '", prefix, "' has mins");
  std::vector<uint32_t> row_words(static_cast<size_t>(words));
  std::vector<int> q(static_cast<size_t>(cols));
  QWeightDesc d;
  d.bits = st.bits;
  d.group_size = st.group_size;
  d.asymmetric = !st.sym;
  d.rows = static_cast<int>(rows);
  d.cols = static_cast<int>(cols);
  auto w = std::make_shared<QWeightHost>(qweight_allocate(d));
  for (int64_t r = 0; r < rows; ++r) {
    unpack_row(qw, r, words, cols, st.bits, row_words, q);
    for (int64_t c = 0; c < cols; ++c) qweight_set_q(*w, r, c, q[c]);
    // f16 values through f32 back to f16: unchanged.
    for (int64_t g = 0; g < groups; ++g)
      qweight_set_scale(*w, r, g, f16_to_f32(half_at(sc, r * groups + g)),
                        mn ? f16_to_f32(half_at(*mn, r * groups + g)) : 0.0f);
  }
  return w;
}

// Every width (2, 3, 4, 5, 6, 8 bits) becomes Gyre's kernel layout (QPACKED,
// backend/cpu/qlinear_ref.h) with the same group size, symmetry and f16 scales/mins, so the values
// are the file's exactly and the memory cost is the file's bits per weight. The file's bit stream
// is repacked here (rather than read by the kernels) because a plain stream makes 3/5/6-bit
// values straddle words; the split-plane layout keeps every GPU extraction one shift and mask.
// A mix becomes a QMixedHost (backend/cpu/qmixed.h) of two such weights (hi first).
// A rotated layer's NAME.had_signs (I16 [cols], each +1 or -1; see backend/cpu/hadamard.h).
HadamardRotation read_rotation(const Layer& l, const WeightSet& raw, const std::string& where) {
  HadamardRotation r;
  if (l.hadamard == 0) {
    GYRE_CHECK(!raw.has(l.name + ".had_signs"), where, ": layer '", l.name,
               "' has hadamard signs but no hadamard block in its quantization_config entry");
    return r;
  }
  const TensorView& t = part(raw, l.name + ".had_signs", DType::I16, {l.cols}, where);
  r.block = l.hadamard;
  r.signs.resize(static_cast<size_t>(l.cols));
  for (int64_t c = 0; c < l.cols; ++c) {
    int16_t v;
    std::memcpy(&v, static_cast<const uint8_t*>(t.data) + c * 2, 2);
    GYRE_CHECK(v == 1 || v == -1, where, ": '", l.name, ".had_signs' holds ", v, " at column ", c,
               ", not +1 or -1");
    r.signs[static_cast<size_t>(c)] = static_cast<int8_t>(v);
  }
  hadamard_validate(r, l.cols, where + ": layer '" + l.name + "'");
  return r;
}

// A trellis layer's tiles and scales are copied as they are: the file's I32 [rows/16,
// (cols/16)*8K] is exactly QWeightHost's tile-row-major words (qlinear_ref.h), so nothing is
// repacked. The shapes are checked against the file before anything is allocated.
std::shared_ptr<QWeightHost> read_trellis(const Layer& l, const WeightSet& raw,
                                          const std::string& where) {
  const int64_t tile_rows = l.rows / kTrellisTileDim;
  const int64_t row_words = l.cols / kTrellisTileDim * trellis_tile_words(l.st.bits);
  const TensorView& qw = part(raw, l.name + ".qweight", DType::I32, {tile_rows, row_words}, where);
  const TensorView& sc =
      part(raw, l.name + ".scales", DType::F16, {l.rows, l.cols / l.st.group_size}, where);
  GYRE_CHECK(!raw.has(l.name + ".mins"), where, ": trellis-coded layer '", l.name, "' has mins");
  QWeightDesc d;
  d.bits = l.st.bits;
  d.group_size = l.st.group_size;
  d.trellis = true;
  d.rows = static_cast<int>(l.rows);
  d.cols = static_cast<int>(l.cols);
  auto w = std::make_shared<QWeightHost>(qweight_allocate(d));
  std::memcpy(w->qweight.data(), qw.data, w->qweight.size());  // sizes equal: part() checked
  std::memcpy(w->scales.data(), sc.data, w->scales.size());
  w->had = read_rotation(l, raw, where);
  return w;
}

void materialize(const Layer& l, const WeightSet& raw, WeightSet& out, const std::string& where) {
  if (!l.st.mixed()) {
    std::shared_ptr<QWeightHost> w;
    if (l.st.trellis) {
      w = read_trellis(l, raw, where);
    } else {
      w = read_part(raw, l.name, l.st, l.rows, l.cols, where);
      w->had = read_rotation(l, raw, where);
    }
    out.add(qweight_view(l.name + ".weight", *w));
    out.keep_owner(std::move(w));
    return;
  }
  const int gs = l.st.group_size;
  const int64_t groups = l.cols / gs;
  const TensorView& hg = part(raw, l.name + ".hi_groups", DType::I32, {l.hi_groups}, where);
  std::vector<int32_t> hi_groups(static_cast<size_t>(l.hi_groups));
  std::memcpy(hi_groups.data(), hg.data, hi_groups.size() * 4);
  for (size_t i = 0; i < hi_groups.size(); ++i)
    GYRE_CHECK(
        hi_groups[i] >= 0 && hi_groups[i] < groups && (i == 0 || hi_groups[i] > hi_groups[i - 1]),
        where, ": '", l.name, ".hi_groups' must be increasing group indices below ", groups);
  auto m = std::make_shared<QMixedHost>();
  m->rows = static_cast<int>(l.rows);
  m->cols = static_cast<int>(l.cols);
  std::vector<char> is_hi(static_cast<size_t>(groups), 0);
  for (int32_t g : hi_groups) is_hi[g] = 1;
  std::vector<int32_t> hi_cols, lo_cols;
  for (int64_t c = 0; c < l.cols; ++c)
    (is_hi[c / gs] ? hi_cols : lo_cols).push_back(static_cast<int32_t>(c));
  const auto n_hi = static_cast<int64_t>(hi_cols.size());
  auto hi = read_part(raw, l.name + ".hi", l.st.part(true), l.rows, n_hi, where);
  auto lo = read_part(raw, l.name, l.st.part(false), l.rows, l.cols - n_hi, where);
  m->parts.push_back({std::move(*hi), std::move(hi_cols)});
  m->parts.push_back({std::move(*lo), std::move(lo_cols)});
  m->had = read_rotation(l, raw, where);
  qmixed_validate(*m);
  out.add(qmixed_view(l.name + ".weight", *m));
  out.keep_owner(std::move(m));
}

}  // namespace

bool is_gyre_quantized(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("quantization_config")) return false;
  const auto& q = config["quantization_config"];
  return q.is_object() && q.contains("quant_method") && q["quant_method"] == "gyre";
}

void gyre_quant_load(const nlohmann::json& config, const WeightSet& raw, WeightSet& out,
                     const std::string& where) {
  const auto& qc = config["quantization_config"];
  GYRE_CHECK(qc.contains("version") && qc["version"].is_number_integer() &&
                 qc["version"].get<int64_t>() >= 1 && qc["version"].get<int64_t>() <= 4,
             where, ": unsupported gyre quantization version (this build reads versions 1 to 4)");
  const int version = qc["version"].get<int>();
  GYRE_CHECK(qc.contains("layers") && qc["layers"].is_object() && !qc["layers"].empty(), where,
             ": quantization_config has no layers object");
  std::set<std::string> parts;
  for (const auto& [name, j] : qc["layers"].items()) {
    const Layer l = parse_layer(name, j, version, where);
    GYRE_CHECK(!raw.has(name + ".weight"), where, ": layer '", name,
               "' is both quantized and stored as a plain weight");
    materialize(l, raw, out, where);
    for (const char* s : {".qweight", ".scales", ".mins", ".had_signs"}) parts.insert(name + s);
    if (l.st.mixed())
      for (const char* s : {".hi.qweight", ".hi.scales", ".hi.mins", ".hi_groups"})
        parts.insert(name + s);
  }
  for (const auto& [name, t] : raw.all()) {
    if (parts.count(name) != 0) continue;
    GYRE_CHECK(t.dtype != DType::I32, where, ": tensor '", name,
               "' is packed but no quantization_config layer names it");
    out.add(t);
  }
}

}  // namespace gyre
