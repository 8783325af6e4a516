// Test helper: the host arrays of a PagedBatch for sequences whose pages are known, each running
// positions [first[i], first[i] + rows[i]) (shared by the paged attention and rope/store tests).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace gyre {

struct HostPagedBatch {
  std::vector<int32_t> positions, seq_starts{0}, context_lens, tables;
  std::vector<int64_t> slots;
  PagedBatch batch;  // points into the vectors above: do not copy a HostPagedBatch
  HostPagedBatch(const std::vector<std::vector<int32_t>>& pages, const std::vector<int>& first,
                 const std::vector<int>& rows, int page_size, uint64_t generation) {
    int max_pages = 0;
    for (const auto& p : pages) max_pages = std::max(max_pages, static_cast<int>(p.size()));
    for (size_t i = 0; i < pages.size(); ++i) {
      for (int r = 0; r < rows[i]; ++r) {
        const int pos = first[i] + r;
        positions.push_back(pos);
        slots.push_back(int64_t{pages[i][size_t(pos / page_size)]} * page_size + pos % page_size);
      }
      seq_starts.push_back(static_cast<int32_t>(positions.size()));
      context_lens.push_back(first[i] + rows[i]);
      std::vector<int32_t> t = pages[i];
      t.resize(size_t(max_pages), -1);
      tables.insert(tables.end(), t.begin(), t.end());
    }
    batch.rows = static_cast<int>(positions.size());
    batch.seqs = static_cast<int>(pages.size());
    batch.positions = positions.data();
    batch.slots = slots.data();
    batch.seq_starts = seq_starts.data();
    batch.context_lens = context_lens.data();
    batch.page_tables = tables.data();
    batch.max_pages = max_pages;
    batch.generation = generation;
  }
  HostPagedBatch(const HostPagedBatch&) = delete;
  HostPagedBatch& operator=(const HostPagedBatch&) = delete;
};

}  // namespace gyre
