#include "quant/st_writer.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace gyre::quant {

namespace fs = std::filesystem;

namespace {

// Writes path via path.tmp (filled by `fill`) and a rename.
void write_atomic(const std::string& path, const std::function<void(std::ofstream&)>& fill) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    GYRE_CHECK(f.good(), "cannot write '", tmp, "'");
    fill(f);
    f.flush();
    GYRE_CHECK(f.good(), "writing '", tmp, "' failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  GYRE_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

void put(std::ofstream& f, const void* p, size_t n) {
  f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<StSource>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"producer", "gyre convert"}};
  uint64_t offset = 0;
  for (const StSource& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // data starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));
  write_atomic(path, [&](std::ofstream& f) {
    put(f, len, 8);
    put(f, h.data(), h.size());
    for (const StSource& t : tensors) {
      if (t.data != nullptr || !t.make) {
        put(f, t.data, t.nbytes);
        continue;
      }
      const std::vector<uint8_t> bytes = t.make();
      GYRE_CHECK(bytes.size() == t.nbytes, "tensor ", t.name, ": ", bytes.size(),
                 " bytes made where ", t.nbytes, " were announced");
      put(f, bytes.data(), bytes.size());
    }
  });
}

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors) {
  std::vector<StSource> views;
  views.reserve(tensors.size());
  for (const StTensor& t : tensors)
    views.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  write_safetensors(path, views);
}

std::vector<std::string> write_safetensors_shards(const std::string& dir,
                                                  const std::vector<StSource>& tensors,
                                                  uint64_t max_shard_bytes) {
  GYRE_CHECK(max_shard_bytes > 0, "the shard size must be positive");
  std::vector<std::vector<StSource>> shards(1);
  uint64_t in_shard = 0;
  for (const StSource& t : tensors) {
    if (!shards.back().empty() && in_shard + t.nbytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += t.nbytes;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  GYRE_CHECK(!ec, "cannot create '", dir, "': ", ec.message());
  // Files of an earlier write into this folder would be stale: the loader reads the index when
  // there is one, else model.safetensors.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n == "model.safetensors.index.json" ||
        (n.starts_with("model") && n.ends_with(".safetensors") && e.is_regular_file()))
      fs::remove(e.path(), ec);
  }
  std::vector<std::string> names;
  if (shards.size() == 1) {
    names.push_back("model.safetensors");
    write_safetensors(dir + "/" + names[0], shards[0]);
    return names;
  }
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  uint64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    names.push_back(shard_name(i, shards.size()));
    write_safetensors(dir + "/" + names[i], shards[i]);
    for (const StSource& t : shards[i]) {
      map[t.name] = names[i];
      total += t.nbytes;
    }
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = map;
  write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2));
  return names;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_atomic(path, [&](std::ofstream& f) { put(f, text.data(), text.size()); });
}

}  // namespace gyre::quant
