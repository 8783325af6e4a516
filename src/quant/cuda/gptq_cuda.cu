// GPTQ on the GPU (quant/gptq_device.h), the same algorithm as gptq_quantize in gptq.cc: weights
// in visiting order, blocks of kBlock columns; inside a block each thread walks one row through
// the columns (rows are independent), outside it one float64 GEMM per block applies the lazy
// update. Every candidate setting of a measurement runs at once: the candidates' copies of the
// weight are stacked as extra rows (R = candidates x rows), so U is read once per block for all.
// A mix of two widths quantizes each group at its own width (a per-group flag says which), as
// gptq.cc does. Engine::trellis runs the trellis LDLQ (trellis_ldlq.cu) on the same Hessian,
// factor and error measurement, one setting at a time.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "quant/cuda/gptq_cuda_common.h"
#include "quant/cuda/gptq_engine.h"
#include "quant/cuda/trellis_ldlq.h"

namespace gyre::quant::cuda {

namespace {

constexpr int kBlock = 128;      // GPTQ's lazy-batch width
constexpr int kRowsPerCta = 64;  // one thread per row; its block of columns in shared memory
constexpr int kMaxGroup = 128;
// Bytes the stacked candidates may take (work weights, errors, dequantized values).
constexpr double kBatchBytes = 24e9;

// A candidate on the device: a mix's groups at mix_bits are those g with hi[hi_at + g] != 0.
struct DevSetting {
  int bits, group, sym, mix_bits, hi_at;  // hi_at -1: one width
};

// The width one group is quantized at.
struct Width {
  int bits, sym;
};

struct GptqArgs {
  double* w;            // [R x n] column-major, visiting order (updated in place)
  int64_t big_r, rows;  // R and the rows of one candidate
  int n, i1, i2;
  const double* u;  // row-major [n x n]
  const int* order;
  const int* pos;
  const int* first[3];  // per group size 32/64/128: visiting position of each group's first column
  const double* hdiag;  // original order
  const DevSetting* settings;
  const uint8_t* hi;  // the mixes' per-group flags
  float* scale;       // [n / 32 x R]: group g of row r at g * R + r
  float* minv;
  double* err;     // [R x kBlock]
  float* dequant;  // [R x n] column-major, original order
  uint8_t* q;      // same, or null
  int clip, *bad;
};

__device__ double round_f16(double x) {
  return __half2float(__float2half_rn(static_cast<float>(x)));
}

__device__ int quantize_value(double w, const Width& st, float s, float m) {
  const int offset = 1 << (st.bits - 1), qmax = (1 << st.bits) - 1;
  if (s == 0.0f) return st.sym ? offset : 0;
  const double q = st.sym ? rint(w / s) + offset : rint((w - m) / s);
  return static_cast<int>(fmin(fmax(q, 0.0), static_cast<double>(qmax)));
}

__device__ float dequant_value(const Width& st, int q, float s, float m) {
  if (st.sym) return s * static_cast<float>(q - (1 << (st.bits - 1)));
  return s * static_cast<float>(q) + m;
}

// choose_group_params(_clipped) of gptq.cc.
__device__ void choose_params(const double* v, const double* h, int n, const Width& st, bool clip,
                              float& s, float& m, int* bad) {
  double lo = INFINITY, hi = -INFINITY, amax = 0.0;
  for (int i = 0; i < n; ++i) {
    lo = fmin(lo, v[i]);
    hi = fmax(hi, v[i]);
    amax = fmax(amax, fabs(v[i]));
  }
  const int offset = 1 << (st.bits - 1), qmax = (1 << st.bits) - 1;
  auto params = [&](double a, float& sc, float& mn) {
    if (st.sym) {
      sc = static_cast<float>(round_f16(a * amax / (offset - 1)));
      mn = 0.0f;
    } else {
      sc = static_cast<float>(round_f16(a * (hi - lo) / qmax));
      mn = static_cast<float>(round_f16(a * lo));
    }
  };
  params(1.0, s, m);
  if (!isfinite(s) || !isfinite(m)) *bad = 1;
  if (!clip) return;
  auto cost = [&](float sc, float mn) {
    double e = 0;
    for (int i = 0; i < n; ++i) {
      const double d = v[i] - dequant_value(st, quantize_value(v[i], st, sc, mn), sc, mn);
      e += h[i] * d * d;
    }
    return e;
  };
  double best = cost(s, m);
  for (int k = 1; k <= 15; ++k) {
    float sc, mn;
    params(1.0 - 0.02 * k, sc, mn);
    if (!isfinite(sc) || !isfinite(mn)) continue;
    const double c = cost(sc, mn);
    if (c < best) best = c, s = sc, m = mn;
  }
}

__global__ void __launch_bounds__(kRowsPerCta) gptq_block(GptqArgs a) {
  extern __shared__ double blk[];  // [kBlock][kRowsPerCta]
  const int t = threadIdx.x;
  const int64_t r = blockIdx.x * int64_t{kRowsPerCta} + t;
  if (r >= a.big_r) return;
  const DevSetting st = a.settings[r / a.rows];
  const int gs = st.group;
  const int* first = a.first[gs == 32 ? 0 : gs == 64 ? 1 : 2];
  const int nb = a.i2 - a.i1;
  for (int k = 0; k < nb; ++k) blk[k * kRowsPerCta + t] = a.w[r + (a.i1 + k) * a.big_r];
  double v[kMaxGroup];
  for (int j = a.i1; j < a.i2; ++j) {
    const int col = a.order[j], g = col / gs;
    const Width wd{st.hi_at >= 0 && a.hi[st.hi_at + g] ? st.mix_bits : st.bits, st.sym};
    float s, m;
    if (first[g] == j) {  // first visit of this group: parameters from its current values
      for (int i = 0; i < gs; ++i) {
        const int p = a.pos[g * gs + i];
        double x;
        if (p < a.i2) {
          x = blk[(p - a.i1) * kRowsPerCta + t];
        } else {  // not yet given this block's pending updates
          x = a.w[r + p * a.big_r];
          for (int jj = a.i1; jj < j; ++jj)
            x -= a.err[r + (jj - a.i1) * a.big_r] * a.u[int64_t{jj} * a.n + p];
        }
        v[i] = x;
      }
      choose_params(v, a.hdiag + g * gs, gs, wd, a.clip, s, m, a.bad);
      a.scale[g * a.big_r + r] = s;
      a.minv[g * a.big_r + r] = m;
    } else {
      s = a.scale[g * a.big_r + r];
      m = a.minv[g * a.big_r + r];
    }
    const double* uj = a.u + int64_t{j} * a.n;
    const double wj = blk[(j - a.i1) * kRowsPerCta + t];
    const int q = quantize_value(wj, wd, s, m);
    const float deq = dequant_value(wd, q, s, m);
    const double e = (wj - deq) / uj[j];
    a.err[r + (j - a.i1) * a.big_r] = e;
    a.dequant[r + int64_t{col} * a.big_r] = deq;
    if (a.q) a.q[r + int64_t{col} * a.big_r] = static_cast<uint8_t>(q);
    for (int k = j + 1; k < a.i2; ++k) blk[(k - a.i1) * kRowsPerCta + t] -= e * uj[k];
  }
}

// Candidate copies of w (host layout [rows, n]) in visiting order, column-major, dead columns 0.
__global__ void stack_visiting(double* out, const float* w, int64_t rows, int cands, int n,
                               const int* order, const uint8_t* dead) {
  const int64_t big_r = rows * cands;
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= big_r * n) return;
  const int64_t rr = idx % big_r, r = rr % rows;
  const int j = static_cast<int>(idx / big_r), col = order[j];
  out[idx] = dead[col] ? 0.0 : static_cast<double>(w[r * n + col]);
}

// e = w - dequant (in float, as relative_error in gptq.cc), column-major original order.
__global__ void error_matrix(double* e, const float* w, const float* dequant, int64_t rows,
                             int cands, int n) {
  const int64_t big_r = rows * cands;
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= big_r * n) return;
  const int64_t r = (idx % big_r) % rows, col = idx / big_r;
  const float wv = w[r * n + col];
  e[idx] = static_cast<double>(dequant ? wv - dequant[idx] : wv);
}

