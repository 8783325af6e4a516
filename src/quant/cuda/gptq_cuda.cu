// GPTQ on the GPU (quant/gptq_device.h), the same algorithm as gptq_quantize in gptq.cc: weights
// in visiting order, blocks of kBlock columns; inside a block each thread walks one row through
// the columns (rows are independent), outside it one float64 GEMM per block applies the lazy
// update. Every candidate setting of a measurement runs at once: the candidates' copies of the
// weight are stacked as extra rows (R = candidates x rows), so U is read once per block for all.
// A mix of two widths quantizes each group at its own width (a per-group flag says which), as
// gptq.cc does. Engine::trellis runs the trellis LDLQ (trellis_ldlq.cu) on the same Hessian,
// factor and error measurement; Engine::trellis_errors stacks the candidate K of a measurement
// like the scalar settings.
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
// src (device, may be null): candidate c copies weight src[c] of the weights stacked in w.
__global__ void stack_visiting(double* out, const float* w, int64_t rows, int cands, int n,
                               const int* order, const uint8_t* dead, const int* src = nullptr) {
  const int64_t big_r = rows * cands;
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= big_r * n) return;
  const int64_t rr = idx % big_r, c = rr / rows;
  const int64_t r = rr % rows + (src != nullptr ? src[c] * rows : 0);
  const int j = static_cast<int>(idx / big_r), col = order[j];
  out[idx] = dead[col] ? 0.0 : static_cast<double>(w[r * n + col]);
}

// e = w - dequant (in float, as relative_error in gptq.cc), column-major original order; src as
// stack_visiting's.
__global__ void error_matrix(double* e, const float* w, const float* dequant, int64_t rows,
                             int cands, int n, const int* src = nullptr) {
  const int64_t big_r = rows * cands;
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= big_r * n) return;
  const int64_t rr = idx % big_r, col = idx / big_r;
  const int64_t r = rr % rows + (src != nullptr ? src[rr / rows] * rows : 0);
  const float wv = w[r * n + col];
  e[idx] = static_cast<double>(dequant ? wv - dequant[idx] : wv);
}

// out [rows, cols] row-major = in [rows x cols] column-major (leading dimension ld), through 32 x
// 32 tiles.
template <typename T>
__global__ void to_row_major(T* out, const T* in, int64_t rows, int64_t cols, int64_t ld) {
  __shared__ T tile[32][33];
  const int64_t r0 = blockIdx.y * int64_t{32}, c0 = blockIdx.x * int64_t{32};
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const int64_t r = r0 + threadIdx.x, c = c0 + k;
    if (r < rows && c < cols) tile[k][threadIdx.x] = in[r + c * ld];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) out[r * cols + c] = tile[threadIdx.x][k];
  }
}

template <typename T>
void copy_row_major(T* host, const T* dev_col_major, int64_t rows, int64_t cols, DevBuf& tmp,
                    cudaStream_t s, int64_t ld = 0) {
  T* t = tmp.as<T>(static_cast<size_t>(rows * cols));
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
  to_row_major<T><<<grid, dim3(32, 8), 0, s>>>(t, dev_col_major, rows, cols, ld > 0 ? ld : rows);
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
  int ordinal = 0;
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
  DevBuf words, order_nat, u_nat, src_d;
  bool u_nat_ready = false;
  int trellis_k = 0;
  int count = 1;  // weights stacked by the last set_weights
  // The last kept trellis stack: per candidate its position, K and words' offset.
  std::vector<int> kept_pos, kept_k;
  std::vector<int64_t> kept_words;
  int64_t kept_big_r = 0;
  TrellisLdlqBuffers tbufs;

  void sync() { GYRE_CUDA_CHECK(cudaStreamSynchronize(s)); }
  // The trellis LDLQ's factor and visiting order: natural, whatever set_input's order.
  void natural_factor(const double*& u_out, const int*& order_out);
  // The trellis LDLQ of candidates c < cands, weight src[c] (null: 0) at K = ks[c], stacked;
  // errors into out (host).
  void trellis_batch(const int* ks, const int* src, int cands, int group, double scale_fit,
                     double* out);
  std::vector<double> run_batch(const std::vector<Setting>& settings, bool want_q);
  // out[c] = tr(E H E^T) of each candidate's E = W - dequant (column-major [cands * rows x n]);
  // w_scratch takes E. Asynchronous (out is host memory valid after sync()).
  void output_errors(const float* dq, int cands, double* w_scratch, double* out,
                     const int* src = nullptr);
};

