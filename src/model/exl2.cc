#include "model/exl2.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

namespace {

// A layer's checked tables: its groups, the act-order permutation, every group's column scales
// (fp16 values) and the code of each quantized row and column.
struct Exl2Layer {
  int64_t K = 0, N = 0, Np = 0;
  std::vector<Group> groups;
  std::vector<int64_t> perm, invperm;  // perm[r]: the input row of quantized row r
  std::vector<float> scale;            // [G, N]
  std::vector<int32_t> group_of_row;   // [K]
  const TensorView* q_weight = nullptr;

  int code(int64_t r, int64_t n) const {
    const Group& gr = groups[group_of_row[r]];
    const int64_t bit = (r - gr.first_row) * gr.bits, word_row = gr.first_word_row + bit / 32;
    const int shift = static_cast<int>(bit % 32);
    uint64_t v = load_word(*q_weight, word_row * Np + n);
    if (shift + gr.bits > 32)  // straddles: then word_row + 1 < R (checked groups)
      v |= static_cast<uint64_t>(load_word(*q_weight, (word_row + 1) * Np + n)) << 32;
    return static_cast<int>((v >> shift) & ((1u << gr.bits) - 1));
  }
};

Exl2Layer read_layer(const std::string& name, const Exl2Tensors& t, int64_t out_features) {
  check_tensor(name, "q_weight", t.q_weight, {DType::I32}, 2);
  check_tensor(name, "q_invperm", t.q_invperm, {DType::I32, DType::I16}, 1);
  check_tensor(name, "q_groups", t.q_groups, {DType::I16, DType::I32}, 1);
  check_tensor(name, "q_scale", t.q_scale, {DType::I32}, 2);
  check_tensor(name, "q_scale_max", t.q_scale_max, {DType::F16}, 1);
  Exl2Layer l;
  l.q_weight = t.q_weight;
  const int64_t R = t.q_weight->shape[0], Np = l.Np = t.q_weight->shape[1];
  const int64_t K = l.K = t.q_invperm->shape[0];
  GYRE_CHECK(Np % 32 == 0, "EXL2 layer ", name, ": q_weight has ", Np,
             " columns, not a multiple of 32");
  const int64_t N = l.N = out_features < 0 ? Np : out_features;
  GYRE_CHECK(N > 0 && (N + 31) / 32 * 32 == Np, "EXL2 layer ", name, ": q_weight's ", Np,
             " columns are not ", N, " output features padded to 32");
  l.groups = read_groups(name, *t.q_groups, R, K);
  const std::vector<Group>& groups = l.groups;
  const auto G = static_cast<int64_t>(groups.size());
  GYRE_CHECK(groups.back().first_row + groups.back().rows == K, "EXL2 layer ", name,
             ": the groups do not cover the ", K, " input rows");
  GYRE_CHECK(t.q_scale->shape == std::vector<int64_t>({G, Np / 8}), "EXL2 layer ", name,
             ": q_scale has shape ", shape_str(t.q_scale->shape), ", expected ",
             shape_str({G, Np / 8}));
  GYRE_CHECK(t.q_scale_max->shape[0] == G, "EXL2 layer ", name, ": q_scale_max has ",
             t.q_scale_max->shape[0], " entries for ", G, " groups");

  // perm is the inverse of q_invperm, built to check that q_invperm is a permutation and
  // q_perm its inverse.
  l.perm.assign(static_cast<size_t>(K), -1);
  l.invperm.resize(static_cast<size_t>(K));
  for (int64_t i = 0; i < K; ++i) {
    const int64_t r = l.invperm[i] = load_int(*t.q_invperm, i);
    GYRE_CHECK(r >= 0 && r < K && l.perm[r] < 0, "EXL2 layer ", name, ": q_invperm is not a ",
               "permutation of 0..", K - 1, " (entry ", i, " = ", r, ")");
    l.perm[r] = i;
  }
  if (t.q_perm) {
    check_tensor(name, "q_perm", t.q_perm, {DType::I32, DType::I16}, 1);
    GYRE_CHECK(t.q_perm->shape[0] == K, "EXL2 layer ", name, ": q_perm has ", t.q_perm->shape[0],
               " entries, q_invperm ", K);
    for (int64_t r = 0; r < K; ++r)
      GYRE_CHECK(load_int(*t.q_perm, r) == l.perm[r], "EXL2 layer ", name,
                 ": q_perm is not the inverse of q_invperm (entry ", r, ")");
  }

  // Every group's column scales (checked here: the parallel parts cannot throw).
  l.scale.resize(static_cast<size_t>(G * N));
  l.group_of_row.resize(static_cast<size_t>(K));
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
      l.scale[g * N + n] = round_f16(c * c * m);
    }
    std::fill_n(l.group_of_row.begin() + groups[g].first_row, groups[g].rows,
                static_cast<int32_t>(g));
  }
  return l;
}

