// Choosing one quantization setting per unit (a group of linear layers that share an input and
// are stored alike) to minimize the summed measured error under a budget of stored bits: a
// multiple-choice knapsack solved by dynamic programming over the budget.
#pragma once
#include <string>
#include <vector>

namespace gyre::quant {

struct Choice {
  double cost_bits = 0;  // stored bits of the whole unit under this setting (metadata included)
  double error = 0;      // its summed (weighted) relative output error
};

// Index of the chosen option for each unit; the chosen costs sum to at most budget_bits.
// Costs are rounded up to multiples of budget_bits / steps (never down, so the budget holds);
// when every cost is a whole number and budget_bits <= steps the answer is exactly optimal.
// Throws gyre::Error when even the cheapest options exceed the budget.
std::vector<int> choose_settings(const std::vector<std::vector<Choice>>& units, double budget_bits,
                                 int steps = 20000);

}  // namespace gyre::quant