// out [rows, cols] row-major = in [rows x cols] column-major, through 32 x 32 tiles.
template <typename T>
__global__ void to_row_major(T* out, const T* in, int64_t rows, int64_t cols) {
  __shared__ T tile[32][33];
  const int64_t r0 = blockIdx.y * int64_t{32}, c0 = blockIdx.x * int64_t{32};
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const int64_t r = r0 + threadIdx.x, c = c0 + k;
    if (r < rows && c < cols) tile[k][threadIdx.x] = in[r + c * rows];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) out[r * cols + c] = tile[threadIdx.x][k];
  }
}

template <typename T>
void copy_row_major(T* host, const T* dev_col_major, int64_t rows, int64_t cols, DevBuf& tmp,
                    cudaStream_t s) {
  T* t = tmp.as<T>(static_cast<size_t>(rows * cols));
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
  to_row_major<T><<<grid, dim3(32, 8), 0, s>>>(t, dev_col_major, rows, cols);
  GYRE_CUDA_LAUNCHED();
  GYRE_CUDA_CHECK(cudaMemcpyAsync(host, t, static_cast<size_t>(rows * cols) * sizeof(T),
                                  cudaMemcpyDeviceToHost, s));
  GYRE_CUDA_CHECK(cudaStreamSynchronize(s));
}

