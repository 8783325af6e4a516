#include "model/safetensors.h"

#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace gyre {

namespace {

DType st_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "I32") return DType::I32;
  if (s == "I16") return DType::I16;
  fail(where, ": unsupported dtype '", s, "' (Gyre reads F32, F16, BF16, I32 and I16)");
}

}  // namespace

void safetensors_parse(const uint8_t* data, size_t size, const std::string& name, WeightSet& out) {
  GYRE_CHECK(size >= 8, name, ": file too short for a safetensors header (", size, " bytes)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  GYRE_CHECK(header_len <= size - 8, name, ": header length ", header_len,
             " runs past the end of the file (", size, " bytes)");
  GYRE_CHECK(header_len <= (100u << 20), name, ": header of ", header_len, " bytes is too large");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(data + 8, data + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    fail(name, ": malformed safetensors header: ", e.what());
  }
  GYRE_CHECK(header.is_object(), name, ": safetensors header is not a JSON object");
  const uint8_t* base = data + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  for (const auto& [key, info] : header.items()) {
    if (key == "__metadata__") continue;
    const std::string where = name + ": tensor '" + key + "'";
    GYRE_CHECK(info.is_object() && info.contains("dtype") && info["dtype"].is_string() &&
                   info.contains("shape") && info["shape"].is_array() &&
                   info.contains("data_offsets") && info["data_offsets"].is_array() &&
                   info["data_offsets"].size() == 2,
               where, " has a malformed entry");
    TensorView t;
    t.name = key;
    t.dtype = st_dtype(info["dtype"].get<std::string>(), where);
    uint64_t numel = 1;
    for (const auto& d : info["shape"]) {
      GYRE_CHECK(d.is_number_unsigned(), where, " has a non-integer or negative dimension");
      const uint64_t v = d.get<uint64_t>();
      GYRE_CHECK(v < (1ull << 40) && (v == 0 || numel <= (1ull << 40) / v), where,
                 " has an absurd shape");
      numel *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = info["data_offsets"];
    GYRE_CHECK(off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
               " has malformed data_offsets");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    GYRE_CHECK(begin <= end && end <= data_size, where, " has data offsets [", begin, ", ", end,
               ") outside the ", data_size, " bytes of data");
    const uint64_t want = numel * static_cast<uint64_t>(dtype_info(t.dtype).block_bytes);
    GYRE_CHECK(end - begin == want, where, " of shape ", shape_str(t.shape), " needs ", want,
               " bytes but its offsets span ", end - begin);
    t.data = base + begin;
    t.nbytes = static_cast<size_t>(want);
    out.add(std::move(t));
  }
}

void safetensors_load(const std::string& path, WeightSet& out) {
  auto file = std::make_shared<MappedFile>(path);
  safetensors_parse(file->data(), file->size(), path, out);
  out.keep(std::move(file));
}

}  // namespace gyre
