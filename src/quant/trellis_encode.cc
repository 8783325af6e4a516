#include "quant/trellis_encode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/trellis.h"
#include "core/error.h"

namespace gyre::quant {
namespace {

constexpr int kStates = 1 << kTrellisStateBits;

// The cost of state s = (b << K) | a (a: its low K bits, b = s >> K) after position i is
//   cost_i(a, b) = m_{i-1}[((b & M) << K) | a] + (t_i - sc_i * code(s))^2,   M = 2^(16-2K) - 1,
// where m_i[u] = min over a of cost_i(a, u): the states (u << K) | a are exactly the 2^K
// predecessors that every state whose low 16 - K bits are u shares. So a step needs only the
// previous minima (2^(16-K) of them), never a full cost array: for each a, one contiguous pass
// over b reading the minima transposed (T[a][j] = m[j * 2^K + a]) and the codebook in the same
// (a, b) order, which the compiler vectorizes.
struct Layout {
  int k, fan, groups, period;
  std::vector<float> code;  // code[a * groups + b] = code((b << K) | a)
  explicit Layout(int k_)
      : k(k_),
        fan(1 << k_),
        groups(1 << (kTrellisStateBits - k_)),
        period(1 << (kTrellisStateBits - 2 * k_)),
        code(kStates) {
    for (int a = 0; a < fan; ++a)
      for (int b = 0; b < groups; ++b)
        code[size_t(a) * groups + b] = float(trellis_code(uint32_t((b << k) | a)));
  }
};

const Layout& layout(int k) {
  static const Layout all[] = {Layout(2), Layout(3), Layout(4), Layout(5), Layout(6), Layout(8)};
  return all[k == 8 ? 5 : k - 2];
}

struct Scratch {
  std::vector<float> best, best_t;
  std::vector<int> arg;
  std::vector<uint8_t> back;  // [256][groups]: argmin a of each position's minima
};

// One a's states: best[b] = min(best[b], prev[b & (period - 1)] + (t - s * code[b])^2), with
// the sizes as constants so that the compiler vectorizes it whatever K is.
template <int K>
void relax_row(const float* __restrict code, const float* __restrict prev, float t, float s, int a,
               float* __restrict best, int* __restrict arg) {
  constexpr int groups = 1 << (kTrellisStateBits - K), period = 1 << (kTrellisStateBits - 2 * K);
  for (int r = 0; r < groups; r += period)
    for (int j = 0; j < period; ++j) {
      const int b = r + j;
      const float e = t - s * code[b];
      const float c = prev[j] + e * e;
      // Both stores unconditional (selects, not masked stores: several times faster).
      const float old = best[b];
      const int old_arg = arg[b];
      best[b] = std::min(c, old);
      arg[b] = c < old ? a : old_arg;
    }
}

using RelaxRow = void (*)(const float*, const float*, float, float, int, float*, int*);
RelaxRow relax_row_for(int k) {
  switch (k) {
    case 2:
      return relax_row<2>;
    case 3:
      return relax_row<3>;
    case 4:
      return relax_row<4>;
    case 5:
      return relax_row<5>;
    case 6:
      return relax_row<6>;
    default:
      return relax_row<8>;
  }
}

// Viterbi over positions order[0..255]. overlap < 0: free start and end; else the first state's
// low 16 - K bits must equal overlap and the last state's high 16 - K bits too. Fills states[i]
// (the state at order[i]) and returns the cost.
float viterbi(const float* t, const float* sc, const int* order, int k, int overlap,
              uint32_t* states, Scratch& w) {
  const Layout& lay = layout(k);
  const int fan = lay.fan, groups = lay.groups, period = lay.period;
  const uint32_t low_mask = uint32_t(groups - 1);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  w.best.resize(groups);
  w.best_t.resize(groups);
  w.arg.resize(groups);
  w.back.resize(size_t{kTrellisTileElems} * groups);
  float* best = w.best.data();
  float* best_t = w.best_t.data();
  int* arg = w.arg.data();
  const float* code = lay.code.data();
  const RelaxRow relax = relax_row_for(k);
  for (int i = 0; i < kTrellisTileElems; ++i) {
    const float tv = t[order[i]], s = sc[order[i]];
    if (i == 0) {
      // No predecessor: the "previous minimum" is 0, or infinity outside the overlap
      // constraint (the low 16 - K bits of the state).
      for (int a = 0; a < fan; ++a)
        for (int j = 0; j < period; ++j)
          best_t[a * period + j] =
              (overlap < 0 || int(((uint32_t(j) << k) | uint32_t(a)) & low_mask) == overlap) ? 0.0f
                                                                                             : kInf;
    }
    for (int b = 0; b < groups; ++b) best[b] = kInf, arg[b] = 0;
    for (int a = 0; a < fan; ++a)
      relax(code + size_t(a) * groups, best_t + a * period, tv, s, a, best, arg);
    uint8_t* back = &w.back[size_t(i) * groups];
    for (int b = 0; b < groups; ++b) back[b] = uint8_t(arg[b]);
    for (int a = 0; a < fan; ++a)
      for (int j = 0; j < period; ++j) best_t[a * period + j] = best[j * fan + a];
  }
  int last_b = -1;
  float best_cost = kInf;
  for (int b = 0; b < groups; ++b) {
    if (overlap >= 0 && b != overlap) continue;
    if (best[b] < best_cost) best_cost = best[b], last_b = b;
  }
  GYRE_CHECK(last_b >= 0, "trellis encoder: no admissible end state");
  uint32_t st = (uint32_t(last_b) << k) | w.back[size_t(kTrellisTileElems - 1) * groups + last_b];
  for (int i = kTrellisTileElems - 1; i >= 0; --i) {
    states[i] = st;
    if (i > 0) {
      const uint32_t g = st & low_mask;  // the predecessors' b
      st = (g << k) | w.back[size_t(i - 1) * groups + g];
    }
  }
  return best_cost;
}

void set_bits(uint32_t* words, int nbits, int b, uint32_t v, int n) {
  for (int i = 0; i < n; ++i) {
    const int bit = (b + i) % nbits;
    const uint32_t m = 1u << (bit & 31);
    words[bit >> 5] = (v >> i & 1u) ? (words[bit >> 5] | m) : (words[bit >> 5] & ~m);
  }
}

}  // namespace

double trellis_encode_tile(const float* t, const float* sc, int k, uint32_t* words) {
  GYRE_CHECK(trellis_bits_supported(k), "trellis encoder: unsupported bits per weight ", k);
  thread_local Scratch w;
  int order[kTrellisTileElems];
  uint32_t states[kTrellisTileElems];
  const int half = kTrellisTileElems / 2;
  for (int i = 0; i < kTrellisTileElems; ++i) order[i] = (i + half) % kTrellisTileElems;
  viterbi(t, sc, order, k, -1, states, w);
  const uint32_t low_mask = (1u << (kTrellisStateBits - k)) - 1;
  const int overlap = int(states[half] & low_mask);  // the state at position 0
  for (int i = 0; i < kTrellisTileElems; ++i) order[i] = i;
  viterbi(t, sc, order, k, overlap, states, w);
  const int nbits = kTrellisTileElems * k;
  for (int i = 0; i < trellis_tile_words(k); ++i) words[i] = 0;
  set_bits(words, nbits, 0, states[0], kTrellisStateBits);
  for (int p = 1; p < kTrellisTileElems; ++p)
    set_bits(words, nbits, k * p + kTrellisStateBits - k, states[p] >> (kTrellisStateBits - k), k);
  double err = 0.0;
  for (int p = 0; p < kTrellisTileElems; ++p) {
    const float e = t[p] - sc[p] * float(trellis_code(trellis_state(words, k, p)));
    err += double(e) * e;
  }
  return err;
}

}  // namespace gyre::quant
