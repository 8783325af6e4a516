// Paged KV cache manager against a reference model: a simulated KV memory (one token id per
// slot, written exactly where the page table says) must, read back through each sequence's page
// table, reproduce that sequence's true token history; refcounts must equal the page-table
// references counted independently; prefix hits must equal a naive search over every block
// prefix ever written (while nothing was evicted).
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "engine/kv_pages.h"

namespace gyre {
namespace {

// Simulated backend K/V memory: slot (page, i) holds the token id whose KV it stores.
struct PageStore {
  PageStore(int num_pages, int page_size)
      : page_size(page_size), slots(size_t(num_pages) * page_size, -1) {}
  void run_copies(const std::vector<PageCopy>& copies) {
    for (const PageCopy& c : copies)
      for (int i = 0; i < c.num_tokens; ++i)
        slots[size_t(c.dst) * page_size + i] = slots[size_t(c.src) * page_size + i];
  }
  int32_t& at(const std::vector<PageId>& table, int pos) {
    return slots.at(size_t(table.at(pos / page_size)) * page_size + pos % page_size);
  }
  std::vector<int32_t> read(const std::vector<PageId>& table, int len) {
    std::vector<int32_t> out;
    for (int p = 0; p < len; ++p) out.push_back(at(table, p));
    return out;
  }
  int page_size;
  std::vector<int32_t> slots;
};

// Test driver: the manager, the simulated memory and the true token history of each sequence.
struct Harness {
  Harness(int num_pages, int page_size, KvPageManager::HashFn hash = nullptr)
      : kv(num_pages, page_size, hash), store(num_pages, page_size) {}

  // Reserves, "runs" (copies, then slot writes) and appends; false if out of pages.
  bool write(SeqId id, const std::vector<int32_t>& tokens) {
    const std::vector<PageId> before = kv.page_table(id);
    const int len = kv.length(id);
    if (!kv.reserve(id, int(tokens.size()))) {
      EXPECT_EQ(kv.page_table(id), before);  // failure changes nothing
      EXPECT_EQ(kv.length(id), len);
      return false;
    }
    store.run_copies(kv.take_copies());
    const std::vector<PageId> table = kv.page_table(id);
    for (size_t i = 0; i < tokens.size(); ++i) {
      const PageId page = table[(len + i) / kv.page_size()];
      EXPECT_EQ(kv.refcount(page), 1) << "write into a shared page";
      EXPECT_FALSE(kv.is_published(page)) << "write into a published page";
      store.at(table, len + int(i)) = tokens[i];
    }
    kv.append(id, tokens);
    auto& h = history[id];
    const size_t old_blocks = h.size() / kv.page_size();
    h.insert(h.end(), tokens.begin(), tokens.end());
    for (size_t b = old_blocks; b < h.size() / kv.page_size(); ++b)
      written_prefixes.insert(
          std::vector<int32_t>(h.begin(), h.begin() + (b + 1) * kv.page_size()));
    return true;
  }

  // Naive oracle: longest run of full blocks, leaving one token, that some sequence wrote.
  int expected_hit(const std::vector<int32_t>& prompt) const {
    const int ps = kv.page_size();
    int best = 0;
    for (int b = 1; b <= int(prompt.size() - 1) / ps; ++b) {
      if (!written_prefixes.count(std::vector<int32_t>(prompt.begin(), prompt.begin() + b * ps)))
        break;
      best = b * ps;
    }
    return best;
  }

  int admit(SeqId id, const std::vector<int32_t>& prompt) {
    kv.create(id);
    const int hit = kv.match_prefix(id, prompt);
    EXPECT_EQ(hit % kv.page_size(), 0);
    EXPECT_LT(hit, int(prompt.size()));
    history[id].assign(prompt.begin(), prompt.begin() + hit);
    return hit;
  }

  void release(SeqId id) {
    kv.release(id);
    history.erase(id);
  }