unsigned blocks_for(int64_t count, int threads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

}  // namespace

struct Engine::Impl {
  cudaStream_t s = nullptr;
  cublasHandle_t blas = nullptr;
  int n = 0;
  int64_t rows = 0;
  int64_t tokens = 0;
  double damp_used = 0;
  double diag_mean = 0;  // of H, a zero entry counted as 1
  double lambda = -1;    // target correction's; < 0 when not set for this input
  bool clip = false;
  std::vector<int> order;
  std::vector<double> hdiag;  // host copy of hdiag_d
  int last_group = 0;
  DevBuf xf, xd, h, u, work1, work2, flag, order_d, pos_d, first_d[3], hdiag_d, dead_d, w_f, w_v, f,
      err, scale, minv, dequant, q, sets, hi, sums, cross, chol;
  // The trellis LDLQ's: its words, the natural-order factor when set_input's order is not.
  DevBuf words, order_nat, u_nat;
  bool u_nat_ready = false;
  int trellis_k = 0;
  TrellisLdlqBuffers tbufs;

  void sync() { GYRE_CUDA_CHECK(cudaStreamSynchronize(s)); }
  std::vector<double> run_batch(const std::vector<Setting>& settings, bool want_q);
  // out[c] = tr(E H E^T) of each candidate's E = W - dequant (column-major [cands * rows x n]);
  // w_scratch takes E. Asynchronous (out is host memory valid after sync()).
  void output_errors(const float* dq, int cands, double* w_scratch, double* out);
};

Engine::Engine(int ordinal) : impl_(std::make_unique<Impl>()) {
  GYRE_CUDA_CHECK(cudaSetDevice(ordinal));
  GYRE_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->s, cudaStreamNonBlocking));
  GYRE_CUBLAS_CHECK(cublasCreate(&impl_->blas));
  GYRE_CUBLAS_CHECK(cublasSetStream(impl_->blas, impl_->s));
  GYRE_CUDA_CHECK(cudaFuncSetAttribute(gptq_block, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kBlock * kRowsPerCta * sizeof(double)));
}

Engine::~Engine() {
  cublasDestroy(impl_->blas);
  cudaStreamDestroy(impl_->s);
}

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

double Engine::damp_used() const {
  return impl_->damp_used;
}

const std::vector<double>& Engine::hessian_diagonal() const {
  return impl_->hdiag;
}

std::vector<double> Engine::hessian() const {
  Impl& m = *impl_;
  std::vector<double> out(static_cast<size_t>(m.n) * m.n);
  GYRE_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.h.get<double>(), out.size() * sizeof(double),
                                  cudaMemcpyDeviceToHost, m.s));
  m.sync();
  return out;
}

