// Hessian accumulation and the factor of its damped inverse on the GPU (gptq_cuda_common.h).
// Column-major throughout, as cuBLAS wants; symmetric matrices read the same either way.
#include <algorithm>

#include "quant/cuda/gptq_cuda_common.h"

namespace gyre::quant::cuda {

namespace {

constexpr int kDiagBlock = 64;

__global__ void float_to_double(double* dst, const float* src, int64_t count) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < count) dst[i] = src[i];
}

// a[i, k] of the matrix to factor: Hp in reversed visiting order (see inverse_factor_device).
__global__ void build_reversed(double* a, const double* h, int n, const int* order,
                               const double* diag, double damp_abs) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= int64_t{n} * n) return;
  const int i = static_cast<int>(idx % n), k = static_cast<int>(idx / n);
  const int a_col = order[n - 1 - i], b_col = order[n - 1 - k];
  a[idx] = i == k ? diag[a_col] + damp_abs : h[a_col + int64_t{b_col} * n];
}

// In-place lower Cholesky factor of the b x b diagonal block at a (leading dimension n), one CTA.
__global__ void factor_diag_block(double* a, int n, int b, int* bad) {
  __shared__ double t[kDiagBlock][kDiagBlock + 1];
  for (int idx = threadIdx.x; idx < b * b; idx += blockDim.x) {
    const int i = idx % b, k = idx / b;
    t[i][k] = a[i + int64_t{k} * n];
  }
  __syncthreads();
  for (int j = 0; j < b; ++j) {
    if (threadIdx.x == 0) {
      const double d = t[j][j];
      if (!(d > 0.0) || !isfinite(d)) *bad = 1;
      t[j][j] = d > 0.0 ? sqrt(d) : 1.0;
    }
    __syncthreads();
    for (int i = j + 1 + threadIdx.x; i < b; i += blockDim.x) t[i][j] /= t[j][j];
    __syncthreads();
    const int m = b - j - 1;
    for (int idx = threadIdx.x; idx < m * m; idx += blockDim.x) {
      const int i = j + 1 + idx % m, k = j + 1 + idx / m;
      if (k <= i) t[i][k] -= t[i][j] * t[k][j];
    }
    __syncthreads();
  }
  for (int idx = threadIdx.x; idx < b * b; idx += blockDim.x) {
    const int i = idx % b, k = idx / b;
    a[i + int64_t{k} * n] = k <= i ? t[i][k] : 0.0;
  }
}

__global__ void set_identity(double* x, int n) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx < int64_t{n} * n) x[idx] = idx % n == idx / n ? 1.0 : 0.0;
}

// u[i][k] (row-major) = inv(M)[n-1-i][n-1-k], inv(M) column-major lower.
__global__ void reverse_to_upper(double* u, const double* minv, int n) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= int64_t{n} * n) return;
  const int i = static_cast<int>(idx / n), k = static_cast<int>(idx % n);
  u[idx] = k >= i ? minv[(n - 1 - i) + int64_t{n - 1 - k} * n] : 0.0;
}

__global__ void dot_by_candidate(const double* a, const double* b, int64_t rows, int64_t big_r,
                                 int n, double* sums) {
  const int cand = blockIdx.y;
  double acc = 0.0;
  for (int c = blockIdx.x; c < n; c += gridDim.x) {
    const int64_t base = cand * rows + c * big_r;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) acc += a[base + r] * b[base + r];
  }
  __shared__ double part[256];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sums + cand, part[0]);
}

unsigned blocks_for(int64_t count, int threads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

}  // namespace

