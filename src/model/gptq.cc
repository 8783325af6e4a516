#include "model/gptq.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"

namespace gyre {

namespace {

// Element i of an I32 tensor (file data may be unaligned).
int32_t load_i32(const TensorView& t, int64_t i) {
  int32_t v;
  std::memcpy(&v, static_cast<const uint8_t*>(t.data) + i * 4, 4);
  return v;
}

void check_tensor(const TensorView& t, const std::string& name, DType dtype, int64_t d0,
                  int64_t d1) {
  std::vector<int64_t> want = {d0};
  if (d1 >= 0) want.push_back(d1);
  GYRE_CHECK(t.dtype == dtype, "GPTQ layer ", name, ": ", t.name, " is ", dtype_name(t.dtype),
             ", expected ", dtype_name(dtype));
  GYRE_CHECK(t.shape == want, "GPTQ layer ", name, ": ", t.name, " has shape ", shape_str(t.shape),
             ", expected ", shape_str(want));
  GYRE_CHECK(t.data != nullptr && t.nbytes >= dtype_row_bytes(dtype, t.numel()), "GPTQ layer ",
             name, ": ", t.name, " has too few bytes for its shape");
}

// Value i of a little-endian bit stream of `bits`-bit values laid over words word(0), word(1),
// ...: bits [i * bits, (i + 1) * bits) of the stream. For 2/4/8 bits this is "value i % k at bits
// (i % k) * bits of word i / k"; 3-bit values straddle words (32 values per 3 words).
template <typename WordAt>
int stream_value(WordAt word, int64_t i, int bits) {
  const int64_t bit = i * bits;
  uint64_t v = static_cast<uint32_t>(word(bit / 32));
  if (bit % 32 + bits > 32)
    v |= static_cast<uint64_t>(static_cast<uint32_t>(word(bit / 32 + 1))) << 32;
  return static_cast<int>((v >> (bit % 32)) & ((1u << bits) - 1));
}

// The largest group size Gyre's kernels support that divides `group` (0 when none).
int gyre_group_for(int group, int bits) {
  for (int g : {256, 128, 64, 32, 16})
    if (group % g == 0 && (g >= 32 || bits == 8)) return g;
  return 0;
}

}  // namespace

bool gptq_config_from_hf(const nlohmann::json& config, GptqConfig& out) {
  if (!config.is_object() || !config.contains("quantization_config")) return false;
  const nlohmann::json& q = config["quantization_config"];
  GYRE_CHECK(q.is_object(), "config.json: quantization_config is not an object");
  const std::string method = q.value("quant_method", std::string());
  if (method != "gptq") {
    fail("config.json: quantization method '", method, "' is not supported (GPTQ is)");
  }
  try {
    out.bits = q.value("bits", 4);
    out.group_size = q.value("group_size", 128);
    out.desc_act = q.value("desc_act", false);
    const std::string format = q.value("checkpoint_format", std::string("gptq"));
    GYRE_CHECK(format == "gptq" || format == "gptq_v2", "GPTQ checkpoint_format '", format,
               "' is not supported (gptq and gptq_v2 are)");
    out.zeros_v2 = format == "gptq_v2";
    GYRE_CHECK(!q.value("is_marlin_format", false), "GPTQ in marlin format is not supported");
  } catch (const nlohmann::json::exception& e) {
    fail("config.json: malformed quantization_config: ", e.what());
  }
  GYRE_CHECK(out.bits == 2 || out.bits == 3 || out.bits == 4 || out.bits == 8, "GPTQ with ",
             out.bits, " bits is not supported (2, 3, 4 and 8 are)");
  GYRE_CHECK(out.group_size == -1 || (out.group_size > 0 && out.group_size <= (1 << 20)),
             "GPTQ group_size ", out.group_size, " is invalid");
  return true;
}

QWeightHost gptq_layer_to_qweight(const GptqConfig& c, const std::string& name,
                                  const TensorView& qweight, const TensorView& qzeros,
                                  const TensorView& scales, const TensorView* g_idx) {
  GYRE_CHECK(c.bits == 2 || c.bits == 3 || c.bits == 4 || c.bits == 8, "GPTQ layer ", name, ": ",
             c.bits, " bits is not supported");
  GYRE_CHECK(qweight.shape.size() == 2 && qweight.shape[0] > 0 && qweight.shape[1] > 0,
             "GPTQ layer ", name, ": qweight has shape ", shape_str(qweight.shape),
             ", expected [in * bits / 32, out]");
  // 2/4/8 bits fill whole words (16/8/4 inputs each); 3 bits pack 32 inputs per 3 words.
  GYRE_CHECK(c.bits != 3 || qweight.shape[0] % 3 == 0, "GPTQ layer ", name, ": qweight has ",
             qweight.shape[0], " rows, not a multiple of 3 (3-bit packs 32 inputs per 3 words)");
  GYRE_CHECK(qweight.shape[0] <= (INT32_MAX / 2) / 32 && qweight.shape[1] <= INT32_MAX / 2 &&
                 qweight.shape[0] * 32 * qweight.shape[1] <= (int64_t{1} << 40),
             "GPTQ layer ", name, ": qweight shape ", shape_str(qweight.shape), " is too large");
  const int64_t in = qweight.shape[0] * 32 / c.bits, out = qweight.shape[1];
  check_tensor(qweight, name, DType::I32, qweight.shape[0], out);
  GYRE_CHECK(out * c.bits % 32 == 0, "GPTQ layer ", name, ": ", out,
             " output columns do not pack into whole qzeros words at ", c.bits, " bits");
  const int64_t zero_words = out * c.bits / 32;
  const int64_t group = c.group_size == -1 ? in : c.group_size;
  GYRE_CHECK(in % group == 0, "GPTQ layer ", name, ": ", in,
             " input columns are not a multiple of group_size ", group);
  const int64_t groups = in / group;
  const int gyre_group = gyre_group_for(static_cast<int>(group), c.bits);
  GYRE_CHECK(gyre_group != 0, "GPTQ layer ", name, ": group size ", group, " is not a multiple of ",
             c.bits == 8 ? 16 : 32, " (unsupported)");
  check_tensor(scales, name, scales.dtype, groups, out);
  GYRE_CHECK(
      scales.dtype == DType::F16 || scales.dtype == DType::BF16 || scales.dtype == DType::F32,
      "GPTQ layer ", name, ": scales are ", dtype_name(scales.dtype), ", expected F16");
  check_tensor(qzeros, name, DType::I32, groups, zero_words);

  // Group of every input column, and the column order that makes groups contiguous.
  std::vector<int32_t> group_of(static_cast<size_t>(in));
  if (g_idx) {
    check_tensor(*g_idx, name, DType::I32, in, -1);
    for (int64_t i = 0; i < in; ++i) {
      group_of[i] = load_i32(*g_idx, i);
      GYRE_CHECK(group_of[i] >= 0 && group_of[i] < groups, "GPTQ layer ", name, ": g_idx[", i,
                 "] = ", group_of[i], " is outside [0, ", groups, ")");
    }
  } else {
    for (int64_t i = 0; i < in; ++i) group_of[i] = static_cast<int32_t>(i / group);
  }
  std::vector<int32_t> perm(static_cast<size_t>(in));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int32_t a, int32_t b) { return group_of[a] < group_of[b]; });
  // Contiguous groups of exactly `group` columns each, or the layout cannot hold it.
  for (int64_t j = 0; j < in; ++j)
    GYRE_CHECK(group_of[perm[j]] == j / group, "GPTQ layer ", name, ": g_idx does not give every ",
               "group exactly ", group, " columns (group ", j / group, ")");
  // Already grouped in order (no act-order shuffle): the stable sort left every column in place.
  const bool identity = std::is_sorted(group_of.begin(), group_of.end());

  // Zero points and scales per (group, output); symmetric when every zero is the midpoint.
  const int32_t zero_bias = c.zeros_v2 ? 0 : 1;
  std::vector<int32_t> zero(static_cast<size_t>(groups * out));
  std::vector<float> scale(static_cast<size_t>(groups * out));
  bool symmetric = scales.dtype == DType::F16;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t o = 0; o < out; ++o) {
      const int32_t z =
          stream_value([&](int64_t w) { return load_i32(qzeros, g * zero_words + w); }, o, c.bits) +
          zero_bias;
      zero[g * out + o] = z;
      symmetric = symmetric && z == (1 << (c.bits - 1));
    }
    dequantize_row(scales.dtype,
                   static_cast<const uint8_t*>(scales.data) +
                       g * static_cast<int64_t>(dtype_row_bytes(scales.dtype, out)),
                   scale.data() + g * out, out);
  }

  QWeightDesc d;
  d.bits = c.bits;
  d.group_size = gyre_group;
  d.asymmetric = !symmetric;
  d.scale_f32 = !symmetric;
  d.has_perm = !identity;
  d.rows = static_cast<int>(out);
  d.cols = static_cast<int>(in);
  QWeightHost w = qweight_allocate(d);
  if (d.has_perm) w.perm = perm;
  for (int64_t j = 0; j < in; ++j) {
    const int64_t i = perm[j];         // packed column j holds input column i
    for (int64_t o = 0; o < out; ++o)  // column o's stream runs down the words [*, o]
      qweight_set_q(
          w, o, j,
          stream_value([&](int64_t k) { return load_i32(qweight, k * out + o); }, i, c.bits));
  }
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in / gyre_group; ++k) {
      const int64_t g = (k * gyre_group) / group;  // the GPTQ group of packed columns of k
      const float s = scale[g * out + o];
      // s * z is exact in f32 for f16/bf16 scales (see the header), so s * q + m == s * (q - z)
      // exactly; F32 scales (not written by GPTQ tools) may differ by an f32 rounding.
      qweight_set_scale(w, o, k, s, -(s * static_cast<float>(zero[g * out + o])));
    }
  }
  return w;
}