bool gyre_group_size_ok(int bits, int64_t rows) {
  return rows == 32 || rows == 64 || rows == 128 || rows == 256 || (bits == 8 && rows == 16);
}

// One width's groups [g0, g1) as Gyre keeps them: `group` rows per group, the last group padded
// with zero-valued columns up to it (ExLlamaV2's last group of a layer can be short).
struct WidthRun {
  size_t g0 = 0, g1 = 0;
  int group = 0;
  int64_t padding = 0;
};

// The run's group size, or 0 when Gyre's layouts cannot hold it: every group but the last has
// the first's row count, a supported size, and the last at most that many; a run of one group
// takes the smallest supported size that holds it.
int run_group_size(const std::vector<Group>& groups, size_t g0, size_t g1) {
  const int bits = groups[g0].bits;
  const int64_t first = groups[g0].rows;
  if (g1 - g0 == 1) {
    for (int size : {16, 32, 64, 128, 256})
      if (size >= first && gyre_group_size_ok(bits, size)) return size;
    return 0;
  }
  for (size_t g = g0 + 1; g < g1; ++g)
    if (groups[g].rows > first || (g + 1 < g1 && groups[g].rows != first)) return 0;
  return gyre_group_size_ok(bits, first) ? static_cast<int>(first) : 0;
}

// The run as a QWeightHost over its quantized rows in order (packed column j = quantized row
// first_row + j, padding after them), with EXL2's codes and fp16 scales; no permutation.
QWeightHost pack_run(const Exl2Layer& l, const WidthRun& run) {
  const Group& first = l.groups[run.g0];
  QWeightDesc d;
  d.bits = first.bits;
  d.group_size = run.group;
  d.rows = static_cast<int>(l.N);
  d.cols = static_cast<int>(static_cast<int64_t>(run.g1 - run.g0) * run.group);
  const int64_t real = d.cols - run.padding;
  QWeightHost w = qweight_allocate(d);
  parallel_ranges(l.N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t j = 0; j < d.cols; ++j)  // padding: the zero code, value 0
        qweight_set_q(w, n, j, j < real ? l.code(first.first_row + j, n) : 1 << (d.bits - 1));
      for (size_t g = run.g0; g < run.g1; ++g)  // an fp16 value: set exactly
        qweight_set_scale(w, n, static_cast<int64_t>(g - run.g0), l.scale[g * l.N + n], 0.0f);
    }
  });
  return w;
}

}  // namespace

std::vector<float> exl2_dequantize(const std::string& name, const Exl2Tensors& t,
                                   int64_t out_features) {
  const Exl2Layer l = read_layer(name, t, out_features);
  const int64_t K = l.K, N = l.N;
  // Quantized rows first ([K, N], written in order), then a blocked transpose that undoes the
  // act-order: writing W[n, i] directly would touch a new cache line per value.
  std::vector<float> rows(static_cast<size_t>(N * K));
  parallel_ranges(K, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int zero = 1 << (l.groups[l.group_of_row[r]].bits - 1);
      const float* s = l.scale.data() + l.group_of_row[r] * N;
      float* out = rows.data() + r * N;
      for (int64_t n = 0; n < N; ++n)
        out[n] = round_f16(static_cast<float>(l.code(r, n) - zero) * s[n]);
    }
  });
  std::vector<float> w(rows.size());
  constexpr int64_t kTile = 64;
  parallel_ranges((K + kTile - 1) / kTile, [&](int64_t b0, int64_t b1) {
    for (int64_t i0 = b0 * kTile; i0 < std::min(b1 * kTile, K); i0 += kTile)
      for (int64_t n0 = 0; n0 < N; n0 += kTile)
        for (int64_t i = i0; i < std::min(i0 + kTile, K); ++i) {
          const float* src = rows.data() + l.invperm[i] * N;
          for (int64_t n = n0; n < std::min(n0 + kTile, N); ++n) w[n * K + i] = src[n];
        }
  });
  return w;
}

