#include "model/gguf.h"

#include <array>
#include <cstring>

#include "core/error.h"

namespace gyre {

namespace {

// Hostile files must not make us allocate or loop without bound; real models stay far below.
constexpr uint64_t kMaxTensors = 1u << 20;
constexpr int kMaxArrayDepth = 8;
constexpr int kMaxDims = 4;
constexpr uint64_t kMaxElems = 1ull << 42;  // per tensor

struct GgmlTypeInfo {
  const char* name;  // nullptr: no such type
  int block_elems;
  int block_bytes;
  std::optional<DType> dtype;
};

// ggml's tensor type numbering (ids 4, 5, 31-33 and 36-38 are retired).
const GgmlTypeInfo& ggml_info(uint32_t t) {
  static const std::array<GgmlTypeInfo, 42> kTypes = {{
      {"F32", 1, 4, DType::F32},
      {"F16", 1, 2, DType::F16},
      {"Q4_0", 32, 18, DType::Q4_0},
      {"Q4_1", 32, 20, DType::Q4_1},
      {nullptr, 0, 0, {}},
      {nullptr, 0, 0, {}},
      {"Q5_0", 32, 22, {}},
      {"Q5_1", 32, 24, {}},
      {"Q8_0", 32, 34, DType::Q8_0},
      {"Q8_1", 32, 36, {}},
      {"Q2_K", 256, 84, {}},
      {"Q3_K", 256, 110, {}},
      {"Q4_K", 256, 144, DType::Q4_K},
      {"Q5_K", 256, 176, DType::Q5_K},
      {"Q6_K", 256, 210, DType::Q6_K},
      {"Q8_K", 256, 292, {}},
      {"IQ2_XXS", 256, 66, {}},
      {"IQ2_XS", 256, 74, {}},
      {"IQ3_XXS", 256, 98, {}},
      {"IQ1_S", 256, 50, {}},
      {"IQ4_NL", 32, 18, {}},
      {"IQ3_S", 256, 110, {}},
      {"IQ2_S", 256, 82, {}},
      {"IQ4_XS", 256, 136, {}},
      {"I8", 1, 1, {}},
      {"I16", 1, 2, {}},
      {"I32", 1, 4, DType::I32},
      {"I64", 1, 8, {}},
      {"F64", 1, 8, {}},
      {"IQ1_M", 256, 56, {}},
      {"BF16", 1, 2, DType::BF16},
      {nullptr, 0, 0, {}},
      {nullptr, 0, 0, {}},
      {nullptr, 0, 0, {}},
      {"TQ1_0", 256, 54, {}},
      {"TQ2_0", 256, 66, {}},
      {nullptr, 0, 0, {}},
      {nullptr, 0, 0, {}},
      {nullptr, 0, 0, {}},
      {"MXFP4", 32, 17, {}},
      {"NVFP4", 64, 36, {}},
      {"Q1_0", 128, 18, {}},
  }};
  static const GgmlTypeInfo kUnknown = {nullptr, 0, 0, {}};
  return t < kTypes.size() ? kTypes[t] : kUnknown;
}

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::Bool:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    default:
      return 0;  // String, Array: variable
  }
}

template <typename T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86/ARM hosts are little-endian, as GGUF is
  return v;
}

// Reads a scalar of type t at p into v's u/i/f fields.
void decode_scalar(GgufType t, const uint8_t* p, GgufValue& v) {
  switch (t) {
    case GgufType::U8:
      v.u = p[0];
      break;
    case GgufType::Bool:
      v.u = p[0] != 0;
      break;
    case GgufType::I8:
      v.i = static_cast<int8_t>(p[0]);
      break;
    case GgufType::U16:
      v.u = load_le<uint16_t>(p);
      break;
    case GgufType::I16:
      v.i = load_le<int16_t>(p);
      break;
    case GgufType::U32:
      v.u = load_le<uint32_t>(p);
      break;
    case GgufType::I32:
      v.i = load_le<int32_t>(p);
      break;
    case GgufType::U64:
      v.u = load_le<uint64_t>(p);
      break;
    case GgufType::I64:
      v.i = load_le<int64_t>(p);
      break;
    case GgufType::F32:
      v.f = load_le<float>(p);
      break;
    case GgufType::F64:
      v.f = load_le<double>(p);
      break;
    default:
      break;
  }
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "invalid";
}