void Engine::set_input(const float* x, int64_t tokens, int n, double damp, bool act_order,
                       bool clip_search) {
  Impl& m = *impl_;
  GYRE_CHECK(tokens > 0 && n > 0, "gptq: empty input");
  GYRE_CHECK(damp >= 0.0 && damp <= 1.0, "gptq: damping must be in [0, 1], got ", damp);
  m.n = n;
  m.tokens = tokens;
  m.rows = 0;
  m.lambda = -1;
  m.clip = clip_search;
  m.u_nat_ready = false;
  m.trellis_k = 0;
  double* h = m.h.as<double>(static_cast<size_t>(n) * n);
  hessian_device(m.blas, m.s, x, tokens, n, h, m.xf, m.xd);
  std::vector<double> diag(static_cast<size_t>(n));
  GYRE_CUDA_CHECK(cudaMemcpy2DAsync(diag.data(), sizeof(double), h, (n + 1) * sizeof(double),
                                    sizeof(double), n, cudaMemcpyDeviceToHost, m.s));
  m.sync();
  std::vector<uint8_t> dead(static_cast<size_t>(n), 0);
  double mean = 0.0;
  for (int i = 0; i < n; ++i) {
    GYRE_CHECK(std::isfinite(diag[i]), "gptq: the Hessian is not finite (inputs overflow)");
    if (diag[i] == 0.0) dead[i] = 1, diag[i] = 1.0;
    mean += diag[i];
  }
  mean /= n;
  m.diag_mean = mean;
  m.order.resize(static_cast<size_t>(n));
  std::iota(m.order.begin(), m.order.end(), 0);
  if (act_order)
    std::stable_sort(m.order.begin(), m.order.end(),
                     [&](int a, int b) { return diag[a] > diag[b]; });
  std::vector<int> pos(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) pos[m.order[j]] = j;
  const int gsizes[3] = {32, 64, 128};
  std::vector<std::vector<int>> first(3);
  for (int k = 0; k < 3; ++k) {
    first[k].assign(static_cast<size_t>(n / gsizes[k] + 1), n);
    for (int c = 0; c < n; ++c) {
      int& f = first[k][c / gsizes[k]];
      f = std::min(f, pos[c]);
    }
    upload(m.first_d[k], first[k].data(), first[k].size(), m.s);
  }
  upload(m.order_d, m.order.data(), m.order.size(), m.s);
  upload(m.pos_d, pos.data(), pos.size(), m.s);
  upload(m.hdiag_d, diag.data(), diag.size(), m.s);
  m.hdiag = diag;
  upload(m.dead_d, dead.data(), dead.size(), m.s);
  double* u = m.u.as<double>(static_cast<size_t>(n) * n);
  for (double d = std::max(damp, 1e-6);; d *= 10.0) {
    if (inverse_factor_device(m.blas, m.s, h, n, m.order_d.get<int>(), m.hdiag_d.get<double>(),
                              d * mean, u, m.work1, m.work2, m.flag)) {
      m.damp_used = d;
      m.sync();  // the host vectors uploaded above must outlive their copies
      return;
    }
    GYRE_CHECK(d * 10.0 <= 1.0, "gptq: the Hessian is not positive definite even with damping ", d);
  }
}

double Engine::set_target(const float* x_fp, const float* x_q, int64_t tokens, double target_damp) {
  Impl& m = *impl_;
  GYRE_CHECK(m.n > 0 && tokens == m.tokens, "internal: target correction input mismatch");
  const size_t nn = static_cast<size_t>(m.n) * m.n;
  cross_covariance_device(m.blas, m.s, x_fp, x_q, tokens, m.n, m.cross.as<double>(nn), m.xf, m.xd,
                          m.f);
  double* l = m.chol.as<double>(nn);
  // The ladder of damped_factor (target_correction.cc).
  for (double d = std::max(target_damp, 1e-6);; d *= 10.0) {
    if (damped_factor_device(m.blas, m.s, m.h.get<double>(), m.n, d * m.diag_mean, l, m.flag)) {
      m.lambda = d * m.diag_mean;
      return m.lambda;
    }
    GYRE_CHECK(d * 10.0 <= 1.0, "target correction: the Hessian does not factor even with damping ",
               d);
  }
}

std::vector<double> Engine::cross() const {
  Impl& m = *impl_;
  GYRE_CHECK(m.lambda >= 0, "internal: no target correction on the device");
  std::vector<double> out(static_cast<size_t>(m.n) * m.n);
  copy_row_major(out.data(), m.cross.get<double>(), m.n, m.n, m.work2, m.s);
  return out;
}

