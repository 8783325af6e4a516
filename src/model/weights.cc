#include "model/weights.h"

#include "core/error.h"
#include "model/config.h"

namespace gyre {

void WeightSet::add(TensorView t) {
  GYRE_CHECK(!has(t.name), "tensor '", t.name, "' appears twice");
  std::string name = t.name;
  tensors_.emplace(std::move(name), std::move(t));
}

const TensorView& WeightSet::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("missing tensor '", name, "'");
  return it->second;
}

const TensorView& WeightSet::get(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorView& t = get(name);
  GYRE_CHECK(t.shape == shape, "tensor '", name, "' has shape ", shape_str(t.shape), ", expected ",
             shape_str(shape));
  return t;
}

std::string layer_tensor(int layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

void weights_validate(const WeightSet& w, const ModelConfig& c) {
  const int64_t dim = c.dim, hid = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  w.get("model.embed_tokens.weight", {c.vocab_size, dim});
  w.get("model.norm.weight", {dim});
  if (!c.tie_embeddings && w.has("lm_head.weight")) w.get("lm_head.weight", {c.vocab_size, dim});
  if (!c.tie_embeddings && !w.has("lm_head.weight"))
    fail("missing tensor 'lm_head.weight' (the config does not tie embeddings)");
  for (int i = 0; i < c.n_layers; ++i) {
    auto n = [i](const char* s) { return layer_tensor(i, s); };
    w.get(n("input_layernorm.weight"), {dim});
    w.get(n("post_attention_layernorm.weight"), {dim});
    w.get(n("self_attn.q_proj.weight"), {q, dim});
    w.get(n("self_attn.k_proj.weight"), {kv, dim});
    w.get(n("self_attn.v_proj.weight"), {kv, dim});
    w.get(n("self_attn.o_proj.weight"), {dim, q});
    if (c.qkv_bias) {
      w.get(n("self_attn.q_proj.bias"), {q});
      w.get(n("self_attn.k_proj.bias"), {kv});
      w.get(n("self_attn.v_proj.bias"), {kv});
    }
    w.get(n("mlp.gate_proj.weight"), {hid, dim});
    w.get(n("mlp.up_proj.weight"), {hid, dim});
    w.get(n("mlp.down_proj.weight"), {dim, hid});
  }
  for (const auto& [name, t] : w.all()) {
    GYRE_CHECK(t.data != nullptr || t.nbytes == 0, "tensor '", name, "' has no data");
    if (t.dtype == DType::QPACKED) continue;  // an object, not bytes: backends check its shape
    const size_t want = static_cast<size_t>(t.rows()) * dtype_row_bytes(t.dtype, t.cols());
    GYRE_CHECK(t.nbytes == want, "tensor '", name, "' holds ", t.nbytes, " bytes, its shape ",
               shape_str(t.shape), " of ", dtype_name(t.dtype), " needs ", want);
  }
}

}  // namespace gyre