std::string ggml_type_name(uint32_t type) {
  const GgmlTypeInfo& info = ggml_info(type);
  return info.name != nullptr ? info.name : "unknown type " + std::to_string(type);
}

bool GgufValue::is_int() const {
  return type != GgufType::Bool && type != GgufType::String && type != GgufType::Array &&
         type != GgufType::F32 && type != GgufType::F64;
}
bool GgufValue::is_float() const {
  return type == GgufType::F32 || type == GgufType::F64;
}

int64_t GgufValue::elem_int(uint64_t k) const {
  GYRE_CHECK(type == GgufType::Array && k < count, "GGUF array index ", k, " out of range");
  GgufValue e;
  e.type = elem_type;
  GYRE_CHECK(e.is_int() || elem_type == GgufType::Bool, "GGUF array of ", gguf_type_name(elem_type),
             " read as integers");
  decode_scalar(elem_type, raw + k * scalar_size(elem_type), e);
  const bool is_signed = elem_type == GgufType::I8 || elem_type == GgufType::I16 ||
                         elem_type == GgufType::I32 || elem_type == GgufType::I64;
  return is_signed ? e.i : static_cast<int64_t>(e.u);
}

double GgufValue::elem_float(uint64_t k) const {
  GYRE_CHECK(type == GgufType::Array && k < count, "GGUF array index ", k, " out of range");
  if (elem_type != GgufType::F32 && elem_type != GgufType::F64)
    return static_cast<double>(elem_int(k));
  GgufValue e;
  decode_scalar(elem_type, raw + k * scalar_size(elem_type), e);
  return e.f;
}

// Parses one buffer; every read goes through need(), which checks the bytes are there.
class GgufParser {
 public:
  GgufParser(const uint8_t* data, size_t size, GgufFile& out)
      : data_(data), size_(size), out_(out) {}

  void run() {
    const std::string& name = out_.name_;
    GYRE_CHECK(size_ >= 4 && std::memcmp(data_, "GGUF", 4) == 0, name,
               ": not a GGUF file (bad magic)");
    pos_ = 4;
    const uint32_t version = u32();
    GYRE_CHECK(version != 1, name,
               ": GGUF version 1 is not supported (re-convert the model with a current llama.cpp)");
    GYRE_CHECK((version & 0xffff) != 0, name, ": big-endian GGUF files are not supported");
    GYRE_CHECK(version == 2 || version == 3, name, ": unsupported GGUF version ", version,
               " (Gyre reads versions 2 and 3)");
    out_.version_ = version;
    const uint64_t n_tensors = u64();
    const uint64_t n_kv = u64();
    // Each metadata entry takes at least 13 bytes and each tensor info at least 24.
    GYRE_CHECK(n_kv <= remaining() / 13, name, ": metadata count ", n_kv,
               " is impossible for a file of ", size_, " bytes");
    GYRE_CHECK(n_tensors <= kMaxTensors && n_tensors <= remaining() / 24, name, ": tensor count ",
               n_tensors, " is impossible for a file of ", size_, " bytes");
    for (uint64_t k = 0; k < n_kv; ++k) read_kv();
    read_alignment();
    for (uint64_t k = 0; k < n_tensors; ++k) read_tensor_info();
    place_tensors();
  }

 private:
  size_t remaining() const { return size_ - pos_; }

