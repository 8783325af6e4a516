#include "quant/st_writer.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace gyre::quant {

namespace {

void write_bytes_atomic(const std::string& path,
                        const std::vector<std::pair<const uint8_t*, size_t>>& pieces) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    GYRE_CHECK(f.good(), "cannot write '", tmp, "'");
    for (const auto& [p, n] : pieces)
      f.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n));
    f.flush();
    GYRE_CHECK(f.good(), "writing '", tmp, "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  GYRE_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"producer", "gyre convert"}};
  uint64_t offset = 0;
  for (const StTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // data starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));
  std::vector<std::pair<const uint8_t*, size_t>> pieces = {
      {len, 8}, {reinterpret_cast<const uint8_t*>(h.data()), h.size()}};
  for (const StTensor& t : tensors) pieces.emplace_back(t.bytes.data(), t.bytes.size());
  write_bytes_atomic(path, pieces);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_bytes_atomic(path, {{reinterpret_cast<const uint8_t*>(text.data()), text.size()}});
}

}  // namespace gyre::quant