void hessian_device(cublasHandle_t blas, cudaStream_t s, const float* x, int64_t tokens, int n,
                    double* h, DevBuf& xf, DevBuf& xd) {
  // x row-major [tokens, n] is column-major [n x tokens]: H = alpha * X X^T in that view.
  const int64_t chunk = std::max<int64_t>(1, (int64_t{64} << 20) / n);
  const double alpha = 2.0 / static_cast<double>(tokens);
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t nt = std::min(chunk, tokens - t0);
    upload(xf, x + t0 * n, static_cast<size_t>(nt * n), s);
    double* d = xd.as<double>(static_cast<size_t>(nt * n));
    float_to_double<<<blocks_for(nt * n, 256), 256, 0, s>>>(d, xf.get<float>(), nt * n);
    GYRE_CUDA_LAUNCHED();
    const double beta = t0 == 0 ? 0.0 : 1.0;
    GYRE_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, n, n, static_cast<int>(nt),
                                  &alpha, d, n, d, n, &beta, h, n));
  }
}

bool cholesky_lower_device(cublasHandle_t blas, cudaStream_t s, double* a, int n, DevBuf& flag) {
  int* bad = flag.as<int>(1);
  GYRE_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), s));
  const double one = 1.0, minus_one = -1.0;
  for (int k0 = 0; k0 < n; k0 += kDiagBlock) {
    const int b = std::min(kDiagBlock, n - k0), rest = n - k0 - b;
    double* a11 = a + k0 + int64_t{k0} * n;
    factor_diag_block<<<1, 256, 0, s>>>(a11, n, b, bad);
    GYRE_CUDA_LAUNCHED();
    if (rest == 0) break;
    double* a21 = a11 + b;
    GYRE_CUBLAS_CHECK(cublasDtrsm(blas, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T,
                                  CUBLAS_DIAG_NON_UNIT, rest, b, &one, a11, n, a21, n));
    GYRE_CUBLAS_CHECK(cublasDsyrk(blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, rest, b, &minus_one,
                                  a21, n, &one, a21 + int64_t{b} * n, n));
  }
  int host_bad = 0;
  GYRE_CUDA_CHECK(cudaMemcpyAsync(&host_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, s));
  GYRE_CUDA_CHECK(cudaStreamSynchronize(s));
  return host_bad == 0;
}

// inverse(Hp) = U^T U with U upper <=> Hp = V V^T with V = inverse(U) upper. With J the
// reversal, J Hp J = (J V J)(J V J)^T and J V J is lower: so M = chol(J Hp J) (an ordinary lower
// Cholesky factor of Hp in reversed order), V = J M J and U = J inverse(M) J.
bool inverse_factor_device(cublasHandle_t blas, cudaStream_t s, const double* h, int n,
                           const int* order_dev, const double* diag_dev, double damp_abs, double* u,
                           DevBuf& work1, DevBuf& work2, DevBuf& flag) {
  const int64_t nn = int64_t{n} * n;
  double* a = work1.as<double>(static_cast<size_t>(nn));
  build_reversed<<<blocks_for(nn, 256), 256, 0, s>>>(a, h, n, order_dev, diag_dev, damp_abs);
  GYRE_CUDA_LAUNCHED();
  if (!cholesky_lower_device(blas, s, a, n, flag)) return false;
  const double one = 1.0;
  double* minv = work2.as<double>(static_cast<size_t>(nn));
  set_identity<<<blocks_for(nn, 256), 256, 0, s>>>(minv, n);
  GYRE_CUDA_LAUNCHED();
  GYRE_CUBLAS_CHECK(cublasDtrsm(blas, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N,
                                CUBLAS_DIAG_NON_UNIT, n, n, &one, a, n, minv, n));
  reverse_to_upper<<<blocks_for(nn, 256), 256, 0, s>>>(u, minv, n);
  GYRE_CUDA_LAUNCHED();
  return true;
}

void candidate_dot(const double* a, const double* b, int64_t rows, int cands, int n, double* sums,
                   cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(std::min(n, 512)), static_cast<unsigned>(cands));
  dot_by_candidate<<<grid, 256, 0, s>>>(a, b, rows, rows * cands, n, sums);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::quant::cuda