  const uint8_t* need(uint64_t n, const char* what) {
    GYRE_CHECK(n <= remaining(), out_.name_, ": truncated at byte ", pos_, " (", what, " needs ", n,
               " bytes, ", remaining(), " left)");
    const uint8_t* p = data_ + pos_;
    pos_ += static_cast<size_t>(n);
    return p;
  }
  uint32_t u32() { return load_le<uint32_t>(need(4, "u32")); }
  uint64_t u64() { return load_le<uint64_t>(need(8, "u64")); }
  std::string_view str(const char* what) {
    const uint64_t len = u64();
    const uint8_t* p = need(len, what);
    return {reinterpret_cast<const char*>(p), static_cast<size_t>(len)};
  }

  GgufType value_type(const std::string& key) {
    const uint32_t t = u32();
    GYRE_CHECK(t <= static_cast<uint32_t>(GgufType::F64), out_.name_, ": metadata '", key,
               "' has invalid value type ", t);
    return static_cast<GgufType>(t);
  }

  GgufValue read_value(GgufType t, const std::string& key, int depth) {
    GgufValue v;
    v.type = t;
    if (t == GgufType::String) {
      v.str = str("string");
    } else if (t == GgufType::Array) {
      GYRE_CHECK(depth < kMaxArrayDepth, out_.name_, ": metadata '", key,
                 "' nests arrays too deeply");
      v.elem_type = value_type(key);
      v.count = u64();
      const size_t elem = scalar_size(v.elem_type);
      // Strings take at least 8 bytes, nested arrays 12; numbers their size.
      const size_t min_elem = elem != 0 ? elem : (v.elem_type == GgufType::String ? 8 : 12);
      GYRE_CHECK(v.count <= remaining() / min_elem, out_.name_, ": metadata '", key, "' claims ",
                 v.count, " elements, more than the file holds");
      if (elem != 0) {
        v.raw = need(v.count * elem, "array");
      } else if (v.elem_type == GgufType::String) {
        v.strings.reserve(static_cast<size_t>(v.count));
        for (uint64_t k = 0; k < v.count; ++k) v.strings.push_back(str("string"));
      } else {
        v.arrays.reserve(static_cast<size_t>(v.count));
        for (uint64_t k = 0; k < v.count; ++k)
          v.arrays.push_back(read_value(GgufType::Array, key, depth + 1));
      }
    } else {
      decode_scalar(t, need(scalar_size(t), gguf_type_name(t)), v);
    }
    return v;
  }

  void read_kv() {
    std::string key(str("metadata key"));
    GYRE_CHECK(out_.index_.count(key) == 0, out_.name_, ": metadata key '", key, "' appears twice");
    const GgufType t = value_type(key);
    GgufValue v = read_value(t, key, 0);
    out_.index_.emplace(key, out_.kv_.size());
    out_.kv_.emplace_back(std::move(key), std::move(v));
  }

  void read_alignment() {
    const GgufValue* a = out_.find("general.alignment");
    if (a == nullptr) return;
    GYRE_CHECK(
        a->type == GgufType::U32 && a->u != 0 && (a->u & (a->u - 1)) == 0 && a->u <= (1u << 20),
        out_.name_, ": general.alignment must be a u32 power of two");
    out_.alignment_ = static_cast<size_t>(a->u);
  }

