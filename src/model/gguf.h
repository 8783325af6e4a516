// GGUF container parser (versions 2 and 3, little-endian). Layout: "GGUF", u32 version,
// u64 tensor count, u64 metadata count; metadata as (string key, u32 value type, value);
// tensor infos as (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset); then
// the data section at the next multiple of general.alignment (default 32), each tensor at its
// offset from there. Strings are u64 length + bytes. Every count, length, offset and size is
// checked against the buffer before use; nothing is copied out of it except names.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace gyre {

enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value. Scalars are widened into u/i/f; strings and the elements of arrays point
// into the parsed buffer.
struct GgufValue {
  GgufType type = GgufType::U8;
  uint64_t u = 0;  // U8..U64 and Bool
  int64_t i = 0;   // I8..I64
  double f = 0.0;  // F32, F64
  std::string_view str;
  // Arrays: element type and count; numeric elements are `count` raw little-endian values at
  // `raw`, string elements are in `strings`, nested arrays in `arrays`.
  GgufType elem_type = GgufType::U8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;
  std::vector<std::string_view> strings;
  std::vector<GgufValue> arrays;

  bool is_int() const;    // any integer type (not Bool)
  bool is_float() const;  // F32 or F64
  // Element k of a numeric array, widened; throws on a non-numeric element type.
  int64_t elem_int(uint64_t k) const;
  double elem_float(uint64_t k) const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // GGUF order: ne[0] is the innermost (contiguous) dimension
  uint32_t ggml_type = 0;
  std::optional<DType> dtype;  // empty when Gyre has no DType for this ggml type
  uint64_t offset = 0;         // from the start of the data section
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

// Name of a ggml tensor type ("Q4_K", "IQ2_XS", ...) or "unknown type N".
std::string ggml_type_name(uint32_t type);

class GgufFile {
 public:
  // Maps the file (no copy) and parses it. Throws gyre::Error naming the path.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses bytes the caller keeps alive for the lifetime of the result; `name` is used in
  // error messages.
  static std::unique_ptr<GgufFile> parse(const uint8_t* data, size_t size, const std::string& name);

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }
  const std::string& name() const { return name_; }
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  std::shared_ptr<MappedFile> file() const { return file_; }

  const GgufValue* find(std::string_view key) const;  // null when absent
  // Typed getters: nullopt when absent, gyre::Error when present with another type.
  std::optional<int64_t> get_int(std::string_view key) const;   // any integer type
  std::optional<double> get_float(std::string_view key) const;  // float or integer
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  const GgufValue* get_array(std::string_view key, GgufType elem_type) const;  // null if absent

 private:
  GgufFile() = default;
  std::string name_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t, std::less<>> index_;
  std::vector<GgufTensorInfo> tensors_;
  std::shared_ptr<MappedFile> file_;

  friend class GgufParser;
};

}  // namespace gyre
