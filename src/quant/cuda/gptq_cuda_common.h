// Internals shared by the quantizer's CUDA files (quant/gptq_device.h is the interface).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "core/error.h"

#define GYRE_CUBLAS_CHECK(expr)                                                    \
  do {                                                                             \
    const cublasStatus_t gyre_st_ = (expr);                                        \
    if (gyre_st_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::gyre::fail("cuBLAS error ", static_cast<int>(gyre_st_), " (", #expr, ")"); \
  } while (0)

namespace gyre::quant::cuda {

// A device allocation that only grows (buffers are reused across layers and candidates).
class DevBuf {
 public:
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p_); }
  void* ensure(size_t bytes) {
    if (bytes > bytes_) {
      GYRE_CUDA_CHECK(cudaFree(p_));
      p_ = nullptr;
      bytes_ = 0;
      const cudaError_t e = cudaMalloc(&p_, bytes);
      if (e != cudaSuccess)
        fail("quantizer: cannot allocate ", bytes >> 20, " MiB on the GPU (", cudaGetErrorString(e),
             ")");
      bytes_ = bytes;
    }
    return p_;
  }
  template <typename T>
  T* as(size_t count) {
    return static_cast<T*>(ensure(count * sizeof(T)));
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
void upload(DevBuf& buf, const T* host, size_t count, cudaStream_t s) {
  GYRE_CUDA_CHECK(
      cudaMemcpyAsync(buf.as<T>(count), host, count * sizeof(T), cudaMemcpyHostToDevice, s));
}

// h [n x n] (symmetric) = 2/N X^T X for x [tokens, n] (host floats), in float64, through
// staging buffers of bounded size.
void hessian_device(cublasHandle_t blas, cudaStream_t s, const float* x, int64_t tokens, int n,
                    double* h, DevBuf& xf, DevBuf& xd);

// In-place lower Cholesky factor of a (column-major [n x n], lower triangle read; the upper is
// zeroed only inside the diagonal blocks). False when a is not positive definite. Synchronizes.
bool cholesky_lower_device(cublasHandle_t blas, cudaStream_t s, double* a, int n, DevBuf& flag);

// The upper factor U (row-major [n x n]) with inverse(Hp) = U^T U, Hp = H in visiting order
// `order` with its diagonal replaced by diag + damp_abs. False when Hp is not positive definite.
// work1/work2 hold n x n doubles each.
bool inverse_factor_device(cublasHandle_t blas, cudaStream_t s, const double* h, int n,
                           const int* order_dev, const double* diag_dev, double damp_abs, double* u,
                           DevBuf& work1, DevBuf& work2, DevBuf& flag);

// Target correction (quant/target_correction.h), float64. c [n x n] = 2/N x_fp^T x_q for host
// x_fp, x_q [tokens, n], in token chunks through the staging buffers.
void cross_covariance_device(cublasHandle_t blas, cudaStream_t s, const float* x_fp,
                             const float* x_q, int64_t tokens, int n, double* c, DevBuf& staging,
                             DevBuf& fp, DevBuf& q);
// l = lower Cholesky factor of H (a zero diagonal entry counted as 1) + lambda I. False when that
// is not positive definite.
bool damped_factor_device(cublasHandle_t blas, cudaStream_t s, const double* h, int n,
                          double lambda, double* l, DevBuf& flag);
// out [rows, n] (host) = W (C + lambda I)(H + lambda I)^-1 for host w [rows, n], l from
// damped_factor_device. Synchronizes.
void corrected_target_device(cublasHandle_t blas, cudaStream_t s, const float* w, int rows, int n,
                             const double* c, const double* l, double lambda, float* out,
                             DevBuf& staging, DevBuf& wd, DevBuf& y);

// sums[c] += sum over rows [c*rows, (c+1)*rows) and all n columns of a .* b (column-major
// [R x n], R = cands * rows).
void candidate_dot(const double* a, const double* b, int64_t rows, int cands, int n, double* sums,
                   cudaStream_t s);

}  // namespace gyre::quant::cuda