  void read_tensor_info() {
    GgufTensorInfo t;
    t.name = std::string(str("tensor name"));
    const std::string where = out_.name_ + ": tensor '" + t.name + "'";
    const uint32_t n_dims = u32();
    GYRE_CHECK(n_dims >= 1 && n_dims <= kMaxDims, where, " has ", n_dims,
               " dimensions (1 to 4 allowed)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = u64();
      GYRE_CHECK(n <= kMaxElems && (n == 0 || numel <= kMaxElems / n), where,
                 " has an absurd shape");
      numel *= n;
      t.ne.push_back(static_cast<int64_t>(n));
    }
    t.ggml_type = u32();
    const GgmlTypeInfo& info = ggml_info(t.ggml_type);
    GYRE_CHECK(info.name != nullptr, where, " has unknown tensor type ", t.ggml_type);
    t.dtype = info.dtype;
    GYRE_CHECK(t.ne[0] % info.block_elems == 0, where, " has rows of ", t.ne[0],
               " elements, not a multiple of ", info.name, "'s block of ", info.block_elems);
    t.nbytes = static_cast<size_t>(numel / static_cast<uint64_t>(info.block_elems) *
                                   static_cast<uint64_t>(info.block_bytes));
    t.offset = u64();
    GYRE_CHECK(t.offset % out_.alignment_ == 0, where, " has offset ", t.offset,
               ", not a multiple of the alignment ", out_.alignment_);
    for (const auto& other : out_.tensors_)
      GYRE_CHECK(other.name != t.name, where, " appears twice");
    out_.tensors_.push_back(std::move(t));
  }

  void place_tensors() {
    const size_t align = out_.alignment_;
    const uint64_t start = (static_cast<uint64_t>(pos_) + align - 1) / align * align;
    if (out_.tensors_.empty()) {
      out_.data_offset_ = std::min<uint64_t>(start, size_);
      return;
    }
    GYRE_CHECK(start <= size_, out_.name_, ": data section starts at ", start,
               ", past the end of the file (", size_, " bytes)");
    out_.data_offset_ = static_cast<size_t>(start);
    const uint64_t data_size = size_ - start;
    for (auto& t : out_.tensors_) {
      GYRE_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset, out_.name_,
                 ": tensor '", t.name, "' (", t.nbytes, " bytes at data offset ", t.offset,
                 ") runs past the end of the file");
      t.data = data_ + start + t.offset;
    }
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  GgufFile& out_;
};

std::unique_ptr<GgufFile> GgufFile::parse(const uint8_t* data, size_t size,
                                          const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->name_ = name;
  GgufParser(data, size, *f).run();
  return f;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  auto mapped = std::make_shared<MappedFile>(path);
  auto f = parse(mapped->data(), mapped->size(), path);
  f->file_ = std::move(mapped);
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &kv_[it->second].second;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  GYRE_CHECK(v->is_int(), name_, ": metadata '", key, "' is ", gguf_type_name(v->type),
             ", expected an integer");
  const bool is_signed = v->type == GgufType::I8 || v->type == GgufType::I16 ||
                         v->type == GgufType::I32 || v->type == GgufType::I64;
  if (is_signed) return v->i;
  GYRE_CHECK(v->u <= static_cast<uint64_t>(INT64_MAX), name_, ": metadata '", key,
             "' is out of range");
  return static_cast<int64_t>(v->u);
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->is_float()) return v->f;
  return static_cast<double>(*get_int(key));
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  GYRE_CHECK(v->type == GgufType::Bool, name_, ": metadata '", key, "' is ",
             gguf_type_name(v->type), ", expected bool");
  return v->u != 0;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  GYRE_CHECK(v->type == GgufType::String, name_, ": metadata '", key, "' is ",
             gguf_type_name(v->type), ", expected a string");
  return std::string(v->str);
}

const GgufValue* GgufFile::get_array(std::string_view key, GgufType elem_type) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return nullptr;
  GYRE_CHECK(v->type == GgufType::Array, name_, ": metadata '", key, "' is ",
             gguf_type_name(v->type), ", expected an array");
  const bool numeric_ok = scalar_size(elem_type) != 0 && scalar_size(v->elem_type) != 0 &&
                          elem_type != GgufType::Bool && v->elem_type != GgufType::Bool;
  GYRE_CHECK(v->elem_type == elem_type || numeric_ok, name_, ": metadata '", key,
             "' is an array of ", gguf_type_name(v->elem_type), ", expected ",
             gguf_type_name(elem_type));
  return v;
}

}  // namespace gyre
