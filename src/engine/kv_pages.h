// Paged KV cache bookkeeping with prefix sharing (host only: the backend owns the K/V memory,
// this class only decides which page holds which token position of which sequence).
//
// Memory layout the backend implements: every layer's K and V are a pool of `num_pages` pages
// of `page_size` token slots. Position p of a sequence lives in slot p % page_size of page
// page_table[p / page_size]. A page may appear in several page tables (shared prefix); it is
// then read-only for all of them until copy-on-write gives the writer its own copy.
//
// Page states (every page is in exactly one):
//   free   - on free_ (a stack); content meaningless.
//   used   - refcount > 0: referenced by that many page tables ("shared" when > 1).
//   cached - refcount == 0 but published in the prefix index with verified content; kept on
//            lru_ and reused (evicted, least recently used first) only when free_ is empty.
//
// Prefix index: a full page (block) b of a sequence is published under the chained hash
// h_b = hash(h_{b-1}, tokens of block b) (h_{-1} = 0). A lookup walks a new prompt block by
// block and only accepts a candidate whose stored tokens equal the prompt's block and whose
// parent is exactly the page matched for block b-1 (page id plus generation, which changes
// whenever a page is reallocated), so a hash collision can never map wrong content. A block
// that fills up while an identical one is already published (two requests prefilling the same
// prompt together) is swapped for the published page, and its own page is freed.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace gyre {

using PageId = int32_t;
using SeqId = int64_t;

// The backend must copy the first num_tokens slots of page src into page dst (all layers, K and
// V) before any write of the step that produced this copy; copies run in the order given.
struct PageCopy {
  PageId src = -1;
  PageId dst = -1;
  int num_tokens = 0;
};

struct KvPageStats {
  int total_pages = 0;
  int used_pages = 0;    // refcount > 0
  int shared_pages = 0;  // refcount > 1 (subset of used)
  int cached_pages = 0;  // refcount == 0, kept for prefix reuse, evictable
  int free_pages = 0;
  int64_t prefix_query_tokens = 0;  // full-block prompt tokens looked up in match_prefix
  int64_t prefix_hit_tokens = 0;    // of those, found in the cache
  int64_t evictions = 0;
  int64_t cow_copies = 0;
  int64_t deduplicated_pages = 0;  // full pages replaced by an identical published one
  double hit_rate() const {
    return prefix_query_tokens ? double(prefix_hit_tokens) / double(prefix_query_tokens) : 0.0;
  }
};

class KvPageManager {
 public:
  // Chained block hash: parent hash and the block's token ids. Injectable so tests can force
  // collisions; nullptr selects the default 64-bit mix.
  using HashFn = uint64_t (*)(uint64_t parent, const int32_t* tokens, int n);

  KvPageManager(int num_pages, int page_size, HashFn hash = nullptr);

  int num_pages() const { return int(pages_.size()); }
  int page_size() const { return page_size_; }
  // Pages an allocation may take now: free plus evictable cached pages.
  int available_pages() const { return int(free_.size() + lru_.size()); }

  // Registers an empty sequence (no pages, length 0).
  void create(SeqId seq);
  // Registers child sharing all of parent's written pages (refcounts rise, nothing is copied);
  // the first write into the shared partial last page copies it (copy-on-write).
  void fork(SeqId parent, SeqId child);
  // For an empty sequence: maps the longest cached chain of full blocks that prefixes `tokens`
  // into its page table and sets its length to the tokens covered (returned). At least one
  // token is always left uncovered, because the caller must run it to get logits.
  int match_prefix(SeqId seq, std::span<const int32_t> tokens);
  // Pages reserve(seq, n) would take from available_pages().
  int pages_needed(SeqId seq, int n) const;
  // Makes positions [length, length + n) writable: allocates pages and copies a shared partial
  // last page. Returns false, changing nothing, if not enough pages are available.
  bool reserve(SeqId seq, int n);
  // Records that the KV of `tokens` was written at positions [length, length + size); needs a
  // prior reserve. Pages that become full are published to the prefix index, or, if an
  // identical block is already published, replaced by that page (so page tables can change
  // here: read them afresh for every step).
  void append(SeqId seq, std::span<const int32_t> tokens);
  // Drops the sequence: its pages lose a reference; published ones become cached, others free.
  void release(SeqId seq);
  // Copy-on-write copies made since the last call, for the backend to execute.
  std::vector<PageCopy> take_copies();

  bool contains(SeqId seq) const { return seqs_.count(seq) != 0; }
  int length(SeqId seq) const;
  const std::vector<PageId>& page_table(SeqId seq) const;
  std::vector<SeqId> sequences() const;

  // Introspection for tests and metrics.
  int refcount(PageId page) const { return pages_.at(page).refcount; }
  bool is_free(PageId page) const { return pages_.at(page).on_free_list; }
  bool is_cached(PageId page) const { return pages_.at(page).on_lru; }
  bool is_published(PageId page) const { return pages_.at(page).published; }
  KvPageStats stats() const;

 private:
  struct PageMeta {
    int refcount = 0;
    bool on_free_list = false;
    bool on_lru = false;
    bool published = false;
    uint64_t generation = 0;  // bumped on every allocation: a page id's identity
    uint64_t hash = 0;        // chained hash, valid when published
    PageId parent = -1;       // page of the previous block when published (-1: first block)
    uint64_t parent_generation = 0;
    std::list<PageId>::iterator lru_pos;
  };
  struct SeqPages {
    std::vector<PageId> pages;    // page table; may extend past length (reserved pages)
    std::vector<int32_t> tokens;  // token ids whose KV is written: size() == length
  };

  SeqPages& seq_at(SeqId seq);
  const SeqPages& seq_at(SeqId seq) const;
  PageId allocate();
  void add_ref(PageId page);
  void drop_ref(PageId page);
  void publish_block(SeqPages& s, int block);
  PageId find_cached(uint64_t hash, PageId parent, const int32_t* tokens) const;

  int page_size_;
  HashFn hash_;
  std::vector<PageMeta> pages_;
  std::vector<int32_t> page_tokens_;  // [num_pages][page_size] token ids of published pages
  std::vector<PageId> free_;
  std::list<PageId> lru_;                            // cached pages, front = least recently used
  std::unordered_multimap<uint64_t, PageId> index_;  // hash -> published pages (used or cached)
  std::unordered_map<SeqId, SeqPages> seqs_;
  std::vector<PageCopy> copies_;
  int64_t prefix_query_tokens_ = 0, prefix_hit_tokens_ = 0, evictions_ = 0, cow_copies_ = 0,
          deduplicated_ = 0;
};

}  // namespace gyre
