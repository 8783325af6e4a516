// Read-only memory map of a whole file. Weights are used in place from the map, never copied.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace gyre {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws gyre::Error naming the path
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Whole file as a string (for JSON and small text files); throws gyre::Error naming the path.
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);

}  // namespace gyre