Engine::Engine(int ordinal) : impl_(std::make_unique<Impl>()) {
  impl_->ordinal = ordinal;
  GYRE_CUDA_CHECK(cudaSetDevice(ordinal));
  GYRE_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->s, cudaStreamNonBlocking));
  GYRE_CUBLAS_CHECK(cublasCreate(&impl_->blas));
  GYRE_CUBLAS_CHECK(cublasSetStream(impl_->blas, impl_->s));
  GYRE_CUDA_CHECK(cudaFuncSetAttribute(gptq_block, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kBlock * kRowsPerCta * sizeof(double)));
}

void Engine::make_current() const {
  GYRE_CUDA_CHECK(cudaSetDevice(impl_->ordinal));
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
  return set_weights(&w, 1, rows)[0];
}

std::vector<double> Engine::set_weights(const float* const* ws, int count, int rows) {
  Impl& m = *impl_;
  GYRE_CHECK(m.n > 0 && rows > 0 && count > 0, "internal: gptq device without input");
  m.rows = rows;
  m.count = count;
  m.trellis_k = 0;
  m.kept_pos.clear();
  const int64_t big_r = int64_t{rows} * count, big = big_r * m.n, one_w = int64_t{rows} * m.n;
  float* wf = m.w_f.as<float>(static_cast<size_t>(big));
  for (int i = 0; i < count; ++i)
    GYRE_CUDA_CHECK(cudaMemcpyAsync(wf + i * one_w, ws[i],
                                    static_cast<size_t>(one_w) * sizeof(float),
                                    cudaMemcpyHostToDevice, m.s));
  double* e = m.w_v.as<double>(static_cast<size_t>(big));
  error_matrix<<<blocks_for(big, 256), 256, 0, m.s>>>(e, m.w_f.get<float>(), nullptr, big_r, 1,
                                                      m.n);
  GYRE_CUDA_LAUNCHED();
  double* f = m.f.as<double>(static_cast<size_t>(big));
  const double one = 1.0, zero = 0.0;
  GYRE_CUBLAS_CHECK(cublasDgemm(m.blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(big_r), m.n, m.n,
                                &one, e, static_cast<int>(big_r), m.h.get<double>(), m.n, &zero, f,
                                static_cast<int>(big_r)));
  double* sums = m.sums.as<double>(static_cast<size_t>(count));
  GYRE_CUDA_CHECK(cudaMemsetAsync(sums, 0, sizeof(double) * count, m.s));
  candidate_dot(e, f, rows, count, m.n, sums, m.s);
  std::vector<double> out(static_cast<size_t>(count));
  GYRE_CUDA_CHECK(
      cudaMemcpyAsync(out.data(), sums, sizeof(double) * count, cudaMemcpyDeviceToHost, m.s));
  m.sync();
  return out;
}