void Engine::corrected_target(const float* w, int rows, float* out) {
  Impl& m = *impl_;
  GYRE_CHECK(m.lambda >= 0 && rows > 0, "internal: no target correction on the device");
  corrected_target_device(m.blas, m.s, w, rows, m.n, m.cross.get<double>(), m.chol.get<double>(),
                          m.lambda, out, m.w_f, m.w_v, m.f);
}

double Engine::set_weight(const float* w, int rows) {
  Impl& m = *impl_;
  GYRE_CHECK(m.n > 0 && rows > 0, "internal: gptq device without input");
  m.rows = rows;
  upload(m.w_f, w, static_cast<size_t>(rows) * m.n, m.s);
  const int64_t big = int64_t{rows} * m.n;
  double* e = m.w_v.as<double>(static_cast<size_t>(big));
  error_matrix<<<blocks_for(big, 256), 256, 0, m.s>>>(e, m.w_f.get<float>(), nullptr, rows, 1, m.n);
  GYRE_CUDA_LAUNCHED();
  double* f = m.f.as<double>(static_cast<size_t>(big));
  const double one = 1.0, zero = 0.0;
  GYRE_CUBLAS_CHECK(cublasDgemm(m.blas, CUBLAS_OP_N, CUBLAS_OP_N, rows, m.n, m.n, &one, e, rows,
                                m.h.get<double>(), m.n, &zero, f, rows));
  double* sums = m.sums.as<double>(1);
  GYRE_CUDA_CHECK(cudaMemsetAsync(sums, 0, sizeof(double), m.s));
  candidate_dot(e, f, rows, 1, m.n, sums, m.s);
  double out = 0;
  GYRE_CUDA_CHECK(cudaMemcpyAsync(&out, sums, sizeof(double), cudaMemcpyDeviceToHost, m.s));
  m.sync();
  return out;
}

std::vector<double> Engine::run(const std::vector<Setting>& settings, bool want_outputs) {
  Impl& m = *impl_;
  GYRE_CHECK(m.rows > 0, "internal: gptq device without weight");
  GYRE_CHECK(!want_outputs || settings.size() == 1, "internal: outputs of one setting only");
  for (const Setting& st : settings) {
    GYRE_CHECK((st.group == 32 || st.group == 64 || st.group == 128) && m.n % st.group == 0 &&
                   st.bits >= 2 && st.bits <= 8,
               "gptq: the GPU supports groups of 32, 64 and 128 dividing the width");
    GYRE_CHECK(st.hi_groups.empty() || (st.mix_bits >= 2 && st.mix_bits <= 8),
               "internal: a mix's second width must be 2..8 bits");
    for (int g : st.hi_groups)
      GYRE_CHECK(g >= 0 && g < m.n / st.group, "internal: a mix's group is out of range");
  }
  const double per_cand = static_cast<double>(m.rows) * m.n * 20.0;
  const size_t batch =
      std::max<size_t>(1, std::min(settings.size(), static_cast<size_t>(kBatchBytes / per_cand)));
  std::vector<double> out;
  for (size_t c0 = 0; c0 < settings.size(); c0 += batch) {
    const auto first = settings.begin() + static_cast<int64_t>(c0);
    const std::vector<Setting> part(
        first, first + static_cast<int64_t>(std::min(batch, settings.size() - c0)));
    for (double v : m.run_batch(part, want_outputs)) out.push_back(v);
  }
  if (want_outputs) m.last_group = settings[0].group, m.trellis_k = 0;
  return out;
}

