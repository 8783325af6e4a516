#include "core/dtype.h"

#include <array>
#include <cctype>
#include <string>

#include "core/error.h"

namespace gyre {

namespace {
constexpr std::array<DTypeInfo, 12> kInfo = {{
    {"F32", 1, 4, false},
    {"F16", 1, 2, false},
    {"BF16", 1, 2, false},
    {"I32", 1, 4, false},
    {"Q8_0", 32, 34, true},
    {"Q4_0", 32, 18, true},
    {"Q4_1", 32, 20, true},
    {"Q4_K", 256, 144, true},
    {"Q5_K", 256, 176, true},
    {"Q6_K", 256, 210, true},
    {"QPACKED", 1, 0, true},
    {"I16", 1, 2, false},
}};
}  // namespace

const DTypeInfo& dtype_info(DType t) {
  const auto i = static_cast<size_t>(t);
  GYRE_CHECK(i < kInfo.size(), "invalid dtype code ", i);
  return kInfo[i];
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  GYRE_CHECK(n >= 0 && n % info.block_elems == 0, "row of ", n, " elements is not a multiple of ",
             info.name, "'s block of ", info.block_elems);
  return static_cast<size_t>(n / info.block_elems) * static_cast<size_t>(info.block_bytes);
}

DType dtype_from_name(std::string_view name) {
  std::string up;
  for (char c : name) up += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (size_t i = 0; i < kInfo.size(); ++i)
    if (up == kInfo[i].name) return static_cast<DType>(i);
  fail("unknown dtype '", name, "'");
}

}  // namespace gyre
