#include "tokenizer/text_util.h"

#include <cstdio>

namespace gyre::tok {

// Allowed range of the second byte after lead byte b0 (tighter for overlongs, surrogates and
// code points above U+10FFFF).
static void second_byte_range(uint8_t b0, uint8_t& lo, uint8_t& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (b0 == 0xE0) lo = 0xA0;
  if (b0 == 0xED) hi = 0x9F;
  if (b0 == 0xF0) lo = 0x90;
  if (b0 == 0xF4) hi = 0x8F;
}

static size_t sequence_len(uint8_t b0) {
  if (b0 >= 0xC2 && b0 <= 0xDF) return 2;
  if (b0 >= 0xE0 && b0 <= 0xEF) return 3;
  if (b0 >= 0xF0 && b0 <= 0xF4) return 4;
  return 1;
}

size_t utf8_valid_len(std::string_view s, size_t i) {
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  const size_t len = sequence_len(b0);
  if (len == 1) return 0;  // stray continuation byte or invalid lead
  uint8_t lo, hi;
  second_byte_range(b0, lo, hi);
  if (i + 1 >= s.size()) return 0;
  const uint8_t b1 = static_cast<uint8_t>(s[i + 1]);
  if (b1 < lo || b1 > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if (i + k >= s.size() || (static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return 0;
  return len;
}

bool utf8_is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_valid_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t utf8_incomplete_tail(std::string_view s) {
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t start = s.size() - back;
    const uint8_t b0 = static_cast<uint8_t>(s[start]);
    if ((b0 & 0xC0) == 0x80) continue;  // continuation byte: the lead is further back
    if (sequence_len(b0) <= back) return 0;
    if (back >= 2) {
      uint8_t lo, hi;
      second_byte_range(b0, lo, hi);
      const uint8_t b1 = static_cast<uint8_t>(s[start + 1]);
      if (b1 < lo || b1 > hi) return 0;
    }
    return back;  // later bytes are continuation bytes, checked by the loop above
  }
  return 0;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_valid_len(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // One U+FFFD for the maximal prefix of a valid sequence (at least one byte).
    const uint8_t b0 = static_cast<uint8_t>(s[i]);
    const size_t want = sequence_len(b0);
    size_t skip = 1;
    while (skip < want && i + skip < s.size()) {
      const uint8_t b = static_cast<uint8_t>(s[i + skip]);
      uint8_t lo = 0x80, hi = 0xBF;
      if (skip == 1) second_byte_range(b0, lo, hi);
      if (b < lo || b > hi) break;
      ++skip;
    }
    out += "\xEF\xBF\xBD";
    i += skip;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> chars;
  chars.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_valid_len(s, i);
    if (n == 0) n = 1;  // callers pass valid text; stay safe anyway
    chars.push_back(s.substr(i, n));
    i += n;
  }
  return chars;
}

ByteLevelMap::ByteLevelMap() {
  cp_to_byte.fill(-1);
  // Printable Latin-1 bytes map to themselves; the rest are shifted to 256 + k in byte order.
  int shifted = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + shifted++;
    append_utf8(byte_to_utf8[b], cp);
    cp_to_byte[cp] = b;
  }
}

std::string ByteLevelMap::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

bool ByteLevelMap::decode(std::string_view text, std::string& out) const {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_valid_len(text, i);
    if (n == 0 || n > 2) return false;
    uint32_t cp = static_cast<uint8_t>(text[i]);
    if (n == 2) cp = ((cp & 0x1F) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3F);
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return false;
    out += static_cast<char>(cp_to_byte[cp]);
    i += n;
  }
  return true;
}

int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = t[i];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= c - '0';
    else if (c >= 'A' && c <= 'F')
      v |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      v |= c - 'a' + 10;
    else
      return -1;
  }
  return v;
}

std::string byte_token_name(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t last = 0;
  for (size_t pos; (pos = s.find(from, last)) != std::string::npos; last = pos + from.size()) {
    out.append(s, last, pos - last);
    out.append(to);
  }
  out.append(s, last);
  s = std::move(out);
}

}  // namespace gyre::tok
