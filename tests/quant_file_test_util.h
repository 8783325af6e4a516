// Decoding of Gyre's quantized files straight from the format's definition (docs/quantization.md,
// model/gyre_qformat.h), in float64, for the tests that check the converter's output: the
// independent reference for the loader and the backends.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/half.h"
#include "error_test_util.h"
#include "model/gyre_quant_loader.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "quant/convert.h"

namespace gyre::qfile {

// Element c of a row's little-endian bit stream of `bits`-bit values, read bit by bit.
inline int read_bits(const uint8_t* row, int64_t c, int bits) {
  int v = 0;
  for (int b = 0; b < bits; ++b) {
    const int64_t bit = c * bits + b;
    v |= ((row[bit / 8] >> (bit % 8)) & 1) << b;
  }
  return v;
}

// Half i of an F16 tensor (memcpy: file data may be unaligned).
inline double f16_at(const TensorView& t, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(t.data) + i * 2, 2);
  return f16_to_f32(h);
}

// The float64 values [rows][cols] of one width's part PREFIX (PREFIX.qweight / .scales / .mins).
inline std::vector<double> decode_part(const WeightSet& raw, const std::string& prefix, int bits,
                                       int group, bool sym, int64_t rows, int64_t cols) {
  const TensorView& qw = raw.get(prefix + ".qweight");
  const TensorView& sc = raw.get(prefix + ".scales");
  const TensorView* mn = sym ? nullptr : &raw.get(prefix + ".mins");
  EXPECT_EQ(qw.shape, (std::vector<int64_t>{rows, cols * bits / 32}));
  std::vector<double> out(static_cast<size_t>(rows * cols));
  const int64_t groups = cols / group;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const auto* row = static_cast<const uint8_t*>(qw.data) + r * (cols * bits / 8);
      const int q = read_bits(row, c, bits);
      const double s = f16_at(sc, r * groups + c / group);
      out[r * cols + c] =
          sym ? s * (q - (1 << (bits - 1))) : s * q + f16_at(*mn, r * groups + c / group);
    }
  return out;
}

// The float64 weight [rows, cols] of layer NAME as stored (one width, or a mix of two: the hi
// groups' columns from NAME.hi, the others from NAME, in column order), from its
// quantization_config entry j. A rotated layer comes out as stored: (W R)_q.
inline std::vector<double> decode_layer(const WeightSet& raw, const std::string& name,
                                        const nlohmann::json& j) {
  const int bits = j["bits"], group = j["group_size"];
  const bool sym = j["sym"];
  const int64_t rows = j["shape"][0], cols = j["shape"][1];
  if (!j.contains("mix")) return decode_part(raw, name, bits, group, sym, rows, cols);
  const TensorView& hg = raw.get(name + ".hi_groups");
  std::vector<int32_t> hi(static_cast<size_t>(hg.numel()));
  std::memcpy(hi.data(), hg.data, hi.size() * 4);
  EXPECT_EQ(static_cast<int64_t>(hi.size()), j["mix"]["hi_groups"].get<int64_t>());
  std::vector<bool> is_hi(static_cast<size_t>(cols / group), false);
  for (int32_t g : hi) is_hi[g] = true;
  const int64_t hi_cols = static_cast<int64_t>(hi.size()) * group;
  const std::vector<double> h =
      decode_part(raw, name + ".hi", j["mix"]["bits"], group, sym, rows, hi_cols);
  const std::vector<double> l = decode_part(raw, name, bits, group, sym, rows, cols - hi_cols);
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t jh = 0, jl = 0;
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = is_hi[c / group] ? h[r * hi_cols + jh++] : l[r * (cols - hi_cols) + jl++];
  }
  return out;
}

// A converted file tampered with: `edit` changes a copy of its config and a fresh load of
// FOLDER/model.safetensors; loading must then fail with one line mentioning `needle`.
inline void expect_tampered_load_error(const nlohmann::json& config, const std::string& folder,
                                       const std::function<void(nlohmann::json&, WeightSet&)>& edit,
                                       const std::string& needle) {
  nlohmann::json c = config;
  WeightSet raw, out;
  safetensors_load(folder + "/model.safetensors", raw);
  edit(c, raw);
  testutil::expect_one_line_error([&] { gyre_quant_load(c, raw, out, "t"); }, needle);
}

// Options of a quick conversion of stories260K into a fresh TempDir()/NAME (4 calibration rows
// of 64 tokens, 2 threads, the head left out, no progress bar), for the caller to adjust and run.
inline quant::ConvertOptions stories_convert_options(const std::string& name) {
  quant::ConvertOptions o;
  o.model = std::string(GYRE_FIXTURES) + "/stories260K";
  o.out = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(o.out);
  o.rows = 4;
  o.length = 64;
  o.threads = 2;
  o.head_bits = 0;
  o.progress = false;
  return o;
}

}  // namespace gyre::qfile
