#include "quant/block_forward.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cpu/qmixed.h"
#include "core/error.h"

namespace gyre::quant {

const char* unit_name(Unit u) {
  switch (u) {
    case Unit::QKV:
      return "q|k|v";
    case Unit::O:
      return "o";
    case Unit::GateUp:
      return "gate|up";
    case Unit::Down:
      return "down";
  }
  return "?";
}

std::vector<std::string> unit_linears(Unit u) {
  switch (u) {
    case Unit::QKV:
      return {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"};
    case Unit::O:
      return {"self_attn.o_proj"};
    case Unit::GateUp:
      return {"mlp.gate_proj", "mlp.up_proj"};
    case Unit::Down:
      return {"mlp.down_proj"};
  }
  return {};
}

std::vector<float> tensor_to_f32(const TensorView& t) {
  const int64_t rows = t.rows(), cols = t.cols();
  if (is_qmixed_view(t)) {  // a mix of two widths (gyre_qformat.h)
    const QMixedHost& w = qmixed_of_view(t);
    std::vector<float> out(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) qmixed_dequantize_row(w, r, out.data() + r * cols);
    return out;
  }
  if (t.dtype == DType::QPACKED) {  // 4/8-bit layers of a Gyre-quantized or GPTQ model
    const QWeightHost& w = qweight_of_view(t);
    std::vector<float> out(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) qweight_dequantize_row(w, r, out.data() + r * cols);
    return out;
  }
  const size_t row_bytes = dtype_row_bytes(t.dtype, cols);
  GYRE_CHECK(t.data != nullptr && t.nbytes >= row_bytes * static_cast<size_t>(rows), "tensor ",
             t.name, " has too few bytes for its shape");
  std::vector<float> out(static_cast<size_t>(rows * cols));
  std::vector<uint8_t> aligned(row_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    // A copy keeps every read aligned, whatever the file offset.
    std::memcpy(aligned.data(), static_cast<const uint8_t*>(t.data) + r * row_bytes, row_bytes);
    dequantize_row(t.dtype, aligned.data(), out.data() + r * cols, cols);
  }
  return out;
}

BlockWeights block_weights_from(const WeightSet& w, const ModelConfig& c, int layer) {
  BlockWeights b;
  auto get = [&](const std::string& suffix) {
    b.t[suffix] = tensor_to_f32(w.get(layer_tensor(layer, (suffix + ".weight").c_str())));
  };
  for (int u = 0; u < kUnits; ++u)
    for (const std::string& s : unit_linears(static_cast<Unit>(u))) get(s);
  get("input_layernorm");
  get("post_attention_layernorm");
  if (c.qkv_bias)
    for (const char* p :
         {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"})
      b.t[p] = tensor_to_f32(w.get(layer_tensor(layer, p)));
  return b;
}

BlockRunner::BlockRunner(Backend& backend, const ModelConfig& c, int rows, int length)
    : be_(backend), c_(c), rows_(rows), length_(length) {
  rope_.rot_dim = c.rope.rot_dim > 0 ? c.rope.rot_dim : c.head_dim;
  rope_.interleaved = c.rope.interleaved;
  rope_.inv_freq = rope_inv_freq(c.rope, c.max_seq_len, 0);
  rope_.attn_factor = rope_attention_factor(c.rope, c.max_seq_len);
  cache_ = be_.new_kv_cache(1, c.n_kv_heads, c.head_dim, length);
  positions_.resize(static_cast<size_t>(rows) * length);
  for (size_t i = 0; i < positions_.size(); ++i) positions_[i] = static_cast<int32_t>(i % length);
}

Tensor BlockRunner::weight(const std::vector<float>& w, int64_t rows, int64_t cols) {
  GYRE_CHECK(w.size() == static_cast<size_t>(rows * cols), "internal: weight size mismatch");
  return be_.upload_weight(
      f32_view("quantizer weight", w,
               rows == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{rows, cols}));
}

// The backend has no host-to-activation copy; embedding rows 0..n-1 of a table made from the
// host rows is one (the CPU backend reads the table in place).
Tensor BlockRunner::to_device(const std::vector<float>& host, int64_t rows, int64_t cols) {
  Tensor table = weight(host, rows, cols);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) ids[i] = static_cast<int32_t>(i);
  Tensor out = be_.alloc(rows, cols);
  be_.embed(out, table, ids.data(), static_cast<int>(rows));
  return out;
}

std::vector<float> BlockRunner::to_host(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.rows * t.cols));
  be_.to_host(t, out.data());
  return out;
}

std::pair<int64_t, int64_t> BlockRunner::shape_of(const std::string& name) const {
  const int64_t dim = c_.dim, qd = c_.q_dim(), kvd = c_.kv_dim(), ff = c_.hidden_dim;
  if (name == "self_attn.q_proj") return {qd, dim};
  if (name == "self_attn.k_proj" || name == "self_attn.v_proj") return {kvd, dim};
  if (name == "self_attn.o_proj") return {dim, qd};
  if (name == "mlp.gate_proj" || name == "mlp.up_proj") return {ff, dim};
  if (name == "mlp.down_proj") return {dim, ff};
  if (name == "input_layernorm" || name == "post_attention_layernorm") return {1, dim};
  if (name == "self_attn.q_proj.bias") return {1, qd};
  if (name == "self_attn.k_proj.bias" || name == "self_attn.v_proj.bias") return {1, kvd};
  fail("internal: no block tensor '", name, "'");
}

Tensor BlockRunner::upload_tensor(const std::string& name, const std::vector<float>& host) {
  const auto [rows, cols] = shape_of(name);
  return weight(host, rows, cols);
}

DeviceBlock BlockRunner::upload(const BlockWeights& w) {
  DeviceBlock d;
  for (const auto& [name, host] : w.t) d.t[name] = upload_tensor(name, host);
  return d;
}

Tensor BlockRunner::to_device(const std::vector<float>& host) {
  return to_device(host, int64_t{rows_} * length_, c_.dim);
}

void BlockRunner::run(std::vector<float>& hidden, BlockWeights& w, const UnitHook& hook) {
  const int64_t n = int64_t{rows_} * length_;
  GYRE_CHECK(hidden.size() == static_cast<size_t>(n * c_.dim), "internal: hidden size mismatch");
  Tensor x = to_device(hidden, n, c_.dim);
  // Each weight is uploaded when the forward reaches it, after the hook of its unit ran.
  forward(
      x,
      [&](const std::string& name) {
        const auto it = w.t.find(name);
        return it == w.t.end() ? Tensor{} : upload_tensor(name, it->second);
      },
      [&](Unit unit, const Tensor& in) {
        if (hook) hook(unit, to_host(in), n, w);
      });
  hidden = to_host(x);
}

void BlockRunner::run(Tensor& hidden, DeviceBlock w, const DeviceUnitHook& hook) {
  const int64_t n = int64_t{rows_} * length_;
  GYRE_CHECK(hidden.rows == n && hidden.cols == c_.dim, "internal: hidden size mismatch");
  forward(
      hidden,
      [&](const std::string& name) {
        const auto it = w.t.find(name);
        return it == w.t.end() ? Tensor{} : it->second;
      },
      [&](Unit unit, const Tensor& in) {
        if (hook) hook(unit, to_host(in), n, w);
      });
}

void BlockRunner::forward(Tensor& x, const std::function<Tensor(const std::string&)>& get,
                          const std::function<void(Unit, const Tensor&)>& at_unit) {
  const int64_t n = int64_t{rows_} * length_;
  const int dim = c_.dim, qd = c_.q_dim(), kvd = c_.kv_dim(), ff = c_.hidden_dim;
  Tensor xn = be_.alloc(n, dim);
  be_.rmsnorm(xn, x, get("input_layernorm"), c_.norm_eps);
  at_unit(Unit::QKV, xn);
  Tensor q = be_.alloc(n, qd), k = be_.alloc(n, kvd), v = be_.alloc(n, kvd);
  auto proj = [&](Tensor& out, const char* name) {
    Tensor b;
    if (c_.qkv_bias) b = get(std::string(name) + ".bias");
    be_.matmul(out, xn, get(name), b.data != nullptr ? &b : nullptr);
  };
  proj(q, "self_attn.q_proj");
  proj(k, "self_attn.k_proj");
  proj(v, "self_attn.v_proj");
  be_.rope(q, c_.n_heads, c_.head_dim, positions_.data(), rope_);
  be_.rope(k, c_.n_kv_heads, c_.head_dim, positions_.data(), rope_);
  AttentionParams ap;
  ap.n_heads = c_.n_heads;
  ap.n_kv_heads = c_.n_kv_heads;
  ap.head_dim = c_.head_dim;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
  ap.sliding_window = c_.sliding_window;
  Tensor att = be_.alloc(n, qd);
  for (int r = 0; r < rows_; ++r) {
    const int64_t r0 = int64_t{r} * length_;
    Tensor o = att.slice_rows(r0, length_);
    be_.attention(o, q.slice_rows(r0, length_), k.slice_rows(r0, length_),
                  v.slice_rows(r0, length_), *cache_, 0, 0, ap);
  }
  at_unit(Unit::O, att);
  Tensor delta = be_.alloc(n, dim);
  be_.matmul(delta, att, get("self_attn.o_proj"), nullptr);
  be_.add(x, delta);
  be_.rmsnorm(xn, x, get("post_attention_layernorm"), c_.norm_eps);
  at_unit(Unit::GateUp, xn);
  Tensor gate = be_.alloc(n, ff), up = be_.alloc(n, ff);
  be_.matmul(gate, xn, get("mlp.gate_proj"), nullptr);
  be_.matmul(up, xn, get("mlp.up_proj"), nullptr);
  be_.silu_mul(gate, gate, up);
  at_unit(Unit::Down, gate);
  be_.matmul(delta, gate, get("mlp.down_proj"), nullptr);
  be_.add(x, delta);
}

Tensor BlockRunner::logits(const Tensor& hidden, const Tensor& norm, const Tensor& head) {
  const int64_t n = int64_t{rows_} * length_;
  Tensor xn = be_.alloc(n, c_.dim), out = be_.alloc(n, head.rows);
  be_.rmsnorm(xn, hidden, norm, c_.norm_eps);
  be_.matmul(out, xn, head, nullptr);
  return out;
}

std::vector<float> BlockRunner::final_norm(const std::vector<float>& hidden,
                                           const std::vector<float>& norm) {
  const int64_t n = int64_t{rows_} * length_;
  Tensor x = to_device(hidden, n, c_.dim), xn = be_.alloc(n, c_.dim);
  be_.rmsnorm(xn, x, weight(norm, 1, c_.dim), c_.norm_eps);
  return to_host(xn);
}

std::vector<float> BlockRunner::logits(const std::vector<float>& normed,
                                       const std::vector<float>& head, int64_t vocab) {
  const int64_t n = int64_t{rows_} * length_;
  Tensor x = to_device(normed, n, c_.dim), out = be_.alloc(n, vocab);
  be_.matmul(out, x, weight(head, vocab, c_.dim), nullptr);
  return to_host(out);
}

}  // namespace gyre::quant