std::vector<double> Engine::Impl::run_batch(const std::vector<Setting>& settings, bool want_q) {
  const int cands = static_cast<int>(settings.size());
  const int64_t big_r = rows * cands, big = big_r * n;
  // The device settings, and one flag per group for each mix (the host vectors live until the
  // sync below, so the asynchronous copies may read them).
  std::vector<DevSetting> dev;
  std::vector<uint8_t> flags(1, 0);  // never empty: an upload of nothing has no buffer
  for (const Setting& st : settings) {
    dev.push_back({st.bits, st.group, st.sym, st.mix_bits, -1});
    if (st.hi_groups.empty()) continue;
    dev.back().hi_at = static_cast<int>(flags.size());
    flags.resize(flags.size() + static_cast<size_t>(n / st.group), 0);
    for (int g : st.hi_groups) flags[static_cast<size_t>(dev.back().hi_at + g)] = 1;
  }
  upload(sets, dev.data(), dev.size(), s);
  upload(hi, flags.data(), flags.size(), s);
  double* w = w_v.as<double>(static_cast<size_t>(big));
  stack_visiting<<<blocks_for(big, 256), 256, 0, s>>>(w, w_f.get<float>(), rows, cands, n,
                                                      order_d.get<int>(), dead_d.get<uint8_t>());
  GYRE_CUDA_LAUNCHED();
  GptqArgs a{};
  a.w = w;
  a.big_r = big_r;
  a.rows = rows;
  a.n = n;
  a.u = u.get<double>();
  a.order = order_d.get<int>();
  a.pos = pos_d.get<int>();
  for (int k = 0; k < 3; ++k) a.first[k] = first_d[k].get<int>();
  a.hdiag = hdiag_d.get<double>();
  a.settings = sets.get<DevSetting>();
  a.hi = hi.get<uint8_t>();
  a.scale = scale.as<float>(static_cast<size_t>(n / 32) * big_r);
  a.minv = minv.as<float>(static_cast<size_t>(n / 32) * big_r);
  a.err = err.as<double>(static_cast<size_t>(big_r) * kBlock);
  a.dequant = dequant.as<float>(static_cast<size_t>(big));
  a.q = want_q ? q.as<uint8_t>(static_cast<size_t>(big)) : nullptr;
  a.clip = clip ? 1 : 0;
  a.bad = flag.as<int>(1);
  GYRE_CUDA_CHECK(cudaMemsetAsync(a.bad, 0, sizeof(int), s));
  const double minus_one = -1.0, one = 1.0;
  const int ldr = static_cast<int>(big_r);
  for (int i1 = 0; i1 < n; i1 += kBlock) {
    a.i1 = i1;
    a.i2 = std::min(n, i1 + kBlock);
    gptq_block<<<blocks_for(big_r, kRowsPerCta), kRowsPerCta, kBlock * kRowsPerCta * sizeof(double),
                 s>>>(a);
    GYRE_CUDA_LAUNCHED();
    if (a.i2 < n)  // w[:, i2:] -= err @ U[i1:i2, i2:] (U row-major is U^T column-major)
      GYRE_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, ldr, n - a.i2, a.i2 - i1,
                                    &minus_one, a.err, ldr, a.u + a.i2 + int64_t{i1} * n, n, &one,
                                    w + int64_t{a.i2} * big_r, ldr));
  }
  // tr(E H E^T) per candidate; the work weights are done with, so E takes their place.
  std::vector<double> out(static_cast<size_t>(cands));
  output_errors(a.dequant, cands, w, out.data());
  int bad = 0;
  GYRE_CUDA_CHECK(cudaMemcpyAsync(&bad, a.bad, sizeof(int), cudaMemcpyDeviceToHost, s));
  sync();
  GYRE_CHECK(!bad, "quantize: a group's scale overflows f16");
  return out;
}

void Engine::Impl::output_errors(const float* dq, int cands, double* w, double* out) {
  const int64_t big_r = rows * cands, big = big_r * n;
  const int ldr = static_cast<int>(big_r);
  const double one = 1.0, zero = 0.0;
  error_matrix<<<blocks_for(big, 256), 256, 0, s>>>(w, w_f.get<float>(), dq, rows, cands, n);
  GYRE_CUDA_LAUNCHED();
  double* fm = f.as<double>(static_cast<size_t>(big));
  GYRE_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, ldr, n, n, &one, w, ldr,
                                h.get<double>(), n, &zero, fm, ldr));
  double* sm = sums.as<double>(static_cast<size_t>(cands));
  GYRE_CUDA_CHECK(cudaMemsetAsync(sm, 0, sizeof(double) * cands, s));
  candidate_dot(w, fm, rows, cands, n, sm, s);
  GYRE_CUDA_CHECK(cudaMemcpyAsync(out, sm, sizeof(double) * cands, cudaMemcpyDeviceToHost, s));
}

