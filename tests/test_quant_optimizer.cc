// The per-layer setting choice against brute force over every combination.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "quant/optimizer.h"

namespace gyre::quant {
namespace {

TEST(QuantOptimizer, OptimalOnTinyInstancesVersusBruteForce) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    const int units = 1 + static_cast<int>(rng() % 4);
    std::vector<std::vector<Choice>> inst(units);
    double cheapest = 0;
    for (auto& u : inst) {
      const int n = 1 + static_cast<int>(rng() % 4);
      double lo = 1e9;
      for (int c = 0; c < n; ++c) {
        Choice ch;
        ch.cost_bits = static_cast<double>(1 + rng() % 40);  // whole numbers: the DP is exact
        ch.error = std::ldexp(static_cast<double>(rng() % 1000), -8);
        lo = std::min(lo, ch.cost_bits);
        u.push_back(ch);
      }
      cheapest += lo;
    }
    const double budget = cheapest + static_cast<double>(rng() % 60);
    // Brute force: every combination within the budget.
    double best = INFINITY;
    std::vector<int> idx(units, 0);
    for (;;) {
      double cost = 0, err = 0;
      for (int u = 0; u < units; ++u)
        cost += inst[u][idx[u]].cost_bits, err += inst[u][idx[u]].error;
      if (cost <= budget) best = std::min(best, err);
      int u = 0;
      while (u < units && ++idx[u] == static_cast<int>(inst[u].size())) idx[u++] = 0;
      if (u == units) break;
    }
    const std::vector<int> pick = choose_settings(inst, budget);
    double cost = 0, err = 0;
    for (int u = 0; u < units; ++u)
      cost += inst[u][pick[u]].cost_bits, err += inst[u][pick[u]].error;
    EXPECT_LE(cost, budget);
    EXPECT_DOUBLE_EQ(err, best) << "trial " << trial;
  }
}

TEST(QuantOptimizer, MeetsALargeBudgetWithRoundedCosts) {
  std::mt19937 rng(7);
  std::vector<std::vector<Choice>> inst(56);
  double mid = 0;
  for (auto& u : inst) {
    const double numel = 1e5 + static_cast<double>(rng() % 1000000);
    for (double bpw : {2.5, 3.125, 4.25, 5.125, 6.25, 8.125})
      u.push_back({numel * bpw, std::exp2(-2.0 * bpw) * (1 + rng() % 5)});
    mid += numel * 4.0;
  }
  const std::vector<int> pick = choose_settings(inst, mid, 5000);
  double cost = 0;
  for (size_t u = 0; u < inst.size(); ++u) cost += inst[u][pick[u]].cost_bits;
  EXPECT_LE(cost, mid);
  EXPECT_GT(cost, 0.97 * mid);  // it spends the budget rather than leaving most of it
}

TEST(QuantOptimizer, ImpossibleBudgetIsAnError) {
  std::vector<std::vector<Choice>> inst = {{{100, 1}, {50, 2}}, {{60, 1}}};
  EXPECT_THROW(choose_settings(inst, 100), Error);
}

}  // namespace
}  // namespace gyre::quant
