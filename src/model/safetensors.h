// safetensors reader: 8-byte little-endian header length, JSON header of
// {name: {dtype, shape, data_offsets: [begin, end]}}, then raw data. Every offset, size and
// dtype is checked against the file before any view is made.
#pragma once
#include <memory>
#include <string>

#include "model/weights.h"

namespace gyre {

// Adds the file's tensors to `out` as views into the mapped file.
void safetensors_load(const std::string& path, WeightSet& out);

// Same, from bytes in memory (the fuzz target's entry); `name` is used in error messages.
void safetensors_parse(const uint8_t* data, size_t size, const std::string& name, WeightSet& out);

}  // namespace gyre
