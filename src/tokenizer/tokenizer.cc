#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace gyre {
namespace tok {

namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// single_word tokens must not touch letters, digits or '_' (non-ASCII counts as a letter).
bool is_word_byte(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x80 || (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') ||
         u == '_';
}

// Chained Replace steps could grow text exponentially; real ones at most triple it.
void check_growth(size_t before, size_t after) {
  GYRE_CHECK(after <= 16 * before + 4096, "tokenizer: normalizer or decoder grows the text from ",
             before, " to ", after, " bytes");
}

uint64_t pair_key(int left, int right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// A doubly linked list of symbols over one word; merged-away symbols are marked dead.
struct Symbol {
  int id;        // kRank: token id; kScore: unused
  size_t start;  // byte span in the word
  size_t len;
  int prev, next;
  bool dead = false;
};

}  // namespace

BpeTokenizer::BpeTokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {
  for (const auto& p : spec_.split_patterns)
    splitters_.push_back(std::make_unique<RegexSplitter>(p));
  byte_token_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto it = spec_.token_to_id.find(byte_token_name(static_cast<uint8_t>(b)));
    if (it != spec_.token_to_id.end()) byte_token_ids_[b] = it->second;
  }
  spec_.special.resize(spec_.id_to_token.size(), false);
  added_by_first_byte_.resize(256);
  std::vector<int> order(spec_.added.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return spec_.added[a].content.size() > spec_.added[b].content.size();
  });
  for (int i : order) {
    const auto& content = spec_.added[i].content;
    if (!content.empty()) added_by_first_byte_[static_cast<uint8_t>(content[0])].push_back(i);
  }
}

bool BpeTokenizer::is_special(int id) const {
  return id >= 0 && static_cast<size_t>(id) < spec_.special.size() && spec_.special[id];
}

std::string BpeTokenizer::id_to_token(int id) const {
  GYRE_CHECK(id >= 0 && id < vocab_size(), "tokenizer: token id ", id,
             " is out of range (vocab size ", vocab_size(), ")");
  return spec_.id_to_token[id];
}

int BpeTokenizer::token_to_id(std::string_view token) const {
  auto it = spec_.token_to_id.find(std::string(token));
  return it == spec_.token_to_id.end() ? -1 : it->second;
}

// Longest added token starting at `pos` that may match there; returns its index or -1.
size_t BpeTokenizer::match_added(std::string_view text, size_t pos, size_t& match_len) const {
  for (int i : added_by_first_byte_[static_cast<uint8_t>(text[pos])]) {
    const AddedToken& t = spec_.added[i];
    if (text.compare(pos, t.content.size(), t.content) != 0) continue;
    const size_t end = pos + t.content.size();
    if (t.single_word && ((pos > 0 && is_word_byte(text[pos - 1])) ||
                          (end < text.size() && is_word_byte(text[end]))))
      continue;
    match_len = t.content.size();
    return static_cast<size_t>(i);
  }
  return static_cast<size_t>(-1);
}

std::vector<int> BpeTokenizer::encode(std::string_view raw, bool add_special) const {
  // Hostile input may not be UTF-8; the regexes and the model need valid text.
  std::string lossy;
  std::string_view text = raw;
  if (!utf8_is_valid(raw)) {
    lossy = utf8_lossy(raw);
    text = lossy;
  }
  std::vector<int> out;
  if (add_special) out = spec_.prefix_ids;
  size_t segment_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 0;
    const size_t which = match_added(text, pos, len);
    if (which == static_cast<size_t>(-1)) {
      ++pos;
      continue;
    }
    const AddedToken& t = spec_.added[which];
    size_t begin = pos, end = pos + len;
    if (t.lstrip)
      while (begin > segment_start && is_ascii_space(text[begin - 1])) --begin;
    if (t.rstrip)
      while (end < text.size() && is_ascii_space(text[end])) ++end;
    encode_segment(text.substr(segment_start, begin - segment_start), segment_start == 0, out);
    out.push_back(t.id);
    segment_start = pos = end;
  }
  encode_segment(text.substr(segment_start), segment_start == 0, out);
  if (add_special) out.insert(out.end(), spec_.suffix_ids.begin(), spec_.suffix_ids.end());
  return out;
}