double Engine::trellis(int k, int group, double scale_fit) {
  Impl& m = *impl_;
  GYRE_CHECK(m.rows > 0, "internal: gptq device without weight");
  const int n = m.n;
  const double* u = m.u.get<double>();
  const int* order = m.order_d.get<int>();
  if (!std::is_sorted(m.order.begin(), m.order.end())) {  // act_order: factor H as it is
    std::vector<int> iota(static_cast<size_t>(n));
    std::iota(iota.begin(), iota.end(), 0);
    upload(m.order_nat, iota.data(), iota.size(), m.s);
    if (!m.u_nat_ready) {
      GYRE_CHECK(inverse_factor_device(m.blas, m.s, m.h.get<double>(), n, m.order_nat.get<int>(),
                                       m.hdiag_d.get<double>(), m.damp_used * m.diag_mean,
                                       m.u_nat.as<double>(static_cast<size_t>(n) * n), m.work1,
                                       m.work2, m.flag),
                 "gptq: the Hessian does not factor in the natural order");
      m.u_nat_ready = true;
    }
    m.sync();  // iota must outlive its copy
    u = m.u_nat.get<double>();
    order = m.order_nat.get<int>();
  }
  const int64_t big = m.rows * n;
  double* w = m.w_v.as<double>(static_cast<size_t>(big));
  stack_visiting<<<blocks_for(big, 256), 256, 0, m.s>>>(w, m.w_f.get<float>(), m.rows, 1, n, order,
                                                        m.dead_d.get<uint8_t>());
  GYRE_CUDA_LAUNCHED();
  int* bad = m.flag.as<int>(1);
  GYRE_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), m.s));
  float* dq = m.dequant.as<float>(static_cast<size_t>(big));
  trellis_ldlq_device(m.blas, m.s, w, m.rows, n, u, k, group, scale_fit, dq,
                      m.scale.as<float>(static_cast<size_t>(n / group) * m.rows),
                      m.words.as<uint32_t>(static_cast<size_t>(big / 256) * 8 * k), bad, m.tbufs);
  double out = 0.0;
  m.output_errors(dq, 1, w, &out);
  int bad_host = 0;
  GYRE_CUDA_CHECK(cudaMemcpyAsync(&bad_host, bad, sizeof(int), cudaMemcpyDeviceToHost, m.s));
  m.sync();
  GYRE_CHECK(!bad_host, "trellis: a group's scale overflows f16");
  m.last_group = group;
  m.trellis_k = k;
  return out;
}

void Engine::fetch_trellis(float* dequant_out, float* scales, uint32_t* words) {
  Impl& m = *impl_;
  GYRE_CHECK(m.trellis_k > 0, "internal: gptq device has no trellis outputs");
  copy_row_major(dequant_out, m.dequant.get<float>(), m.rows, m.n, m.f, m.s);
  copy_row_major(scales, m.scale.get<float>(), m.rows, m.n / m.last_group, m.f, m.s);
  GYRE_CUDA_CHECK(
      cudaMemcpyAsync(words, m.words.get<uint32_t>(),
                      static_cast<size_t>(m.rows * m.n / 256) * 8 * m.trellis_k * sizeof(uint32_t),
                      cudaMemcpyDeviceToHost, m.s));
  m.sync();
}

void Engine::fetch(float* dequant_out, uint8_t* q_out, float* scales, float* mins) {
  Impl& m = *impl_;
  GYRE_CHECK(m.last_group > 0, "internal: gptq device has no outputs");
  copy_row_major(dequant_out, m.dequant.get<float>(), m.rows, m.n, m.f, m.s);
  copy_row_major(q_out, m.q.get<uint8_t>(), m.rows, m.n, m.f, m.s);
  const int64_t groups = m.n / m.last_group;
  copy_row_major(scales, m.scale.get<float>(), m.rows, groups, m.f, m.s);
  copy_row_major(mins, m.minv.get<float>(), m.rows, groups, m.f, m.s);
}

}  // namespace gyre::quant::cuda
