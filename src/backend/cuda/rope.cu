// Rotary position embedding, in place on [n_tokens, n_heads * head_dim] FP16.
// One thread per (token, head, pair): angle = position * inv_freq[pair], computed in f32 with
// full-range sincosf (positions reach 32k+, where __sincosf loses accuracy); cos and sin are
// scaled by attn_factor (YaRN mscale). Pairs are (2i, 2i+1) when interleaved (GGUF llama) and
// (i, i + rot_dim/2) otherwise (HF rotate_half); dims past rot_dim are left alone (partial RoPE).
// Positions come from device memory so a captured decode step can replay with new positions.
// Alternatives: a precomputed cos/sin table would save the sincosf but costs memory traffic and
// must be rebuilt for dynamic NTK scaling; the op is tiny either way.
#include "backend/cuda/launch.h"

namespace gyre::cuda {

namespace {

__global__ void rope_kernel(half* x, half* x2, const int32_t* positions, const float* inv_freq,
                            RopeArgs a) {
  pdl_begin();
  const int half_rot = a.rot_dim / 2;
  const int heads = a.n_heads + a.n_heads2;
  const int64_t total = static_cast<int64_t>(a.n_tokens) * heads * half_rot;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half_rot);
    const int64_t th = idx / half_rot;  // token * heads + head (x's heads, then x2's)
    const int token = static_cast<int>(th / heads), hd = static_cast<int>(th % heads);
    half* head = hd < a.n_heads ? x + (static_cast<int64_t>(token) * a.n_heads + hd) * a.head_dim
                                : x2 + (static_cast<int64_t>(token) * a.n_heads2 + hd - a.n_heads) *
                                           a.head_dim;
    float sn, cs;
    sincosf(static_cast<float>(positions[token]) * inv_freq[i], &sn, &cs);
    cs *= a.attn_factor;
    sn *= a.attn_factor;
    const int i0 = a.interleaved ? 2 * i : i;
    const int i1 = a.interleaved ? 2 * i + 1 : i + half_rot;
    const float x0 = __half2float(head[i0]), x1 = __half2float(head[i1]);
    head[i0] = __float2half(x0 * cs - x1 * sn);
    head[i1] = __float2half(x0 * sn + x1 * cs);
  }
}

}  // namespace

void rope(half* x, half* x2, const int32_t* positions, const float* inv_freq, const RopeArgs& a,
          cudaStream_t s) {
  const int64_t total =
      static_cast<int64_t>(a.n_tokens) * (a.n_heads + a.n_heads2) * (a.rot_dim / 2);
  if (total <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  launch(rope_kernel, static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kThreads, 0, s, x, x2,
         positions, inv_freq, a);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