void BpeTokenizer::encode_segment(std::string_view segment, bool first_segment,
                                  std::vector<int>& out) const {
  if (segment.empty()) return;
  std::string norm(segment);
  for (const auto& step : spec_.normalizer) {
    if (step.prepend)
      norm = step.to + norm;
    else
      replace_all(norm, step.from, step.to);
    check_growth(segment.size(), norm.size());
  }
  if (spec_.byte_level_prefix_space && norm[0] != ' ') norm = ' ' + norm;
  std::vector<std::string_view> pieces;
  if (spec_.metaspace) {
    replace_all(norm, " ", spec_.metaspace_char);
    const bool prepend = spec_.metaspace_prepend == PrependScheme::kAlways ||
                         (spec_.metaspace_prepend == PrependScheme::kFirst && first_segment);
    if (prepend && norm.compare(0, spec_.metaspace_char.size(), spec_.metaspace_char) != 0)
      norm = spec_.metaspace_char + norm;
  }
  const std::string_view whole = norm;
  if (spec_.metaspace && spec_.metaspace_split) {
    // Each piece starts at a replacement character (it attaches to the word after it).
    size_t start = 0;
    for (size_t p = whole.find(spec_.metaspace_char, 1); p != std::string::npos;
         p = whole.find(spec_.metaspace_char, p + 1)) {
      pieces.push_back(whole.substr(start, p - start));
      start = p;
    }
    pieces.push_back(whole.substr(start));
  } else {
    pieces.push_back(whole);
  }
  for (const auto& splitter : splitters_) {
    std::vector<std::string_view> finer;
    for (auto piece : pieces) splitter->split(piece, finer);
    pieces.swap(finer);
  }
  for (auto piece : pieces) {
    if (piece.empty()) continue;
    if (spec_.byte_level)
      encode_word(byte_map_.encode(piece), out);
    else
      encode_word(piece, out);
  }
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int>& out) const {
  if (spec_.merge_order == MergeOrder::kScore) return merge_by_score(word, out);
  if (spec_.ignore_merges) {
    auto it = spec_.token_to_id.find(std::string(word));
    if (it != spec_.token_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  merge_by_rank(word, out);
}

void BpeTokenizer::push_fallback(std::string_view piece, std::vector<int>& out) const {
  if (spec_.byte_fallback && std::all_of(piece.begin(), piece.end(), [&](char c) {
        return byte_token_ids_[static_cast<uint8_t>(c)] >= 0;
      })) {
    for (char c : piece) out.push_back(byte_token_ids_[static_cast<uint8_t>(c)]);
    return;
  }
  if (spec_.unk_id < 0) return;  // no way to represent it: dropped, as HF's BPE does
  if (spec_.fuse_unk && !out.empty() && out.back() == spec_.unk_id) return;
  out.push_back(spec_.unk_id);
}

// HF BPE: repeatedly apply the lowest-ranked merge present (leftmost on ties).
void BpeTokenizer::merge_by_rank(std::string_view word, std::vector<int>& out) const {
  std::vector<int> initial;
  for (auto ch : utf8_chars(word)) {
    auto it = spec_.token_to_id.find(std::string(ch));
    if (it != spec_.token_to_id.end()) {
      initial.push_back(it->second);
    } else {
      push_fallback(ch, initial);
    }
  }
  std::vector<Symbol> syms(initial.size());
  for (size_t i = 0; i < syms.size(); ++i)
    syms[i] = {initial[i], i, 1, static_cast<int>(i) - 1,
               i + 1 < syms.size() ? static_cast<int>(i) + 1 : -1};
  struct Candidate {
    int rank, pos, left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto consider = [&](int pos) {
    if (pos < 0 || syms[pos].next < 0) return;
    const int left = syms[pos].id, right = syms[syms[pos].next].id;
    auto it = spec_.merges.find(pair_key(left, right));
    if (it != spec_.merges.end()) queue.push({it->second.rank, pos, left, right});
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) consider(static_cast<int>(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = syms[c.pos];
    // Stale entries: the pair changed since it was queued.
    if (left.dead || left.id != c.left || left.next < 0) continue;
    Symbol& right = syms[left.next];
    if (right.id != c.right) continue;
    left.id = spec_.merges.at(pair_key(c.left, c.right)).result_id;
    right.dead = true;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (const Symbol& s : syms)
    if (!s.dead) out.push_back(s.id);
}

// SentencePiece as GGUF carries it: repeatedly merge the adjacent pair whose concatenation is a
// vocabulary piece with the highest score (leftmost on ties); leftover pieces fall back to bytes.
void BpeTokenizer::merge_by_score(std::string_view word, std::vector<int>& out) const {
  std::vector<Symbol> syms;
  size_t offset = 0;
  for (auto ch : utf8_chars(word)) {
    const int i = static_cast<int>(syms.size());
    syms.push_back({-1, offset, ch.size(), i - 1, -1});
    if (i > 0) syms[i - 1].next = i;
    offset += ch.size();
  }
  struct Candidate {
    float score;
    int pos;
    size_t left_len, right_len;
    bool operator<(const Candidate& o) const {
      return score != o.score ? score < o.score : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  const auto lookup = [&](size_t start, size_t len) -> int {
    auto it = spec_.token_to_id.find(std::string(word.substr(start, len)));
    if (it == spec_.token_to_id.end() || is_special(it->second)) return -1;
    return it->second;
  };
  const auto consider = [&](int pos) {
    if (pos < 0 || syms[pos].next < 0) return;
    const Symbol& l = syms[pos];
    const Symbol& r = syms[l.next];
    const int id = lookup(l.start, l.len + r.len);
    if (id < 0) return;
    const float score = static_cast<size_t>(id) < spec_.scores.size() ? spec_.scores[id] : 0.0f;
    queue.push({score, pos, l.len, r.len});
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) consider(static_cast<int>(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = syms[c.pos];
    if (left.dead || left.len != c.left_len || left.next < 0) continue;
    Symbol& right = syms[left.next];
    if (right.len != c.right_len) continue;
    left.len += right.len;
    right.dead = true;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (const Symbol& s : syms) {
    if (s.dead) continue;
    const int id = lookup(s.start, s.len);
    if (id >= 0)
      out.push_back(id);
    else
      push_fallback(word.substr(s.start, s.len), out);
  }
}

std::string BpeTokenizer::decode(const std::vector<int>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int id : ids) {
    GYRE_CHECK(id >= 0 && id < vocab_size(), "tokenizer: cannot decode token id ", id,
               " (vocab size ", vocab_size(), ")");
    if (skip_special && spec_.special[id]) continue;
    tokens.push_back(spec_.id_to_token[id]);
  }
  if (spec_.decoder.empty()) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  const auto total_size = [&] {
    size_t n = 0;
    for (const auto& t : tokens) n += t.size();
    return n;
  };
  const size_t original_size = total_size();
  for (const DecoderStep& step : spec_.decoder) {
    switch (step.kind) {
      case DecodeStep::kByteLevel: {
        std::string bytes;
        for (const auto& t : tokens) {
          std::string mapped;
          // A token outside the byte map (an added token with unusual characters) stays as is.
          bytes += byte_map_.decode(t, mapped) ? mapped : t;
        }
        tokens.assign(1, utf8_lossy(bytes));
        break;
      }
      case DecodeStep::kReplace:
        for (auto& t : tokens) replace_all(t, step.from, step.to);
        break;
      case DecodeStep::kByteFallback: {
        std::vector<std::string> merged;
        std::string pending;
        size_t pending_count = 0;
        const auto flush = [&] {
          if (pending_count == 0) return;
          if (utf8_is_valid(pending)) {
            merged.push_back(pending);
          } else {
            // HF: an invalid run becomes one U+FFFD per byte token.
            for (size_t i = 0; i < pending_count; ++i) merged.emplace_back("\xEF\xBF\xBD");
          }
          pending.clear();
          pending_count = 0;
        };
        for (auto& t : tokens) {
          const int b = parse_byte_token(t);
          if (b >= 0) {
            pending += static_cast<char>(b);
            ++pending_count;
          } else {
            flush();
            merged.push_back(std::move(t));
          }
        }
        flush();
        tokens.swap(merged);
        break;
      }
      case DecodeStep::kFuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecodeStep::kStrip:
        for (auto& t : tokens) {
          const auto& c = step.strip_char;
          for (int i = 0; i < step.strip_start && !c.empty() && t.compare(0, c.size(), c) == 0; ++i)
            t.erase(0, c.size());
          for (int i = 0; i < step.strip_stop && !c.empty() && t.size() >= c.size() &&
                          t.compare(t.size() - c.size(), c.size(), c) == 0;
               ++i)
            t.erase(t.size() - c.size());
        }
        break;
      case DecodeStep::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          replace_all(tokens[i], step.from, " ");
          if (i == 0 && step.metaspace_strip_first && !tokens[i].empty() && tokens[i][0] == ' ')
            tokens[i].erase(0, 1);
        }
        break;
    }
    check_growth(original_size, total_size());
  }
  std::string text;
  for (const auto& t : tokens) text += t;
  return text;
}

}  // namespace tok

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(tok), skip_special_(skip_special) {}

// Decodes all ids each time (decoders such as Strip depend on the start of the text) and holds
// back a tail that later tokens may still change: an incomplete UTF-8 sequence, or U+FFFD
// characters made from a byte run that has not finished yet.
// HF's ByteFallback turns a whole run of byte tokens into U+FFFDs when any part of it is invalid,
// so a complete character followed by a dangling byte can be rewritten after it was emitted; then
// this stream keeps what it already emitted and resumes at the next character boundary.
std::string StreamDecoder::push(int id) {
  ids_.push_back(id);
  const std::string text = tok_.decode(ids_, skip_special_);
  size_t ready = text.size() - tok::utf8_incomplete_tail(text);
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  while (ready >= kReplacement.size() &&
         std::string_view(text).substr(ready - kReplacement.size(), kReplacement.size()) ==
             kReplacement)
    ready -= kReplacement.size();
  size_t start = emitted_;
  while (start < ready && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
  if (ready <= start) return {};
  emitted_ = ready;
  std::string out = text.substr(start, ready - start);
  if (emitted_ == text.size()) trim();
  return out;
}

void StreamDecoder::trim() {
  constexpr size_t kKeep = 4, kTrimAt = 64;
  if (ids_.size() < kTrimAt) return;
  for (size_t cut = ids_.size() - kKeep; cut + 16 > ids_.size(); --cut) {
    const int id = ids_[cut];
    if (tok_.id_to_token(id).rfind("<0x", 0) == 0) continue;  // a byte-fallback token
    const std::string piece = tok_.decode({id}, skip_special_);
    if (piece.empty() || (static_cast<uint8_t>(piece[0]) & 0xC0) == 0x80 ||
        tok::utf8_incomplete_tail(piece) != 0 || piece.find("\xEF\xBF\xBD") != std::string::npos)
      continue;
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(cut));
    // Decoders may treat the start of the text specially (Strip): measure the kept ids alone.
    emitted_ = tok_.decode(ids_, skip_special_).size();
    return;
  }
}

std::string StreamDecoder::flush() {
  const std::string text = tok_.decode(ids_, skip_special_);
  size_t start = emitted_;
  while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
  emitted_ = std::max(emitted_, text.size());
  return start < text.size() ? tok::utf8_lossy(std::string_view(text).substr(start))
                             : std::string();
}

std::vector<int> end_of_turn_ids(const Tokenizer& tok) {
  std::vector<int> ids;
  for (const char* t : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "</s>"}) {
    const int id = tok.token_to_id(t);
    if (id >= 0 && tok.is_special(id)) ids.push_back(id);
  }
  return ids;
}

}  // namespace gyre
