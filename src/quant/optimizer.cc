#include "quant/optimizer.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/error.h"

namespace gyre::quant {

std::vector<int> choose_settings(const std::vector<std::vector<Choice>>& units, double budget_bits,
                                 int steps) {
  GYRE_CHECK(budget_bits > 0 && std::isfinite(budget_bits), "bit budget must be positive");
  GYRE_CHECK(steps > 0, "optimizer: steps must be positive");
  const double unit = budget_bits <= steps ? 1.0 : budget_bits / steps;
  const int64_t cap = static_cast<int64_t>(std::floor(budget_bits / unit + 1e-9));
  const double inf = std::numeric_limits<double>::infinity();
  // best[b]: least error of the units so far using at most b budget units.
  std::vector<double> best(static_cast<size_t>(cap + 1), 0.0), next;
  std::vector<std::vector<int>> pick(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    GYRE_CHECK(!units[u].empty(), "optimizer: a layer has no candidate settings");
    next.assign(best.size(), inf);
    pick[u].assign(best.size(), -1);
    for (size_t c = 0; c < units[u].size(); ++c) {
      const Choice& ch = units[u][c];
      const auto cost = static_cast<int64_t>(std::ceil(ch.cost_bits / unit - 1e-9));
      for (int64_t b = cost; b <= cap; ++b) {
        const double e = best[b - cost] + ch.error;
        if (e < next[b]) {
          next[b] = e;
          pick[u][b] = static_cast<int>(c);
        }
      }
    }
    best.swap(next);
  }
  GYRE_CHECK(best[cap] < inf, "the bit budget of ", budget_bits / 1e6,
             " Mbit is below what the cheapest settings need; raise --bpw");
  std::vector<int> out(units.size());
  int64_t b = cap;
  for (size_t u = units.size(); u-- > 0;) {
    out[u] = pick[u][b];
    b -= static_cast<int64_t>(std::ceil(units[u][out[u]].cost_bits / unit - 1e-9));
  }
  return out;
}

}  // namespace gyre::quant
