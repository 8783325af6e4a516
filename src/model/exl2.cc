#include "model/exl2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/half.h"

namespace gyre {

namespace {

// Element i of an integer tensor (file data may be unaligned).
int64_t load_int(const TensorView& t, int64_t i) {
  if (t.dtype == DType::I16) {
    int16_t v;
    std::memcpy(&v, static_cast<const uint8_t*>(t.data) + i * 2, 2);
    return v;
  }
  int32_t v;
  std::memcpy(&v, static_cast<const uint8_t*>(t.data) + i * 4, 4);
  return v;
}

uint32_t load_word(const TensorView& t, int64_t i) {
  uint32_t v;
  std::memcpy(&v, static_cast<const uint8_t*>(t.data) + i * 4, 4);
  return v;
}

float round_f16(float x) {
  return f16_to_f32(f32_to_f16(x));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Checks a tensor's dtype (one of `dtypes`), its shape (its rank, when `shape` is empty) and
// that its bytes cover the shape.
void check_tensor(const std::string& layer, const char* what, const TensorView* t,
                  std::initializer_list<DType> dtypes, size_t rank) {
  GYRE_CHECK(t != nullptr, "EXL2 layer ", layer, ": missing ", what);
  GYRE_CHECK(std::find(dtypes.begin(), dtypes.end(), t->dtype) != dtypes.end(), "EXL2 layer ",
             layer, ": ", what, " is ", dtype_name(t->dtype), ", expected ",
             dtype_name(*dtypes.begin()));
  GYRE_CHECK(t->shape.size() == rank, "EXL2 layer ", layer, ": ", what, " has shape ",
             shape_str(t->shape), ", expected ", rank, " dimensions");
  for (int64_t d : t->shape)
    GYRE_CHECK(d > 0 && d <= (int64_t{1} << 30), "EXL2 layer ", layer, ": ", what, " has shape ",
               shape_str(t->shape));
  GYRE_CHECK(t->data != nullptr && t->nbytes >= dtype_row_bytes(t->dtype, t->numel()),
             "EXL2 layer ", layer, ": ", what, " has too few bytes for its shape ",
             shape_str(t->shape));
}

// Runs f(begin, end) over [0, count) split among a few threads (dequantizing a large model is
// otherwise the slowest part of loading it); f must not throw.
template <typename F>
void parallel_ranges(int64_t count, const F& f) {
  const int64_t threads =
      std::min<int64_t>({std::max(1u, std::thread::hardware_concurrency()), 16, 1 + count / 256});
  if (threads <= 1) return f(0, count);
  std::vector<std::thread> pool;
  for (int64_t k = 0; k < threads; ++k) {
    const int64_t begin = count * k / threads, end = count * (k + 1) / threads;
    try {
      pool.emplace_back([&f, begin, end] { f(begin, end); });
    } catch (const std::system_error&) {  // no thread to be had: do that part here
      f(begin, end);
    }
  }
  for (auto& th : pool) th.join();
}

struct Group {
  int bits;
  int64_t first_word_row;  // in q_weight
  int64_t first_row;       // quantized row
  int64_t rows;
};

// The group table, checked against q_weight's R packed rows and the K quantized rows.
std::vector<Group> read_groups(const std::string& layer, const TensorView& q_groups, int64_t R,
                               int64_t K) {
  GYRE_CHECK(q_groups.shape[0] % 2 == 0, "EXL2 layer ", layer, ": q_groups has ", q_groups.shape[0],
             " entries, expected (bits, row) pairs");
  const int64_t G = q_groups.shape[0] / 2;
  std::vector<Group> groups(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    // ExLlamaV2 reads its int16 q_groups as uint16 (packed rows past 32767 in huge layers).
    auto entry = [&](int64_t i) {
      const int64_t v = load_int(q_groups, i);
      return q_groups.dtype == DType::I16 ? v & 0xffff : v;
    };
    const int64_t bits = entry(2 * g), first = entry(2 * g + 1);
    GYRE_CHECK(bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8,
               "EXL2 layer ", layer, ": group ", g, " has ", bits,
               " bits (EXL2 uses 2, 3, 4, 5, 6 and 8)");
    GYRE_CHECK(g == 0 || bits <= groups[g - 1].bits, "EXL2 layer ", layer, ": group ", g, " has ",
               bits, " bits after a group of ", groups[g - 1].bits,
               " (ExLlamaV2 orders groups by decreasing bits)");
    GYRE_CHECK(g > 0 || first == 0, "EXL2 layer ", layer, ": the first group starts at packed row ",
               first, ", expected 0");
    GYRE_CHECK(g == 0 || (first > groups[g - 1].first_word_row && first < R), "EXL2 layer ", layer,
               ": group ", g, " starts at packed row ", first,
               ", outside the increasing rows of q_weight's ", R);
    groups[g] = {static_cast<int>(bits), first, 0, 0};
  }
  int64_t row = 0;
  for (int64_t g = 0; g < G; ++g) {
    Group& gr = groups[g];
    const int64_t words = (g + 1 < G ? groups[g + 1].first_word_row : R) - gr.first_word_row;
    if (g + 1 < G) {
      GYRE_CHECK(words * 32 % gr.bits == 0, "EXL2 layer ", layer, ": group ", g, " spans ", words,
                 " packed rows, not a whole number of ", gr.bits, "-bit rows");
      gr.rows = words * 32 / gr.bits;
    } else {
      gr.rows = K - row;
      GYRE_CHECK(gr.rows > 0 && (gr.rows * gr.bits + 31) / 32 == words, "EXL2 layer ", layer,
                 ": the last group's ", words, " packed rows of ", gr.bits,
                 " bits do not hold the ", gr.rows, " rows left of ", K);
    }
    GYRE_CHECK(row + gr.rows <= K, "EXL2 layer ", layer, ": the groups hold more than the ", K,
               " input rows of q_invperm");
    gr.first_row = row;
    row += gr.rows;
  }
  return groups;
}

}  // namespace

bool exl2_config_from_hf(const nlohmann::json& config, Exl2Config& out) {
  if (!config.is_object() || !config.contains("quantization_config")) return false;
  const nlohmann::json& q = config["quantization_config"];
  if (!q.is_object() || q.value("quant_method", nlohmann::json()) != "exl2") return false;
  try {
    out.bits = q.value("bits", 0.0);
    out.head_bits = q.value("head_bits", 0.0);
  } catch (const nlohmann::json::exception& e) {
    fail("config.json: malformed EXL2 quantization_config: ", e.what());
  }
  return true;
}

std::vector<float> exl2_dequantize(const std::string& name, const Exl2Tensors& t,
                                   int64_t out_features) {
  check_tensor(name, "q_weight", t.q_weight, {DType::I32}, 2);
  check_tensor(name, "q_invperm", t.q_invperm, {DType::I32, DType::I16}, 1);
  check_tensor(name, "q_groups", t.q_groups, {DType::I16, DType::I32}, 1);
  check_tensor(name, "q_scale", t.q_scale, {DType::I32}, 2);
  check_tensor(name, "q_scale_max", t.q_scale_max, {DType::F16}, 1);
  const int64_t R = t.q_weight->shape[0], Np = t.q_weight->shape[1], K = t.q_invperm->shape[0];
  GYRE_CHECK(Np % 32 == 0, "EXL2 layer ", name, ": q_weight has ", Np,
             " columns, not a multiple of 32");
  const int64_t N = out_features < 0 ? Np : out_features;
  GYRE_CHECK(N > 0 && (N + 31) / 32 * 32 == Np, "EXL2 layer ", name, ": q_weight's ", Np,
             " columns are not ", N, " output features padded to 32");
  const std::vector<Group> groups = read_groups(name, *t.q_groups, R, K);
  const auto G = static_cast<int64_t>(groups.size());
  GYRE_CHECK(groups.back().first_row + groups.back().rows == K, "EXL2 layer ", name,
             ": the groups do not cover the ", K, " input rows");
  GYRE_CHECK(t.q_scale->shape == std::vector<int64_t>({G, Np / 8}), "EXL2 layer ", name,
             ": q_scale has shape ", shape_str(t.q_scale->shape), ", expected ",
             shape_str({G, Np / 8}));
  GYRE_CHECK(t.q_scale_max->shape[0] == G, "EXL2 layer ", name, ": q_scale_max has ",
             t.q_scale_max->shape[0], " entries for ", G, " groups");

  // perm[r]: the input row that quantized row r belongs to (the inverse of q_invperm), built to
  // check that q_invperm is a permutation and q_perm its inverse.
  std::vector<int64_t> perm(static_cast<size_t>(K), -1), invperm(static_cast<size_t>(K));
  for (int64_t i = 0; i < K; ++i) {
    const int64_t r = invperm[i] = load_int(*t.q_invperm, i);
    GYRE_CHECK(r >= 0 && r < K && perm[r] < 0, "EXL2 layer ", name, ": q_invperm is not a ",
               "permutation of 0..", K - 1, " (entry ", i, " = ", r, ")");
    perm[r] = i;
  }
  if (t.q_perm) {
    check_tensor(name, "q_perm", t.q_perm, {DType::I32, DType::I16}, 1);
    GYRE_CHECK(t.q_perm->shape[0] == K, "EXL2 layer ", name, ": q_perm has ", t.q_perm->shape[0],
               " entries, q_invperm ", K);
    for (int64_t r = 0; r < K; ++r)
      GYRE_CHECK(load_int(*t.q_perm, r) == perm[r], "EXL2 layer ", name,
                 ": q_perm is not the inverse of q_invperm (entry ", r, ")");
  }

  // Every group's column scales (checked here: the parallel part below cannot throw).
  std::vector<float> scale(static_cast<size_t>(G * N));
  std::vector<int32_t> group_of_row(static_cast<size_t>(K));
  for (int64_t g = 0; g < G; ++g) {
    uint16_t max_bits;
    std::memcpy(&max_bits, static_cast<const uint8_t*>(t.q_scale_max->data) + g * 2, 2);
    const float max_scale = f16_to_f32(max_bits);
    GYRE_CHECK(std::isfinite(max_scale), "EXL2 layer ", name, ": q_scale_max[", g,
               "] is not finite");
    // The loader's prescale (exact by 1/256 unless the result is subnormal in fp16).
    const float m = round_f16(max_scale / 256.0f);
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t code = (load_word(*t.q_scale, g * (Np / 8) + n / 8) >> (4 * (n % 8))) & 15u;
      const float c = static_cast<float>(code + 1);
      scale[g * N + n] = round_f16(c * c * m);
    }
    std::fill_n(group_of_row.begin() + groups[g].first_row, groups[g].rows,
                static_cast<int32_t>(g));
  }
  // Quantized rows first ([K, N], written in order), then a blocked transpose that undoes the
  // act-order: writing W[n, i] directly would touch a new cache line per value.
  std::vector<float> rows(static_cast<size_t>(N * K));
  parallel_ranges(K, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const Group& gr = groups[group_of_row[r]];
      const float* s = scale.data() + group_of_row[r] * N;
      const uint32_t mask = (1u << gr.bits) - 1;
      const int zero = 1 << (gr.bits - 1);
      const int64_t bit = (r - gr.first_row) * gr.bits, word_row = gr.first_word_row + bit / 32;
      const int shift = static_cast<int>(bit % 32);
      const bool straddles = shift + gr.bits > 32;  // then word_row + 1 < R (checked groups)
      float* out = rows.data() + r * N;
      for (int64_t n = 0; n < N; ++n) {
        uint64_t v = load_word(*t.q_weight, word_row * Np + n);
        if (straddles)
          v |= static_cast<uint64_t>(load_word(*t.q_weight, (word_row + 1) * Np + n)) << 32;
        const int q = static_cast<int>((v >> shift) & mask);
        out[n] = round_f16(static_cast<float>(q - zero) * s[n]);
      }
    }
  });
  std::vector<float> w(rows.size());
  constexpr int64_t kTile = 64;
  parallel_ranges((K + kTile - 1) / kTile, [&](int64_t b0, int64_t b1) {
    for (int64_t i0 = b0 * kTile; i0 < std::min(b1 * kTile, K); i0 += kTile)
      for (int64_t n0 = 0; n0 < N; n0 += kTile)
        for (int64_t i = i0; i < std::min(i0 + kTile, K); ++i) {
          const float* src = rows.data() + invperm[i] * N;
          for (int64_t n = n0; n < std::min(n0 + kTile, N); ++n) w[n * K + i] = src[n];
        }
  });
  return w;
}

