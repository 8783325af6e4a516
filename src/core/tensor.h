// A host tensor as read from a model file: a non-owning view into a mapped file (or into a buffer
// the loader owns). Shapes are in PyTorch order, outermost first: a linear weight is [out, in].
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace gyre {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t rows() const { return shape.size() <= 1 ? 1 : numel() / shape.back(); }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
};

std::string shape_str(const std::vector<int64_t>& shape);

// A view of float data owned elsewhere (the quantizer's and the fused weights' F32 matrices).
inline TensorView f32_view(std::string name, const std::vector<float>& v,
                           std::vector<int64_t> shape) {
  TensorView t;
  t.name = std::move(name);
  t.dtype = DType::F32;
  t.shape = std::move(shape);
  t.data = v.data();
  t.nbytes = v.size() * sizeof(float);
  return t;
}

// Converts any dtype (including the quantized block types) of one row of n elements to floats.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

}  // namespace gyre