Exl2Quantized exl2_quantize_layer(const std::string& name, const Exl2Tensors& t,
                                  int64_t out_features) {
  const Exl2Layer l = read_layer(name, t, out_features);
  Exl2Quantized q;
  // Runs of one width (widths never increase, so each width is one run) and their group sizes.
  std::vector<WidthRun> runs;
  for (size_t g = 0; g <= l.groups.size(); ++g)
    if (g == l.groups.size() || g == 0 || l.groups[g].bits != l.groups[g - 1].bits) {
      if (!runs.empty()) runs.back().g1 = g;
      if (g < l.groups.size()) runs.push_back({g, 0, 0, 0});
    }
  GYRE_CHECK(runs.size() <= static_cast<size_t>(kQMixedMaxParts), "EXL2 layer ", name, ": ",
             runs.size(), " bit widths");  // read_layer allows six, in decreasing order
  for (WidthRun& run : runs) {
    run.group = run_group_size(l.groups, run.g0, run.g1);
    if (run.group == 0) {
      q.reason = "an unsupported group size";
      return q;
    }
    run.padding =
        static_cast<int64_t>(run.g1 - run.g0) * run.group -
        (l.groups[run.g1 - 1].first_row + l.groups[run.g1 - 1].rows - l.groups[run.g0].first_row);
  }
  if (runs.size() == 1 && runs[0].padding == 0) {
    q.single = std::make_shared<QWeightHost>(pack_run(l, runs[0]));
    bool identity = true;
    for (int64_t r = 0; r < l.K; ++r) identity = identity && l.perm[r] == r;
    if (!identity) {
      q.single->desc.has_perm = true;
      q.single->perm.assign(l.perm.begin(), l.perm.end());
    }
    return q;
  }
  // Each width reads the inputs of its quantized rows (a mix's parts have no permutation of
  // their own: their column lists are the act-order), then its padding.
  q.mixed = std::make_shared<QMixedHost>();
  q.mixed->rows = static_cast<int>(l.N);
  q.mixed->cols = static_cast<int>(l.K);
  for (const WidthRun& run : runs) {
    QMixedPart part{pack_run(l, run), {}};
    const int64_t r0 = l.groups[run.g0].first_row;
    const int64_t r1 = r0 + part.w.desc.cols - run.padding;
    part.cols.assign(l.perm.begin() + r0, l.perm.begin() + r1);
    part.cols.resize(static_cast<size_t>(part.w.desc.cols), -1);
    q.mixed->parts.push_back(std::move(part));
  }
  qmixed_validate(*q.mixed);
  return q;
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

namespace {

// The other layers the engine fuses with layer p (q|k|v, gate|up of one decoder layer).
std::vector<std::string> fused_partners(const std::string& p) {
  const std::vector<std::vector<std::string>> sets = {
      {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj"},
      {".mlp.gate_proj", ".mlp.up_proj"}};
  for (const auto& set : sets)
    for (const std::string& own : set) {
      if (!ends_with(p, own)) continue;
      const std::string stem = p.substr(0, p.size() - own.size());
      std::vector<std::string> others;
      for (const std::string& o : set)
        if (o != own) others.push_back(stem + o);
      return others;
    }
  return {};
}

}  // namespace

std::string Exl2LoadReport::summary() const {
  std::string s = "EXL2: " + std::to_string(quantized) + " of " +
                  std::to_string(quantized + dequantized) + " layers kept quantized, " +
                  std::to_string(dequantized) + " dequantized to F16";
  for (size_t i = 0; i < reasons.size(); ++i)
    s += (i == 0 ? " (" : ", ") + std::to_string(reasons[i].second) + " with " + reasons[i].first;
  return s + (reasons.empty() ? "" : ")");
}

Exl2LoadReport exl2_load_weights(const ModelConfig& c, std::shared_ptr<const WeightSet> raw,
                                 WeightSet& out) {
  const std::string suffix = ".q_weight";
  std::vector<std::string> prefixes;
  for (const auto& [name, view] : raw->all())
    if (ends_with(name, suffix)) prefixes.push_back(name.substr(0, name.size() - suffix.size()));
  GYRE_CHECK(!prefixes.empty(), "EXL2 model has no .q_weight tensors");
  Exl2LoadReport report;
  std::vector<std::string> consumed;
  std::vector<Exl2Tensors> tensors;
  std::vector<Exl2Quantized> quantized;
  for (const std::string& p : prefixes) {
    auto find = [&](const char* part) {
      return raw->has(p + part) ? &raw->get(p + part) : nullptr;
    };
    tensors.push_back({find(".q_weight"), find(".q_scale"), find(".q_scale_max"), find(".q_groups"),
                       find(".q_invperm"), find(".q_perm")});
    for (const char* part :
         {".q_weight", ".q_scale", ".q_scale_max", ".q_groups", ".q_invperm", ".q_perm"})
      consumed.push_back(p + part);
    quantized.push_back(exl2_quantize_layer(p, tensors.back(), exl2_out_features(c, p)));
  }
  // The engine fuses q|k|v and gate|up, which needs one dtype per fused weight: a layer kept
  // quantized whose partner is dequantized is dequantized too.
  for (size_t i = 0; i < prefixes.size(); ++i) {
    if (quantized[i].single || quantized[i].mixed) continue;
    for (const std::string& partner : fused_partners(prefixes[i])) {
      const auto it = std::find(prefixes.begin(), prefixes.end(), partner);
      if (it == prefixes.end()) continue;
      Exl2Quantized& q = quantized[static_cast<size_t>(it - prefixes.begin())];
      if (!q.single && !q.mixed) continue;
      q = Exl2Quantized{};
      q.reason = "a dequantized fused partner";
    }
  }
  for (size_t i = 0; i < prefixes.size(); ++i) {
    const std::string& p = prefixes[i];
    const Exl2Tensors& t = tensors[i];
    Exl2Quantized& q = quantized[i];
    const int64_t out_features = exl2_out_features(c, p);
    if (q.single || q.mixed) {
      ++report.quantized;
      if (q.single) {
        out.add(qweight_view(p + ".weight", *q.single));
        out.keep_owner(std::move(q.single));
      } else {
        out.add(qmixed_view(p + ".weight", *q.mixed));
        out.keep_owner(std::move(q.mixed));
      }
      continue;
    }
    ++report.dequantized;
    auto it = std::find_if(report.reasons.begin(), report.reasons.end(),
                           [&](const auto& r) { return r.first == q.reason; });
    if (it == report.reasons.end()) {
      report.reasons.emplace_back(q.reason, 1);
    } else {
      ++it->second;
    }
    const std::vector<float> w = exl2_dequantize(p, t, out_features);
    const int64_t k = t.q_invperm->shape[0], n = static_cast<int64_t>(w.size()) / k;
    // Every value is an fp16 number, so F16 holds the weight exactly in half the memory.
    auto bytes = std::make_shared<std::vector<uint8_t>>(w.size() * 2);
    for (size_t j = 0; j < w.size(); ++j) {
      const uint16_t h = f32_to_f16(w[j]);
      std::memcpy(bytes->data() + j * 2, &h, 2);
    }
    TensorView v;
    v.name = p + ".weight";
    v.dtype = DType::F16;
    v.shape = {n, k};
    v.data = bytes->data();
    v.nbytes = bytes->size();
    out.add(std::move(v));
    out.keep(std::move(bytes));
  }
  std::sort(consumed.begin(), consumed.end());
  for (const auto& [name, view] : raw->all())
    if (!std::binary_search(consumed.begin(), consumed.end(), name)) out.add(view);
  out.keep_owner(std::move(raw));
  std::fprintf(stderr, "gyre: %s\n", report.summary().c_str());
  return report;
}

}  // namespace gyre