int64_t exl2_out_features(const ModelConfig& c, const std::string& layer) {
  if (layer == "lm_head") return c.vocab_size;
  if (layer.rfind("model.layers.", 0) != 0) return -1;
  if (ends_with(layer, ".self_attn.q_proj")) return c.q_dim();
  if (ends_with(layer, ".self_attn.k_proj") || ends_with(layer, ".self_attn.v_proj"))
    return c.kv_dim();
  if (ends_with(layer, ".self_attn.o_proj") || ends_with(layer, ".mlp.down_proj")) return c.dim;
  if (ends_with(layer, ".mlp.gate_proj") || ends_with(layer, ".mlp.up_proj")) return c.hidden_dim;
  return -1;
}

void exl2_load_weights(const ModelConfig& c, std::shared_ptr<const WeightSet> raw, WeightSet& out) {
  const std::string suffix = ".q_weight";
  std::vector<std::string> prefixes;
  for (const auto& [name, view] : raw->all())
    if (ends_with(name, suffix)) prefixes.push_back(name.substr(0, name.size() - suffix.size()));
  GYRE_CHECK(!prefixes.empty(), "EXL2 model has no .q_weight tensors");
  std::vector<std::string> consumed;
  for (const std::string& p : prefixes) {
    auto find = [&](const char* part) {
      return raw->has(p + part) ? &raw->get(p + part) : nullptr;
    };
    Exl2Tensors t{find(".q_weight"), find(".q_scale"),   find(".q_scale_max"),
                  find(".q_groups"), find(".q_invperm"), find(".q_perm")};
    const std::vector<float> w = exl2_dequantize(p, t, exl2_out_features(c, p));
    const int64_t k = t.q_invperm->shape[0], n = static_cast<int64_t>(w.size()) / k;
    // Every value is an fp16 number, so F16 holds the weight exactly in half the memory.
    auto bytes = std::make_shared<std::vector<uint8_t>>(w.size() * 2);
    for (size_t i = 0; i < w.size(); ++i) {
      const uint16_t h = f32_to_f16(w[i]);
      std::memcpy(bytes->data() + i * 2, &h, 2);
    }
    TensorView v;
    v.name = p + ".weight";
    v.dtype = DType::F16;
    v.shape = {n, k};
    v.data = bytes->data();
    v.nbytes = bytes->size();
    out.add(std::move(v));
    out.keep(std::move(bytes));
    for (const char* part :
         {".q_weight", ".q_scale", ".q_scale_max", ".q_groups", ".q_invperm", ".q_perm"})
      consumed.push_back(p + part);
  }
  std::sort(consumed.begin(), consumed.end());
  for (const auto& [name, view] : raw->all())
    if (!std::binary_search(consumed.begin(), consumed.end(), name)) out.add(view);
  out.keep_owner(std::move(raw));
}

}  // namespace gyre
