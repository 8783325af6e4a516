// Tokenizer::from_gguf and StreamDecoder. GGUF vocabularies are built from the fixture
// tokenizer.json files the way a GGUF converter would write them, then checked against the same
// Hugging Face goldens as the tokenizer.json path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "gguf_vocab_util.h"
#include "test_tokenizer_util.h"

namespace gyre {
namespace {

using test::ids_of;
using test::load_json;
using test::tokenizer_dir;

using test::llama3_vocab;
using test::llama_vocab;
using test::vocab_from_json;

std::unique_ptr<Tokenizer> gguf_tokenizer(const std::string& name) {
  return Tokenizer::from_gguf(name == "llama3" ? llama3_vocab() : llama_vocab(name));
}

class TokenizerGguf : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerGguf, GoldenCasesMatchHuggingFace) {
  const auto tok = gguf_tokenizer(GetParam());
  const auto golden = load_json(tokenizer_dir(GetParam()) + "/golden.json");
  for (const auto& c : golden.at("cases")) {
    const std::string text = c.at("text");
    EXPECT_EQ(tok->encode(text, false), ids_of(c.at("ids"))) << "text: " << text;
    EXPECT_EQ(tok->decode(ids_of(c.at("ids")), false), c.at("decoded").get<std::string>());
  }
  if (golden.contains("chat_template_cases")) {
    for (const auto& c : golden.at("chat_template_cases"))
      EXPECT_EQ(tok->encode(c.at("rendered").get<std::string>(), false), ids_of(c.at("ids")));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerGguf, ::testing::Values("llama2", "llama3", "mistral"));

TEST(TokenizerGgufVocab, AddBosAndSpecialFlags) {
  GgufVocab v = llama3_vocab();
  v.add_bos = true;
  const auto tok = Tokenizer::from_gguf(v);
  const auto golden = load_json(tokenizer_dir("llama3") + "/golden.json");
  auto want = ids_of(golden.at("cases")[0].at("ids"));
  want.insert(want.begin(), 128000);
  EXPECT_EQ(tok->encode(golden.at("cases")[0].at("text").get<std::string>(), true), want);
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_ids(), std::vector<int>{128001});
  EXPECT_TRUE(tok->is_special(128009));
  EXPECT_FALSE(tok->is_special(9906));
  EXPECT_EQ(tok->decode({128000, 9906}, true), "Hello");
}

// run.c's own encoder merges by piece score, exactly what the GGUF llama kind does.
TEST(TokenizerGgufVocab, Stories260KMatchesRunC) {
  GgufVocab v = llama_vocab("stories260K");
  v.add_bos = true;
  const auto tok = Tokenizer::from_gguf(v);
  const auto golden = load_json(tokenizer_dir("stories260K") + "/golden.json");
  for (const auto& c : golden.at("cases")) {
    const auto prompt_ids = ids_of(c.at("prompt_ids"));
    EXPECT_EQ(tok->encode(c.at("prompt").get<std::string>(), true), prompt_ids);
    auto all = prompt_ids;
    for (int id : ids_of(c.at("generated_ids"))) all.push_back(id);
    EXPECT_EQ(tok->decode(all, true), c.at("output_text").get<std::string>());
  }
}

TEST(TokenizerGgufVocab, BadVocabThrowsError) {
  GgufVocab empty;
  empty.model = "llama";
  EXPECT_THROW(Tokenizer::from_gguf(empty), Error);
  GgufVocab v = llama_vocab("stories260K");
  v.model = "wordpiece";
  EXPECT_THROW(Tokenizer::from_gguf(v), Error);
  v = llama_vocab("stories260K");
  v.scores.pop_back();
  EXPECT_THROW(Tokenizer::from_gguf(v), Error);
  v = llama_vocab("stories260K");
  v.bos_id = 100000;
  EXPECT_THROW(Tokenizer::from_gguf(v), Error);
  v = llama_vocab("stories260K");
  v.token_types.resize(3);
  EXPECT_THROW(Tokenizer::from_gguf(v), Error);
  GgufVocab g;
  g.model = "gpt2";
  g.tokens = {"a", "b"};
  g.merges = {"a b"};  // "ab" is not in the vocabulary
  EXPECT_THROW(Tokenizer::from_gguf(g), Error);
  g.merges = {"ab"};
  EXPECT_THROW(Tokenizer::from_gguf(g), Error);
}

// --- StreamDecoder ---

// An independent UTF-8 validity check (RFC 3629 table) for the streamed pieces.
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    size_t n = b(i) < 0x80         ? 1
               : (b(i) >> 5) == 6  ? 2
               : (b(i) >> 4) == 14 ? 3
               : (b(i) >> 3) == 30 ? 4
                                   : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? b(i) : b(i) & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      if ((b(i + k) & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b(i + k) & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

std::string stream(const Tokenizer& tok, const std::vector<int>& ids, bool skip_special,
                   std::vector<std::string>* pieces = nullptr) {
  StreamDecoder dec(tok, skip_special);
  std::string all;
  for (int id : ids) {
    const std::string piece = dec.push(id);
    EXPECT_TRUE(valid_utf8(piece)) << "half a character emitted";
    if (pieces) pieces->push_back(piece);
    all += piece;
  }
  return all + dec.flush();
}

TEST_P(TokenizerGguf, StreamedGoldensEqualHuggingFaceDecode) {
  const Tokenizer& tok = test::hf_tokenizer(GetParam());
  const auto golden = load_json(tokenizer_dir(GetParam()) + "/golden.json");
  for (const auto& c : golden.at("cases"))
    EXPECT_EQ(stream(tok, ids_of(c.at("ids")), false), c.at("decoded").get<std::string>());
}

// Long streams (the decoder forgets old ids once they are out): every golden case of a
// tokenizer joined into one sequence of hundreds of ids streams to exactly decode(all ids).
TEST_P(TokenizerGguf, LongStreamEqualsWholeDecode) {
  const Tokenizer& tok = test::hf_tokenizer(GetParam());
  const auto golden = load_json(tokenizer_dir(GetParam()) + "/golden.json");
  std::vector<int> all;
  for (const auto& c : golden.at("cases"))
    for (int id : ids_of(c.at("ids"))) all.push_back(id);
  ASSERT_GT(all.size(), 300u);
  for (bool skip : {false, true}) EXPECT_EQ(stream(tok, all, skip), tok.decode(all, skip));
}

TEST(TokenizerStream, Stories260KOutputs) {
  const Tokenizer& tok = test::hf_tokenizer("stories260K");
  const auto golden = load_json(tokenizer_dir("stories260K") + "/golden.json");
  for (const auto& c : golden.at("cases")) {
    auto all = ids_of(c.at("prompt_ids"));
    for (int id : ids_of(c.at("generated_ids"))) all.push_back(id);
    EXPECT_EQ(stream(tok, all, true), c.at("output_text").get<std::string>());
  }
}

// Emoji and CJK split over byte-fallback tokens (Llama 2 ids from golden.json) and over
// byte-level tokens (Llama 3): nothing is emitted until the character is complete.
TEST(TokenizerStream, HoldsIncompleteCharacters) {
  const Tokenizer& l2 = test::hf_tokenizer("llama2");
  std::vector<std::string> pieces;
  // "👍": ▁ <0xF0> <0x9F> <0x91> <0x8D>
  EXPECT_EQ(stream(l2, {29871, 243, 162, 148, 144}, false, &pieces), "\xF0\x9F\x91\x8D");
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", "", "", "\xF0\x9F\x91\x8D"}));
  // "입" (U+C785) from <0xEC> <0x9E> <0x85>, then "니다".
  pieces.clear();
  const std::string ip = "\xEC\x9E\x85";
  const std::vector<int> korean = {l2.token_to_id("<0xEC>"), l2.token_to_id("<0x9E>"),
                                   l2.token_to_id("<0x85>"), l2.token_to_id("니")};
  EXPECT_EQ(stream(l2, korean, false, &pieces), ip + "니");
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", ip, "니"}));

  const Tokenizer& l3 = test::hf_tokenizer("llama3");
  const auto golden = load_json(tokenizer_dir("llama3") + "/golden.json");
  for (const auto& c : golden.at("cases")) {
    if (c.at("text") != "👍") continue;
    pieces.clear();
    EXPECT_EQ(stream(l3, ids_of(c.at("ids")), false, &pieces), "👍");
    ASSERT_EQ(pieces.size(), 3u);
    EXPECT_EQ(pieces[0] + pieces[1], "");
  }
}

TEST(TokenizerStream, FlushReplacesDanglingBytes) {
  const Tokenizer& l2 = test::hf_tokenizer("llama2");
  StreamDecoder dec(l2, false);
  EXPECT_EQ(dec.push(l2.token_to_id("▁Hello")), "Hello");
  EXPECT_EQ(dec.push(l2.token_to_id("<0xF0>")), "");
  EXPECT_EQ(dec.push(l2.token_to_id("<0x9F>")), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");  // HF ByteFallback: one U+FFFD per byte
}

}  // namespace
}  // namespace gyre