  void check_invariants() {
    const int n = kv.num_pages();
    std::vector<int> refs(n, 0);
    for (const auto& [id, h] : history) {
      ASSERT_TRUE(kv.contains(id));
      const auto& table = kv.page_table(id);
      for (PageId p : table) refs.at(p)++;
      ASSERT_EQ(kv.length(id), int(h.size()));
      ASSERT_EQ(store.read(table, int(h.size())), h) << "sequence " << id << " sees wrong tokens";
    }
    ASSERT_EQ(kv.sequences().size(), history.size());
    int used = 0, shared = 0, cached = 0, free_pages = 0;
    for (PageId p = 0; p < n; ++p) {
      ASSERT_EQ(kv.refcount(p), refs[p]) << "page " << p;
      const bool is_free = kv.is_free(p), is_cached = kv.is_cached(p);
      if (refs[p] > 0) {
        ASSERT_FALSE(is_free || is_cached) << "referenced page " << p << " on a free/LRU list";
      } else {
        ASSERT_NE(is_free, is_cached) << "unreferenced page " << p << " must be free xor cached";
        ASSERT_EQ(is_cached, kv.is_published(p));
      }
      used += refs[p] > 0;
      shared += refs[p] > 1;
      cached += is_cached;
      free_pages += is_free;
    }
    const KvPageStats st = kv.stats();
    ASSERT_EQ(st.used_pages, used);
    ASSERT_EQ(st.shared_pages, shared);
    ASSERT_EQ(st.cached_pages, cached);
    ASSERT_EQ(st.free_pages, free_pages);
    ASSERT_EQ(used + cached + free_pages, n);
    ASSERT_EQ(kv.available_pages(), cached + free_pages);
  }

