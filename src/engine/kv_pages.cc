#include "engine/kv_pages.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace gyre {
namespace {

// splitmix64 finalizer: cheap and well mixed; collisions are tolerated anyway (content is
// verified on every hit).
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t default_block_hash(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = mix64(parent ^ 0x5bd1e995ull);
  for (int i = 0; i < n; ++i) h = mix64(h ^ uint32_t(tokens[i]));
  return h;
}

}  // namespace

KvPageManager::KvPageManager(int num_pages, int page_size, HashFn hash)
    : page_size_(page_size), hash_(hash ? hash : default_block_hash) {
  GYRE_CHECK(num_pages > 0, "KV cache needs at least one page, got ", num_pages);
  GYRE_CHECK(page_size > 0, "KV page size must be positive, got ", page_size);
  pages_.resize(num_pages);
  page_tokens_.assign(size_t(num_pages) * size_t(page_size), -1);
  // Stack order so that page 0 is handed out first (easier to read in traces).
  for (PageId p = num_pages - 1; p >= 0; --p) {
    free_.push_back(p);
    pages_[p].on_free_list = true;
  }
}

KvPageManager::SeqPages& KvPageManager::seq_at(SeqId seq) {
  auto it = seqs_.find(seq);
  GYRE_CHECK(it != seqs_.end(), "KV cache: unknown sequence ", seq);
  return it->second;
}

const KvPageManager::SeqPages& KvPageManager::seq_at(SeqId seq) const {
  auto it = seqs_.find(seq);
  GYRE_CHECK(it != seqs_.end(), "KV cache: unknown sequence ", seq);
  return it->second;
}

int KvPageManager::length(SeqId seq) const {
  return int(seq_at(seq).tokens.size());
}

const std::vector<PageId>& KvPageManager::page_table(SeqId seq) const {
  return seq_at(seq).pages;
}

std::vector<SeqId> KvPageManager::sequences() const {
  std::vector<SeqId> ids;
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

PageId KvPageManager::allocate() {
  PageId page;
  if (!free_.empty()) {
    page = free_.back();
    free_.pop_back();
    pages_[page].on_free_list = false;
  } else if (!lru_.empty()) {
    // Evict the least recently used cached page: unpublish it so no lookup can find it.
    page = lru_.front();
    lru_.pop_front();
    PageMeta& m = pages_[page];
    m.on_lru = false;
    auto range = index_.equal_range(m.hash);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == page) {
        index_.erase(it);
        break;
      }
    }
    m.published = false;
    ++evictions_;
  } else {
    return -1;
  }
  PageMeta& m = pages_[page];
  m.generation++;  // children published under the old identity can no longer match
  m.refcount = 1;
  m.parent = -1;
  return page;
}

void KvPageManager::add_ref(PageId page) {
  PageMeta& m = pages_[page];
  if (m.on_lru) {
    lru_.erase(m.lru_pos);
    m.on_lru = false;
  }
  m.refcount++;
}

void KvPageManager::drop_ref(PageId page) {
  PageMeta& m = pages_[page];
  if (--m.refcount > 0) return;
  if (m.published) {
    m.lru_pos = lru_.insert(lru_.end(), page);
    m.on_lru = true;
  } else {
    free_.push_back(page);
    m.on_free_list = true;
  }
}

void KvPageManager::create(SeqId seq) {
  GYRE_CHECK(!seqs_.count(seq), "KV cache: sequence ", seq, " already exists");
  seqs_[seq] = SeqPages{};
}

void KvPageManager::fork(SeqId parent, SeqId child) {
  const SeqPages& p = seq_at(parent);
  GYRE_CHECK(!seqs_.count(child), "KV cache: sequence ", child, " already exists");
  SeqPages c;
  c.tokens = p.tokens;
  // Share only pages holding written tokens; reserved-but-empty pages stay the parent's.
  size_t written_pages = (p.tokens.size() + page_size_ - 1) / page_size_;
  c.pages.assign(p.pages.begin(), p.pages.begin() + written_pages);
  for (PageId page : c.pages) add_ref(page);
  seqs_[child] = std::move(c);
}

PageId KvPageManager::find_cached(uint64_t hash, PageId parent, const int32_t* tokens) const {
  auto range = index_.equal_range(hash);
  for (auto it = range.first; it != range.second; ++it) {
    const PageMeta& m = pages_[it->second];
    if (m.parent != parent) continue;
    if (parent >= 0 && m.parent_generation != pages_[parent].generation) continue;
    const int32_t* stored = &page_tokens_[size_t(it->second) * page_size_];
    if (std::memcmp(stored, tokens, sizeof(int32_t) * page_size_) == 0) return it->second;
  }
  return -1;
}

