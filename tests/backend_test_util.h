// Test helpers shared by the backend op tests (CPU and CUDA): FP16-exact random values, host
// activations uploaded to a backend, results read back, and the relative L2 error.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"

namespace gyre::btest {

// Uniform in [-scale, scale), rounded through FP16 so both backends see the same values.
inline std::vector<float> random_f16(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = f16_to_f32(f32_to_f16(u(rng)));
  return v;
}

// An activation uploaded to a backend; the host values stay alive with it (the CPU backend may
// use them in place).
struct Act {
  Tensor t;
  std::shared_ptr<std::vector<float>> data = nullptr;
};
inline Act upload(Backend& b, const std::vector<float>& values, int64_t rows, int64_t cols) {
  auto v = std::make_shared<std::vector<float>>(values);
  TensorView view;
  view.name = "test";
  view.dtype = DType::F32;
  view.shape = {rows, cols};
  view.data = v->data();
  view.nbytes = v->size() * sizeof(float);
  return {b.upload_weight(view), v};
}

inline std::vector<float> host(Backend& b, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.rows * t.cols));
  b.to_host(t, v.data());
  return v;
}

// ||got - want|| / ||want|| (infinite when got holds a NaN or an infinity, or the sizes differ).
template <typename T>
double rel_error(const std::vector<float>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    num += d * d;
    den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// max |got - want| / max |want| (infinite on a NaN or an infinity in got, or a size mismatch).
template <typename T>
double max_rel_error(const std::vector<float>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num = std::max(num, std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
    den = std::max(den, std::fabs(static_cast<double>(want[i])));
  }
  return num / std::max(den, 1e-30);
}

// One activation on two backends (the CPU backend may keep the host data: the pair owns it).
struct Pair {
  Tensor cpu, gpu;
  std::shared_ptr<std::vector<float>> data = nullptr;
};
inline Pair upload_pair(Backend& cpu, Backend& gpu, std::vector<float> values, int64_t rows,
                        int64_t cols) {
  auto v = std::make_shared<std::vector<float>>(std::move(values));
  TensorView t;
  t.name = "test";
  t.dtype = DType::F32;
  t.shape = {rows, cols};
  t.data = v->data();
  t.nbytes = v->size() * sizeof(float);
  return {cpu.upload_weight(t), gpu.upload_weight(t), v};
}

// The GPU side of a pair against its CPU side.
inline double rel_error(Backend& cpu, Backend& gpu, const Pair& p) {
  return rel_error(host(gpu, p.gpu), host(cpu, p.cpu));
}

}  // namespace gyre::btest