  KvPageManager kv;
  PageStore store;
  std::map<SeqId, std::vector<int32_t>> history;
  std::set<std::vector<int32_t>> written_prefixes;
};

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

uint64_t constant_hash(uint64_t, const int32_t*, int) {
  return 42;
}

TEST(KvPages, ReserveAppendAndRelease) {
  Harness h(8, 4);
  h.kv.create(1);
  h.history[1];
  ASSERT_TRUE(h.write(1, iota_tokens(10, 100)));
  EXPECT_EQ(h.kv.page_table(1).size(), 3u);  // ceil(10 / 4)
  h.check_invariants();
  EXPECT_EQ(h.kv.stats().used_pages, 3);
  EXPECT_EQ(h.kv.stats().free_pages, 5);
  h.release(1);
  h.check_invariants();
  // The two full pages stay cached for reuse, the partial one is freed.
  EXPECT_EQ(h.kv.stats().cached_pages, 2);
  EXPECT_EQ(h.kv.stats().free_pages, 6);
}

TEST(KvPages, AllocationFailureChangesNothing) {
  Harness h(3, 4);
  h.kv.create(1);
  h.history[1];
  ASSERT_TRUE(h.write(1, iota_tokens(9, 0)));  // 3 pages
  EXPECT_FALSE(h.write(1, iota_tokens(4, 50)));
  EXPECT_EQ(h.kv.pages_needed(1, 3), 0);  // room left in the last page
  EXPECT_TRUE(h.write(1, iota_tokens(3, 50)));
  h.check_invariants();
  EXPECT_THROW(h.kv.append(1, iota_tokens(1, 9)), Error);  // not reserved
  EXPECT_THROW(h.kv.create(1), Error);
  EXPECT_THROW(h.kv.page_table(7), Error);
}

TEST(KvPages, SharedPrefixMapsSamePagesAndKeepsOneTokenToRun) {
  Harness h(16, 4);
  const auto prompt = iota_tokens(11, 0);
  EXPECT_EQ(h.admit(1, prompt), 0);
  ASSERT_TRUE(h.write(1, prompt));
  // Same 8-token prefix, different continuation.
  auto other = iota_tokens(8, 0);
  other.push_back(99);
  EXPECT_EQ(h.admit(2, other), 8);
  EXPECT_EQ(h.kv.page_table(2)[0], h.kv.page_table(1)[0]);
  EXPECT_EQ(h.kv.page_table(2)[1], h.kv.page_table(1)[1]);
  EXPECT_EQ(h.kv.refcount(h.kv.page_table(1)[0]), 2);
  // Exactly 8 tokens, fully cached: only the first block may be reused.
  EXPECT_EQ(h.admit(3, iota_tokens(8, 0)), 4);
  h.check_invariants();
  ASSERT_TRUE(h.write(2, {99}));
  h.check_invariants();
  const KvPageStats st = h.kv.stats();
  EXPECT_EQ(st.prefix_hit_tokens, 12);
  EXPECT_EQ(st.prefix_query_tokens, 8 + 8 + 4);  // 11 -> 2 blocks, 9 -> 2 blocks, 8 -> 1 block
  EXPECT_NEAR(st.hit_rate(), 12.0 / 20.0, 1e-12);
}

TEST(KvPages, MismatchedTokensNeverHitEvenWithCollidingHashes) {
  Harness h(16, 4, constant_hash);  // every block collides: only verification separates them
  ASSERT_EQ(h.admit(1, iota_tokens(9, 0)), 0);
  ASSERT_TRUE(h.write(1, iota_tokens(9, 0)));
  auto p = iota_tokens(9, 0);
  p[5] = 77;  // second block differs
  EXPECT_EQ(h.admit(2, p), 4);
  // Same block contents in a different chain position must not match either.
  auto shifted = iota_tokens(4, 4);
  shifted.insert(shifted.end(), {0, 1, 2, 3, 9});
  EXPECT_EQ(h.admit(3, shifted), 0);
  h.check_invariants();
}

TEST(KvPages, ConcurrentIdenticalBlocksAreDeduplicated) {
  Harness h(16, 4);
  const auto prompt = iota_tokens(9, 0);
  h.admit(1, prompt);
  h.admit(2, prompt);  // nothing cached yet: both compute the prefix
  ASSERT_TRUE(h.write(1, prompt));
  ASSERT_TRUE(h.write(2, prompt));
  EXPECT_EQ(h.kv.page_table(1)[0], h.kv.page_table(2)[0]);
  EXPECT_EQ(h.kv.page_table(1)[1], h.kv.page_table(2)[1]);
  EXPECT_NE(h.kv.page_table(1)[2], h.kv.page_table(2)[2]);  // partial pages stay private
  h.check_invariants();
  EXPECT_EQ(h.kv.stats().used_pages, 4);
  EXPECT_EQ(h.kv.stats().deduplicated_pages, 2);
}

TEST(KvPages, ForkSharesPagesAndCopiesOnWrite) {
  Harness h(16, 4);
  h.admit(1, iota_tokens(7, 0));
  ASSERT_TRUE(h.write(1, iota_tokens(6, 0)));  // one full page, one with 2 tokens
  h.kv.fork(1, 2);
  h.history[2] = h.history[1];
  const PageId shared_partial = h.kv.page_table(1)[1];
  EXPECT_EQ(h.kv.refcount(shared_partial), 2);
  h.check_invariants();
  ASSERT_TRUE(h.write(2, {50, 51}));  // child diverges: gets a copy of the partial page
  EXPECT_NE(h.kv.page_table(2)[1], shared_partial);
  EXPECT_EQ(h.kv.refcount(shared_partial), 1);
  EXPECT_EQ(h.kv.stats().cow_copies, 1);
  ASSERT_TRUE(h.write(1, {60, 61, 62}));  // parent now owns its page alone: no copy
  EXPECT_EQ(h.kv.page_table(1)[1], shared_partial);
  EXPECT_EQ(h.kv.stats().cow_copies, 1);
  h.check_invariants();
}

TEST(KvPages, CachedPagesEvictedLeastRecentlyUsedOnlyWhenNoFreePage) {
  Harness h(6, 2);
  // Three finished sequences, each leaving two cached full pages.
  for (SeqId id = 1; id <= 3; ++id) {
    const auto prompt = iota_tokens(5, int32_t(id) * 100);
    h.admit(id, prompt);
    ASSERT_TRUE(h.write(id, std::vector<int32_t>(prompt.begin(), prompt.begin() + 4)));
    h.release(id);
  }
  EXPECT_EQ(h.kv.stats().cached_pages, 6);
  // Touch sequence 1's prefix: it becomes the most recently used.
  EXPECT_EQ(h.admit(4, iota_tokens(5, 100)), 4);
  h.release(4);
  // Two new pages must evict exactly sequence 2's pages (now the least recently used).
  h.kv.create(5);
  h.history[5];
  ASSERT_TRUE(h.write(5, iota_tokens(3, 900)));
  EXPECT_EQ(h.kv.stats().evictions, 2);
  h.check_invariants();
  EXPECT_EQ(h.admit(6, iota_tokens(5, 200)), 0);
  EXPECT_EQ(h.admit(7, iota_tokens(5, 100)), 4);
  EXPECT_EQ(h.admit(8, iota_tokens(5, 300)), 4);
  h.check_invariants();
}

TEST(KvPages, FreePagesAreUsedBeforeAnyEviction) {
  Harness h(8, 2);
  h.admit(1, iota_tokens(5, 0));
  ASSERT_TRUE(h.write(1, iota_tokens(4, 0)));
  h.release(1);  // 2 cached, 6 free
  h.kv.create(2);
  h.history[2];
  ASSERT_TRUE(h.write(2, iota_tokens(12, 50)));  // exactly the 6 free pages
  EXPECT_EQ(h.kv.stats().evictions, 0);
  EXPECT_EQ(h.admit(3, iota_tokens(5, 0)), 4);
  h.check_invariants();
}

// Random workloads: prompts share a few base prefixes over a small alphabet (so partial and
// accidental matches happen), sequences grow, fork and leave under memory pressure.
void random_workload(int num_pages, int page_size, KvPageManager::HashFn hash, uint32_t seed) {
  Harness h(num_pages, page_size, hash);
  std::mt19937 rng(seed);
  auto rand_int = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> bases;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> b(rand_int(0, 6 * page_size));
    for (auto& t : b) t = rand_int(0, 3);
    bases.push_back(b);
  }
  SeqId next_id = 1;
  int64_t hits_checked = 0;
  for (int op = 0; op < 1500; ++op) {
    const int kind = rand_int(0, 9);
    std::vector<SeqId> live;
    for (const auto& [id, hist] : h.history) live.push_back(id);
    if (kind <= 2 && live.size() < 10) {
      auto prompt = bases[rand_int(0, 3)];
      for (int i = rand_int(1, 3 * page_size); i > 0; --i) prompt.push_back(rand_int(0, 3));
      const bool exact = h.kv.stats().evictions == 0;
      const int want = h.expected_hit(prompt);
      const SeqId id = next_id++;
      const int hit = h.admit(id, prompt);
      if (exact) {
        ASSERT_EQ(hit, want) << "op " << op;
      }
      ASSERT_LE(hit, want);  // only ever hit prefixes that were really written
      hits_checked += hit > 0;
      // Prefill the rest of the prompt if it fits, else drop the sequence (a scheduler would
      // preempt).
      if (!h.write(id, std::vector<int32_t>(prompt.begin() + hit, prompt.end()))) h.release(id);
    } else if (kind <= 6 && !live.empty()) {
      const SeqId id = live[rand_int(0, int(live.size()) - 1)];
      std::vector<int32_t> tokens(rand_int(1, 2 * page_size));
      for (auto& t : tokens) t = rand_int(0, 3);
      if (!h.write(id, tokens)) h.release(id);
    } else if (kind == 7 && !live.empty() && live.size() < 10) {
      const SeqId parent = live[rand_int(0, int(live.size()) - 1)];
      const SeqId child = next_id++;
      h.kv.fork(parent, child);
      h.history[child] = h.history[parent];
    } else if (!live.empty()) {
      h.release(live[rand_int(0, int(live.size()) - 1)]);
    }
    h.check_invariants();
    if (testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(hits_checked, 20);
  EXPECT_GT(h.kv.stats().evictions, 0);
  // Pages of one token are never partial, so they never need copy-on-write.
  EXPECT_TRUE(page_size == 1 || h.kv.stats().cow_copies > 0);
}

TEST(KvPages, RandomWorkloadsMatchReferenceModel) {
  for (uint32_t seed = 1; seed <= 2; ++seed) {
    random_workload(40, 4, nullptr, seed);
    random_workload(24, 1, nullptr, seed + 100);
    random_workload(60, 3, constant_hash, seed + 200);
  }
}

}  // namespace
}  // namespace gyre
