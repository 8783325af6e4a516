// Target correction (quant/target_correction.h) on the GPU: the cross-covariance C, the Cholesky
// factor of H + lambda I and the corrected target W*, in float64 like the CPU reference, so the
// n x n matrices never leave the device. Column-major throughout, as cuBLAS wants.
#include <algorithm>

#include "quant/cuda/gptq_cuda_common.h"

namespace gyre::quant::cuda {

namespace {

// Bounds the staging buffers: elements of one token (or weight row) chunk.
constexpr int64_t kChunkElems = int64_t{64} << 20;

__global__ void widen(double* dst, const float* src, int64_t count) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < count) dst[i] = src[i];
}

__global__ void narrow(float* dst, const double* src, int64_t count) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < count) dst[i] = static_cast<float>(src[i]);
}

// a = H with a zero diagonal entry counted as 1 (as damped_factor does), plus lambda on the
// diagonal.
__global__ void build_damped(double* a, const double* h, int n, double lambda) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= int64_t{n} * n) return;
  const double v = h[idx];
  a[idx] = idx % n == idx / n ? (v == 0.0 ? 1.0 : v) + lambda : v;
}

unsigned blocks_for(int64_t count, int threads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

void to_double(const float* host, int64_t count, DevBuf& staging, DevBuf& out, cudaStream_t s) {
  upload(staging, host, static_cast<size_t>(count), s);
  widen<<<blocks_for(count, 256), 256, 0, s>>>(out.as<double>(static_cast<size_t>(count)),
                                               staging.get<float>(), count);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace

void cross_covariance_device(cublasHandle_t blas, cudaStream_t s, const float* x_fp,
                             const float* x_q, int64_t tokens, int n, double* c, DevBuf& staging,
                             DevBuf& fp, DevBuf& q) {
  // x row-major [tokens, n] is column-major [n x tokens]: C(i, k) = alpha sum_t xf(i,t) xq(k,t),
  // so the column-major C holds C[i][k] of the row-major CPU result at (i, k).
  const int64_t chunk = std::max<int64_t>(1, kChunkElems / n);
  const double alpha = 2.0 / static_cast<double>(tokens);
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t nt = std::min(chunk, tokens - t0);
    to_double(x_fp + t0 * n, nt * n, staging, fp, s);
    to_double(x_q + t0 * n, nt * n, staging, q, s);
    const double beta = t0 == 0 ? 0.0 : 1.0;
    GYRE_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, n, n, static_cast<int>(nt),
                                  &alpha, fp.get<double>(), n, q.get<double>(), n, &beta, c, n));
  }
}

bool damped_factor_device(cublasHandle_t blas, cudaStream_t s, const double* h, int n,
                          double lambda, double* l, DevBuf& flag) {
  build_damped<<<blocks_for(int64_t{n} * n, 256), 256, 0, s>>>(l, h, n, lambda);
  GYRE_CUDA_LAUNCHED();
  return cholesky_lower_device(blas, s, l, n, flag);
}

void corrected_target_device(cublasHandle_t blas, cudaStream_t s, const float* w, int rows, int n,
                             const double* c, const double* l, double lambda, float* out,
                             DevBuf& staging, DevBuf& wd, DevBuf& y) {
  // w row-major [rows, n] is column-major Wt [n x rows]; per row (H + lambda I) w*_r =
  // C^T w_r + lambda w_r, i.e. Y = C^T Wt + lambda Wt, then L L^T X = Y by two solves.
  const int64_t chunk = std::max<int64_t>(1, kChunkElems / n);
  const double one = 1.0;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int nr = static_cast<int>(std::min<int64_t>(chunk, rows - r0));
    const int64_t count = int64_t{nr} * n;
    to_double(w + r0 * n, count, staging, wd, s);
    double* yd = y.as<double>(static_cast<size_t>(count));
    GYRE_CUDA_CHECK(cudaMemcpyAsync(yd, wd.get<double>(),
                                    static_cast<size_t>(count) * sizeof(double),
                                    cudaMemcpyDeviceToDevice, s));
    GYRE_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, nr, n, &one, c, n,
                                  wd.get<double>(), n, &lambda, yd, n));
    GYRE_CUBLAS_CHECK(cublasDtrsm(blas, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N,
                                  CUBLAS_DIAG_NON_UNIT, n, nr, &one, l, n, yd, n));
    GYRE_CUBLAS_CHECK(cublasDtrsm(blas, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T,
                                  CUBLAS_DIAG_NON_UNIT, n, nr, &one, l, n, yd, n));
    float* f = staging.as<float>(static_cast<size_t>(count));
    narrow<<<blocks_for(count, 256), 256, 0, s>>>(f, yd, count);
    GYRE_CUDA_LAUNCHED();
    GYRE_CUDA_CHECK(cudaMemcpyAsync(out + r0 * n, f, static_cast<size_t>(count) * sizeof(float),
                                    cudaMemcpyDeviceToHost, s));
    GYRE_CUDA_CHECK(cudaStreamSynchronize(s));  // staging is reused by the next chunk's upload
  }
}

}  // namespace gyre::quant::cuda
