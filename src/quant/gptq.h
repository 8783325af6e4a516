// GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
// Transformers", 2022) and round-to-nearest on one linear weight W [rows, cols] with the Hessian
// H = 2/N X^T X of its input X [N, cols].
//
// GPTQ, as implemented here: H is damped by damp * mean(diag H) (columns that never see input
// get H_ii = 1 and weight 0); with act-order the columns are visited in order of decreasing
// H_ii; U is the upper Cholesky factor of inverse(H) in that order. Visiting column j: q_j =
// quant(w_j), err = (w_j - q_j) / U_jj, and the later columns k get w_k -= err * U_jk. Updates
// inside a block of 128 columns are applied at once, those beyond it once per block (the paper's
// lazy batch; the result is the same). Groups are contiguous in the original column order (so
// the stored layout needs no permutation); a group's scale (and min) are chosen when its first
// column is visited, from the current values of all its columns (pending lazy updates
// included), so they see every error compensation made so far.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/hadamard.h"
#include "model/gyre_qformat.h"

namespace gyre::quant {

struct QuantizedWeight {
  QuantSetting setting;
  int rows = 0, cols = 0;
  std::vector<int> q;            // [rows, cols] stored integers, original column order
  std::vector<uint16_t> scales;  // [rows, cols / group] f16 bits
  std::vector<uint16_t> mins;    // same, asymmetric only
  std::vector<float> dequant;    // [rows, cols] the values the loader will produce
  std::vector<int> hi_groups;    // a mix: the groups at setting.mix_bits (mix_hi_groups)
  // setting.trellis: the tiles' words ([rows / 16][cols / 16][8K], backend/cpu/trellis.h; q
  // stays empty) in the rotated space like q.
  std::vector<uint32_t> trellis;
  // A rotated layer (quant/unit_quant.h): q, scales and mins quantize W R, and dequant is the
  // effective weight (W R)_q R^T in the original column space (what the layer computes with).
  HadamardRotation had;
};

// A group's f16 scale and min (min 0 when symmetric) for values v[0..n): symmetric
// s = max|v| / (2^(bits-1) - 1); asymmetric s = (max - min) / (2^bits - 1), m = min.
void choose_group_params(const double* v, int n, const QuantSetting& st, float& s, float& m);
// As choose_group_params, then the range shrunk by a factor a in {1, 0.98, ..., 0.70} (symmetric:
// max|v| * a; asymmetric: min and max * a) keeping the a with the least weighted rounding error
// sum_i h_i (v_i - deq(q(v_i)))^2 (h: the Hessian's diagonal over the group's columns, the
// part of GPTQ's objective one group controls alone). Clipping a few large values often costs
// less than the coarser step they force on all the others.
void choose_group_params_clipped(const double* v, const double* h, int n, const QuantSetting& st,
                                 float& s, float& m);
// The stored integer for value w (round to nearest, clamped).
int quantize_value(double w, const QuantSetting& st, float s, float m);

// Round to nearest, group parameters from the weights themselves (one width only: a mix picks its
// groups by input energy, which needs the Hessian).
QuantizedWeight rtn_quantize(const float* w, int rows, int cols, const QuantSetting& st);
// Whether w already lies on st's grid: round to nearest reproduces every value to within 2^-9 of
// its group's largest magnitude (FP16 rounding of scales and values; a value off the grid misses
// by up to half a step, at 8 bits 2^-8). A GGUF tensor exported to FP16 is, at its own width and
// block size or finer (Q4_1 at 4-bit asymmetric g32, Q8_0 at 8-bit symmetric g32). Stops at the
// first value that misses. One width only.
bool rtn_exact(const float* w, int64_t rows, int64_t cols, const QuantSetting& st);

// What GPTQ needs from H, shared by every setting measured on one input.
struct GptqPrep {
  int cols = 0;
  std::vector<int> order;     // visiting order: order[j] = original column
  std::vector<double> u;      // [cols x cols] upper factor, in visiting order
  std::vector<bool> dead;     // original columns with H_ii == 0
  double damp_used = 0.0;     // damping fraction actually used
  std::vector<double> hdiag;  // H_ii in original column order (dead columns: 1)
  bool clip_search = false;   // group parameters by choose_group_params_clipped
};

// h [cols x cols] symmetric. Throws gyre::Error when H cannot be factored even after raising the
// damping (up to 1.0).
GptqPrep gptq_prepare(const std::vector<double>& h, int cols, double damp, bool act_order);

// A mixed setting quantizes each group at its own width, the mix_hi_groups of the Hessian's
// diagonal (prep.hdiag) at mix_bits: layers sharing an input (q|k|v) get the same groups.
QuantizedWeight gptq_quantize(const float* w, int rows, int cols, const GptqPrep& prep,
                              const QuantSetting& st, int threads, int block = 128);

// tr(E H E^T) / tr(W H W^T) with E = W - Q (Q = q.dequant); 0 when W H W^T is 0.
double relative_error(const float* w, const QuantizedWeight& q, const std::vector<double>& h,
                      int threads);

}  // namespace gyre::quant