std::vector<double> Engine::run(const std::vector<Setting>& settings, bool want_outputs) {
  Impl& m = *impl_;
  GYRE_CHECK(m.rows > 0 && m.count == 1, "internal: gptq device without (one) weight");
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

void Engine::Impl::output_errors(const float* dq, int cands, double* w, double* out,
                                 const int* src) {
  const int64_t big_r = rows * cands, big = big_r * n;
  const int ldr = static_cast<int>(big_r);
  const double one = 1.0, zero = 0.0;
  error_matrix<<<blocks_for(big, 256), 256, 0, s>>>(w, w_f.get<float>(), dq, rows, cands, n, src);
  GYRE_CUDA_LAUNCHED();
  double* fm = f.as<double>(static_cast<size_t>(big));
  GYRE_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, ldr, n, n, &one, w, ldr,
                                h.get<double>(), n, &zero, fm, ldr));
  double* sm = sums.as<double>(static_cast<size_t>(cands));
  GYRE_CUDA_CHECK(cudaMemsetAsync(sm, 0, sizeof(double) * cands, s));
  candidate_dot(w, fm, rows, cands, n, sm, s);
  GYRE_CUDA_CHECK(cudaMemcpyAsync(out, sm, sizeof(double) * cands, cudaMemcpyDeviceToHost, s));
}

void Engine::Impl::natural_factor(const double*& u_out, const int*& order_out) {
  u_out = u.get<double>();
  order_out = order_d.get<int>();
  if (std::is_sorted(order.begin(), order.end())) return;
  // act_order: factor H as it is
  std::vector<int> iota(static_cast<size_t>(n));
  std::iota(iota.begin(), iota.end(), 0);
  upload(order_nat, iota.data(), iota.size(), s);
  if (!u_nat_ready) {
    GYRE_CHECK(
        inverse_factor_device(blas, s, h.get<double>(), n, order_nat.get<int>(),
                              hdiag_d.get<double>(), damp_used * diag_mean,
                              u_nat.as<double>(static_cast<size_t>(n) * n), work1, work2, flag),
        "gptq: the Hessian does not factor in the natural order");
    u_nat_ready = true;
  }
  sync();  // iota must outlive its copy
  u_out = u_nat.get<double>();
  order_out = order_nat.get<int>();
}

void Engine::Impl::trellis_batch(const int* ks, const int* src, int cands, int group,
                                 double scale_fit, double* out) {
  GYRE_CHECK(rows > 0, "internal: gptq device without weight");
  const double* uf = nullptr;
  const int* ord = nullptr;
  natural_factor(uf, ord);
  const int64_t big = rows * cands * n;
  int64_t all_words = 0;
  for (int c = 0; c < cands; ++c) all_words += rows * n / 256 * 8 * ks[c];
  const int* src_dev = nullptr;
  if (src != nullptr) {
    upload(src_d, src, static_cast<size_t>(cands), s);
    src_dev = src_d.get<int>();
  }
  double* w = w_v.as<double>(static_cast<size_t>(big));
  stack_visiting<<<blocks_for(big, 256), 256, 0, s>>>(w, w_f.get<float>(), rows, cands, n, ord,
                                                      dead_d.get<uint8_t>(), src_dev);
  GYRE_CUDA_LAUNCHED();
  int* bad = flag.as<int>(1);
  GYRE_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), s));
  float* dq = dequant.as<float>(static_cast<size_t>(big));
  trellis_ldlq_device(blas, s, w, rows, cands, ks, n, uf, group, scale_fit, dq,
                      scale.as<float>(static_cast<size_t>(n / group) * rows * cands),
                      words.as<uint32_t>(static_cast<size_t>(all_words)), bad, tbufs);
  output_errors(dq, cands, w, out, src_dev);
  int bad_host = 0;
  GYRE_CUDA_CHECK(cudaMemcpyAsync(&bad_host, bad, sizeof(int), cudaMemcpyDeviceToHost, s));
  sync();
  GYRE_CHECK(!bad_host, "trellis: a group's scale overflows f16");
}

double Engine::trellis(int k, int group, double scale_fit) {
  Impl& m = *impl_;
  GYRE_CHECK(m.count == 1, "internal: one weight for Engine::trellis");
  double out = 0.0;
  m.trellis_k = 0;
  m.trellis_batch(&k, nullptr, 1, group, scale_fit, &out);
  m.last_group = group;
  m.trellis_k = k;
  return out;
}

