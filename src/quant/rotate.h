// Incoherence processing at no inference cost (the idea of QuaRot / SliceGPT, read for the idea
// only): the residual stream is rotated by a random orthogonal matrix Q (x' = x Q), and the
// rotation is folded into the weights, so the result is still a plain Llama in Gyre's format.
// A rotated weight's entries are mixtures of many original ones, so outlier columns spread out
// and group quantization loses less.
//
// RMSNorm commutes with Q only without its per-channel gain, so every norm gain g is first folded
// into the linears that read the normed vector and the norm weights become 1:
//   embed E -> E Q;  q/k/v, gate/up W -> W diag(g) Q;  o, down W -> Q^T W;
//   head W -> W diag(g_final) Q (the head becomes its own tensor: tied embeddings are untied).
// Inside attention each KV head's values get an orthogonal rotation R too (v_proj rows and
// bias: R^T W, R^T b; o_proj columns of every query head reading it: W R), which spreads the
// value/output weights the same way. Rotated tensors are stored as F16 (the embedding table and
// the head too): enough to keep the model's logits within float tolerance.
#pragma once
#include <cstdint>
#include <vector>

#include "model/loader.h"

namespace gyre::quant {

// A random orthogonal n x n matrix (row-major, float64): Gram-Schmidt on Gaussian columns with
// the signs fixed so the result is Haar-distributed. Deterministic for a seed.
std::vector<double> random_orthogonal(int n, uint64_t seed);

// Rewrites m's weights as described above (m.config.tie_embeddings becomes false; the new
// tensors are owned by m.weights). dtype: F16 or F32 for the rotated tensors.
void rotate_model(LoadedModel& m, uint64_t seed, DType dtype = DType::F16);

}  // namespace gyre::quant