void gptq_load_weights(const GptqConfig& c, std::shared_ptr<const WeightSet> raw, WeightSet& out) {
  const std::string suffix = ".qweight";
  std::vector<std::string> prefixes;
  for (const auto& [name, view] : raw->all())
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      prefixes.push_back(name.substr(0, name.size() - suffix.size()));
  GYRE_CHECK(!prefixes.empty(), "GPTQ model has no .qweight tensors");
  std::vector<std::string> consumed;
  for (const std::string& p : prefixes) {
    GYRE_CHECK(raw->has(p + ".qzeros") && raw->has(p + ".scales"), "GPTQ layer ", p,
               " lacks its qzeros or scales");
    const TensorView* g_idx = raw->has(p + ".g_idx") ? &raw->get(p + ".g_idx") : nullptr;
    auto q = std::make_shared<QWeightHost>(gptq_layer_to_qweight(
        c, p, raw->get(p + ".qweight"), raw->get(p + ".qzeros"), raw->get(p + ".scales"), g_idx));
    out.add(qweight_view(p + ".weight", *q));
    out.keep_owner(std::move(q));
    for (const char* part : {".qweight", ".qzeros", ".scales", ".g_idx"})
      consumed.push_back(p + part);
  }
  for (const auto& [name, view] : raw->all())
    if (std::find(consumed.begin(), consumed.end(), name) == consumed.end()) out.add(view);
  out.keep_owner(std::move(raw));
}

}  // namespace gyre