std::vector<double> Engine::trellis_stack(const std::vector<int>& ks,
                                          const std::vector<int>& weight_of, int group,
                                          double scale_fit, bool keep) {
  Impl& m = *impl_;
  GYRE_CHECK(m.rows > 0, "internal: gptq device without weight");
  GYRE_CHECK(weight_of.size() == ks.size(), "internal: trellis stack sizes differ");
  for (int wi : weight_of)
    GYRE_CHECK(wi >= 0 && wi < m.count, "internal: trellis stack of a weight not set");
  m.trellis_k = 0;  // the outputs are the stack's, not one setting's
  m.kept_pos.clear();
  // Ordered by K, so that each K's candidates share one encoder launch.
  std::vector<int> by_k(ks.size());
  std::iota(by_k.begin(), by_k.end(), 0);
  std::stable_sort(by_k.begin(), by_k.end(), [&](int a, int b) { return ks[a] < ks[b]; });
  std::vector<int> k_sorted, src_sorted;
  for (int c : by_k) k_sorted.push_back(ks[c]), src_sorted.push_back(weight_of[c]);
  // Bounded like run(): work weights, errors, dequantized values and the error products.
  const double per_cand = static_cast<double>(m.rows) * m.n * 28.0;
  const size_t batch =
      std::max<size_t>(1, std::min({ks.size(), static_cast<size_t>(kMaxTrellisStack),
                                    static_cast<size_t>(kBatchBytes / per_cand)}));
  GYRE_CHECK(!keep || batch >= ks.size(), "internal: a kept trellis stack must fit one batch");
  std::vector<double> sorted(ks.size()), out(ks.size());
  for (size_t c0 = 0; c0 < ks.size(); c0 += batch)
    m.trellis_batch(k_sorted.data() + c0, src_sorted.data() + c0,
                    static_cast<int>(std::min(batch, ks.size() - c0)), group, scale_fit,
                    sorted.data() + c0);
  for (size_t i = 0; i < by_k.size(); ++i) out[by_k[i]] = sorted[i];
  if (keep) {
    m.last_group = group;
    m.kept_big_r = m.rows * static_cast<int64_t>(ks.size());
    m.kept_pos.assign(ks.size(), 0);
    m.kept_k = ks;
    m.kept_words.assign(ks.size(), 0);
    int64_t off = 0;
    for (size_t i = 0; i < by_k.size(); ++i) {
      m.kept_pos[by_k[i]] = static_cast<int>(i);
      m.kept_words[by_k[i]] = off;
      off += m.rows * m.n / 256 * 8 * k_sorted[i];
    }
  }
  return out;
}

std::vector<double> Engine::trellis_errors(const std::vector<int>& ks, int group,
                                           double scale_fit) {
  GYRE_CHECK(impl_->count == 1, "internal: one weight for Engine::trellis_errors");
  return trellis_stack(ks, std::vector<int>(ks.size(), 0), group, scale_fit, false);
}

void Engine::fetch_trellis_of(int c, float* dequant_out, float* scales, uint32_t* words_out) {
  Impl& m = *impl_;
  GYRE_CHECK(c >= 0 && c < static_cast<int>(m.kept_pos.size()),
             "internal: gptq device has no kept trellis candidate ", c);
  const int64_t p = m.kept_pos[c], R = m.kept_big_r;
  copy_row_major(dequant_out, m.dequant.get<float>() + p * m.rows, m.rows, m.n, m.f, m.s, R);
  copy_row_major(scales, m.scale.get<float>() + p * m.rows, m.rows, m.n / m.last_group, m.f, m.s,
                 R);
  GYRE_CUDA_CHECK(
      cudaMemcpyAsync(words_out, m.words.get<uint32_t>() + m.kept_words[c],
                      static_cast<size_t>(m.rows * m.n / 256) * 8 * m.kept_k[c] * sizeof(uint32_t),
                      cudaMemcpyDeviceToHost, m.s));
  m.sync();
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