int KvPageManager::match_prefix(SeqId seq, std::span<const int32_t> tokens) {
  SeqPages& s = seq_at(seq);
  GYRE_CHECK(s.pages.empty() && s.tokens.empty(), "KV cache: match_prefix on non-empty sequence ",
             seq);
  if (tokens.empty()) return 0;
  const int max_blocks = int((tokens.size() - 1) / page_size_);
  prefix_query_tokens_ += int64_t(max_blocks) * page_size_;
  uint64_t hash = 0;
  PageId parent = -1;
  for (int b = 0; b < max_blocks; ++b) {
    const int32_t* block = tokens.data() + size_t(b) * page_size_;
    hash = hash_(hash, block, page_size_);
    PageId page = find_cached(hash, parent, block);
    if (page < 0) break;
    add_ref(page);
    s.pages.push_back(page);
    s.tokens.insert(s.tokens.end(), block, block + page_size_);
    parent = page;
  }
  prefix_hit_tokens_ += int64_t(s.tokens.size());
  return int(s.tokens.size());
}

int KvPageManager::pages_needed(SeqId seq, int n) const {
  GYRE_CHECK(n >= 0, "KV cache: negative token count ", n);
  const SeqPages& s = seq_at(seq);
  const size_t len = s.tokens.size();
  if (n == 0) return 0;
  const int total = int((len + n + page_size_ - 1) / page_size_);
  int need = std::max(0, total - int(s.pages.size()));
  // Writing into a shared, partially written page needs a private copy first.
  if (len % page_size_ != 0 && pages_[s.pages[len / page_size_]].refcount > 1) ++need;
  return need;
}

bool KvPageManager::reserve(SeqId seq, int n) {
  const int need = pages_needed(seq, n);
  if (need > available_pages()) return false;
  if (n == 0) return true;
  SeqPages& s = seq_at(seq);
  const size_t len = s.tokens.size();
  if (len % page_size_ != 0) {
    PageId& last = s.pages[len / page_size_];
    if (pages_[last].refcount > 1) {
      PageId copy = allocate();
      copies_.push_back({last, copy, int(len % page_size_)});
      ++cow_copies_;
      drop_ref(last);  // still > 0: others keep it
      last = copy;
    }
  }
  const size_t total = (len + n + page_size_ - 1) / page_size_;
  while (s.pages.size() < total) s.pages.push_back(allocate());
  return true;
}

void KvPageManager::append(SeqId seq, std::span<const int32_t> tokens) {
  SeqPages& s = seq_at(seq);
  GYRE_CHECK(s.tokens.size() + tokens.size() <= s.pages.size() * size_t(page_size_),
             "KV cache: append of ", tokens.size(), " tokens to sequence ", seq,
             " exceeds its reservation");
  for (int32_t t : tokens) {
    const size_t pos = s.tokens.size();
    GYRE_CHECK(pages_[s.pages[pos / page_size_]].refcount == 1,
               "KV cache: write into a shared page of sequence ", seq, " without reserve");
    s.tokens.push_back(t);
    if (s.tokens.size() % page_size_ == 0) publish_block(s, int(pos / page_size_));
  }
}

void KvPageManager::publish_block(SeqPages& s, int block) {
  const PageId page = s.pages[block];
  PageMeta& m = pages_[page];
  if (m.published) return;
  // A block is reachable only through its parent chain, so publish it only if the parent is.
  const PageId parent = block > 0 ? s.pages[block - 1] : -1;
  if (parent >= 0 && !pages_[parent].published) return;
  const int32_t* tokens = s.tokens.data() + size_t(block) * page_size_;
  const uint64_t hash = hash_(parent >= 0 ? pages_[parent].hash : 0, tokens, page_size_);
  // An identical block (same tokens after the same prefix, so the same KV) computed
  // concurrently by another sequence is already published: share that page and free this one,
  // so later blocks of this sequence chain onto the canonical page.
  if (const PageId twin = find_cached(hash, parent, tokens); twin >= 0) {
    add_ref(twin);
    s.pages[block] = twin;
    drop_ref(page);
    ++deduplicated_;
    return;
  }
  m.published = true;
  m.hash = hash;
  m.parent = parent;
  m.parent_generation = parent >= 0 ? pages_[parent].generation : 0;
  std::copy(tokens, tokens + page_size_, page_tokens_.begin() + size_t(page) * page_size_);
  index_.emplace(hash, page);
}

void KvPageManager::release(SeqId seq) {
  auto it = seqs_.find(seq);
  GYRE_CHECK(it != seqs_.end(), "KV cache: unknown sequence ", seq);
  // Tail blocks first, so they sit nearer the LRU front than their prefixes: a prefix is
  // evicted only after the blocks that depend on it.
  const auto& pages = it->second.pages;
  for (auto p = pages.rbegin(); p != pages.rend(); ++p) drop_ref(*p);
  seqs_.erase(it);
}

std::vector<PageCopy> KvPageManager::take_copies() {
  std::vector<PageCopy> out;
  out.swap(copies_);
  return out;
}

KvPageStats KvPageManager::stats() const {
  KvPageStats st;
  st.total_pages = num_pages();
  for (const PageMeta& m : pages_) {
    if (m.refcount > 0) st.used_pages++;
    if (m.refcount > 1) st.shared_pages++;
  }
  st.cached_pages = int(lru_.size());
  st.free_pages = int(free_.size());
  st.prefix_query_tokens = prefix_query_tokens_;
  st.prefix_hit_tokens = prefix_hit_tokens_;
  st.evictions = evictions_;
  st.cow_copies = cow_copies_;
  st.deduplicated_pages = deduplicated_;
  return st;
}

}  // namespace gyre
