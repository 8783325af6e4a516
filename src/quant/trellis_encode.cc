#include "quant/trellis_encode.h"

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/trellis.h"
#include "core/error.h"

namespace gyre::quant {
namespace {

constexpr int kStates = 1 << kTrellisStateBits;

struct Codebook {
  std::vector<float> code;
  Codebook() : code(kStates) {
    for (int s = 0; s < kStates; ++s) code[s] = float(trellis_code(uint32_t(s)));
  }
};

const Codebook& codebook() {
  static const Codebook cb;
  return cb;
}

struct Scratch {
  std::vector<float> cost, next, best;
  std::vector<uint8_t> back;  // [256][kStates]: the dropped low K bits of the predecessor
};

// Viterbi over positions order[0..255]. overlap < 0: free start and end; else the first state's
// low 16 - K bits must equal overlap and the last state's high 16 - K bits too. Fills states[i]
// (the state at order[i]) and returns the cost.
float viterbi(const float* t, const float* sc, const int* order, int k, int overlap,
              uint32_t* states, Scratch& w) {
  const std::vector<float>& code = codebook().code;
  const int hi_bits = kTrellisStateBits - k;
  const uint32_t low_mask = (1u << hi_bits) - 1;
  const int groups = 1 << hi_bits, fan = 1 << k;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  w.cost.resize(kStates);
  w.next.resize(kStates);
  w.best.resize(groups);
  w.back.resize(size_t{kTrellisTileElems} * kStates);
  {
    const float tv = t[order[0]], s = sc[order[0]];
    for (int st = 0; st < kStates; ++st) {
      const float e = tv - s * code[st];
      w.cost[st] = (overlap < 0 || int(st & low_mask) == overlap) ? e * e : kInf;
    }
  }
  std::vector<uint8_t> arg(groups);
  for (int i = 1; i < kTrellisTileElems; ++i) {
    // Predecessors of state st are ((st << k) & 0xFFFF) | low: they depend on st's low 16 - K
    // bits only, so one min per group u serves all 2^K states sharing u.
    for (int u = 0; u < groups; ++u) {
      const float* c = &w.cost[size_t(u) << k];
      float m = c[0];
      int a = 0;
      for (int low = 1; low < fan; ++low)
        if (c[low] < m) m = c[low], a = low;
      w.best[u] = m;
      arg[u] = uint8_t(a);
    }
    const float tv = t[order[i]], s = sc[order[i]];
    uint8_t* back = &w.back[size_t(i) * kStates];
    for (int hi = 0; hi < fan; ++hi) {
      const int base = hi << hi_bits;
      for (int u = 0; u < groups; ++u) {
        const float e = tv - s * code[base + u];
        w.next[base + u] = w.best[u] + e * e;
        back[base + u] = arg[u];
      }
    }
    w.cost.swap(w.next);
  }
  int last = -1;
  float best = kInf;
  for (int st = 0; st < kStates; ++st) {
    if (overlap >= 0 && int(uint32_t(st) >> k) != overlap) continue;
    if (w.cost[st] < best) best = w.cost[st], last = st;
  }
  GYRE_CHECK(last >= 0, "trellis encoder: no admissible end state");
  uint32_t st = uint32_t(last);
  for (int i = kTrellisTileElems - 1; i >= 0; --i) {
    states[i] = st;
    if (i > 0) st = ((st << k) & 0xFFFFu) | w.back[size_t(i) * kStates + st];
  }
  return best;
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
