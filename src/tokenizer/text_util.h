// UTF-8 helpers and the GPT-2 byte <-> printable-unicode table shared by the tokenizer parts.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gyre::tok {

// Length of the UTF-8 sequence starting at s[i] if it is complete and valid, else 0.
size_t utf8_valid_len(std::string_view s, size_t i);
// Invalid bytes become U+FFFD (one per maximal invalid subpart, as Rust's from_utf8_lossy does).
std::string utf8_lossy(std::string_view bytes);
bool utf8_is_valid(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);
// Splits valid UTF-8 into its characters (byte lengths).
std::vector<std::string_view> utf8_chars(std::string_view s);
// Bytes at the end of s that begin a UTF-8 sequence not yet complete (0..3).
size_t utf8_incomplete_tail(std::string_view s);

// GPT-2's reversible map: every byte value gets a printable code point so BPE never sees
// whitespace or control bytes.
struct ByteLevelMap {
  ByteLevelMap();
  std::array<std::string, 256> byte_to_utf8;
  // Code point (only < 512 are used) -> byte, or -1.
  std::array<int, 512> cp_to_byte;
  std::string encode(std::string_view bytes) const;
  // Maps each character back to its byte; false if some character is not in the table.
  bool decode(std::string_view text, std::string& out) const;
};

// "<0xAB>" -> 0xAB, else -1.
int parse_byte_token(std::string_view token);
std::string byte_token_name(uint8_t b);
void replace_all(std::string& s, std::string_view from, std::string_view to);

}  // namespace gyre::tok
