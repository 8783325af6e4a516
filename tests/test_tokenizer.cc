// Tokenizer from tokenizer.json: every golden case produced by Hugging Face's Rust tokenizers
// (fixtures/tokenizers/*/golden.json), the stories260K prompts encoded by llama2.c's run.c, and
// malformed files.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "test_tokenizer_util.h"
#include "tokenizer/text_util.h"

namespace gyre {
namespace {

using test::hf_tokenizer;
using test::ids_of;
using test::load_json;
using test::tokenizer_dir;

class TokenizerGolden : public ::testing::TestWithParam<std::string> {};

// golden.json notes: ids = encode(text) without BOS/EOS, special-token strings matched;
// decoded = decode(ids) keeping special tokens.
TEST_P(TokenizerGolden, CasesMatchHuggingFace) {
  const Tokenizer& tok = hf_tokenizer(GetParam());
  const auto golden = load_json(tokenizer_dir(GetParam()) + "/golden.json");
  ASSERT_FALSE(golden.at("add_special_tokens").get<bool>());
  int checked = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string text = c.at("text");
    const auto want = ids_of(c.at("ids"));
    EXPECT_EQ(tok.encode(text, false), want) << "text: " << text;
    const std::string decoded = tok.decode(want, false);
    EXPECT_EQ(decoded, c.at("decoded").get<std::string>()) << "text: " << text;
    EXPECT_EQ(decoded == text, c.at("roundtrip").get<bool>()) << "text: " << text;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(tok.id_to_token(want[i]), c.at("tokens")[i].get<std::string>());
    ++checked;
  }
  EXPECT_EQ(checked, 42);
}

// The rendered chat templates contain the BOS themselves; encode them without adding any.
// (The Mistral fixture has no chat template.)
TEST(TokenizerHf, ChatTemplateRenderingsMatch) {
  for (const char* name : {"llama2", "llama3"}) {
    const Tokenizer& tok = hf_tokenizer(name);
    const auto golden = load_json(tokenizer_dir(name) + "/golden.json");
    ASSERT_EQ(golden.at("chat_template_cases").size(), 3u);
    for (const auto& c : golden.at("chat_template_cases")) {
      const std::string rendered = c.at("rendered");
      EXPECT_EQ(tok.encode(rendered, false), ids_of(c.at("ids"))) << rendered;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerGolden,
                         ::testing::Values("llama2", "llama3", "mistral"));

TEST(TokenizerHf, AddSpecialFollowsConfigAndPostProcessor) {
  // Llama 2 / Mistral: add_bos_token true; Llama 3 (this early form): ByteLevel post-processor,
  // the chat template writes <|begin_of_text|> itself.
  for (const char* name : {"llama2", "mistral"}) {
    const Tokenizer& tok = hf_tokenizer(name);
    EXPECT_EQ(tok.bos_id(), 1);
    EXPECT_EQ(tok.eos_ids(), std::vector<int>{2});
    const auto plain = tok.encode("Hello, world!", false);
    auto with_bos = plain;
    with_bos.insert(with_bos.begin(), 1);
    EXPECT_EQ(tok.encode("Hello, world!", true), with_bos);
    EXPECT_TRUE(tok.is_special(1));
    EXPECT_FALSE(tok.is_special(1000));
  }
  const Tokenizer& l3 = hf_tokenizer("llama3");
  EXPECT_EQ(l3.encode("Hello, world!", true), l3.encode("Hello, world!", false));
  EXPECT_EQ(l3.bos_id(), 128000);
  EXPECT_EQ(l3.eos_ids(), std::vector<int>{128001});
  EXPECT_EQ(l3.vocab_size(), 128256);
  EXPECT_EQ(l3.token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(l3.token_to_id("no such token"), -1);
}

// stories260K golden.json: prompt_ids are run.c's encoding (BOS first); output_text equals
// HF decode(prompt_ids + generated_ids, skip_special_tokens=True).
TEST(TokenizerHf, Stories260KPromptsAndOutputs) {
  const Tokenizer& tok = hf_tokenizer("stories260K");
  const auto golden = load_json(tokenizer_dir("stories260K") + "/golden.json");
  int checked = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string prompt = c.at("prompt");
    const auto prompt_ids = ids_of(c.at("prompt_ids"));
    EXPECT_EQ(tok.encode(prompt, true), prompt_ids) << prompt;
    auto all = prompt_ids;
    for (int id : ids_of(c.at("generated_ids"))) all.push_back(id);
    EXPECT_EQ(tok.decode(all, true), c.at("output_text").get<std::string>()) << prompt;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

// decode(encode(s)) == s is its own oracle for byte-level BPE: every byte string is representable.
TEST(TokenizerHf, ByteLevelRoundTripsArbitraryText) {
  const Tokenizer& tok = hf_tokenizer("llama3");
  const std::vector<std::string> pieces = {
      "a",  " ",        "\n",           "\t",         "é",  "中", "👍",   "1",
      "'s", "\xC2\xA0", "\xE2\x80\x8B", "<|eot_id|>", "  ", "!?", "\r\n"};
  uint32_t state = 12345;
  for (int round = 0; round < 200; ++round) {
    std::string text;
    const int n = 1 + round % 17;
    for (int i = 0; i < n; ++i) {
      state = state * 1664525u + 1013904223u;
      text += pieces[(state >> 8) % pieces.size()];
    }
    EXPECT_EQ(tok.decode(tok.encode(text, false), false), text);
  }
}

// Invalid UTF-8 input is replaced by U+FFFD before tokenizing rather than crashing the regex.
TEST(TokenizerHf, InvalidUtf8InputIsReplaced) {
  for (const char* name : {"llama3", "llama2"}) {
    const Tokenizer& tok = hf_tokenizer(name);
    const std::string bad =
        "ab\xFF"
        "cd\xE4\xBD";
    EXPECT_EQ(tok.encode(bad, false), tok.encode("ab\xEF\xBF\xBD"
                                                 "cd\xEF\xBF\xBD",
                                                 false));
  }
}

TEST(TokenizerHf, LongTextEncodesQuickly) {
  // A whole paragraph is one BPE word for SentencePiece-style models: the merge loop must not
  // be quadratic. Oracle: the round trip.
  const std::string text =
      test::read_text(std::string(GYRE_FIXTURES) + "/text/tinystories-sample.txt");
  for (const char* name : {"llama2", "llama3"}) {
    const Tokenizer& tok = hf_tokenizer(name);
    const auto ids = tok.encode(text, false);
    EXPECT_GT(ids.size(), text.size() / 8);
    EXPECT_EQ(tok.decode(ids, false), text);
  }
}

// Long runs of one character class stress the regexes' backtracking and the merge queue.
TEST(TokenizerHf, LongUniformRunsRoundTrip) {
  const std::vector<std::string> texts = {
      std::string(200000, ' '), std::string(200000, 'a'), std::string(100000, '\n') + "x",
      std::string(50000, '1') + " \t\r\n" + std::string(50000, '!')};
  for (const char* name : {"llama3", "llama2"}) {
    const Tokenizer& tok = hf_tokenizer(name);
    for (const auto& text : texts) EXPECT_EQ(tok.decode(tok.encode(text, false), false), text);
  }
}

TEST(TokenizerHf, DecodeRejectsOutOfRangeIds) {
  const Tokenizer& tok = hf_tokenizer("stories260K");
  EXPECT_THROW(tok.decode({5, 512}, false), Error);
  EXPECT_THROW(tok.decode({-1}, false), Error);
  EXPECT_THROW(tok.id_to_token(99999), Error);
}

std::string tiny_json(const std::string& model_override) {
  return R"({"model": )" + model_override + "}";
}

TEST(TokenizerHf, MalformedFilesThrowError) {
  const std::string good_model =
      R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  EXPECT_NO_THROW(Tokenizer::from_hf(tiny_json(good_model), nullptr));
  const std::vector<std::string> bad = {
      "",
      "not json",
      "[1, 2, 3]",
      "{}",
      R"({"model": 5})",
      tiny_json(R"({"type": "WordPiece", "vocab": {"a": 0}})"),
      tiny_json(R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]})"),
      tiny_json(R"({"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]})"),
      tiny_json(R"({"type": "BPE", "vocab": {"a": "zero"}, "merges": []})"),
      tiny_json(R"({"type": "BPE", "vocab": {"a": -4}, "merges": []})"),
      tiny_json(R"({"type": "BPE", "vocab": {"a": 99999999999}, "merges": []})"),
      tiny_json(R"({"type": "BPE", "vocab": {"a": 0}, "merges": "a b"})"),
      tiny_json(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [7]})"),
      tiny_json(
          R"({"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}})"),
      tiny_json(
          R"({"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": {"type": "Lowercase"})"),
      tiny_json(R"({"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": {"type": "Nope"})"),
      tiny_json(
          R"({"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"content": "x"}])"),
      std::string(100000, '[') + std::string(100000, ']'),
  };
  for (const auto& text : bad)
    EXPECT_THROW(Tokenizer::from_hf(text, nullptr), Error) << text.substr(0, 120);
}

TEST(TokenizerHf, MissingOrBrokenFolderThrowsError) {
  EXPECT_THROW(Tokenizer::from_folder("/nonexistent/gyre/tokenizer"), Error);
  const auto dir = std::filesystem::temp_directory_path() / "gyre_tok_test_bad_folder";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << "{ \"model\": ";
  EXPECT_THROW(Tokenizer::from_folder(dir.string()), Error);
  std::filesystem::remove_all(dir);
}

// Expected strings: Python's bytes.decode("utf-8", "replace"), which like Rust's
// String::from_utf8_lossy replaces each maximal invalid subpart with one U+FFFD.
TEST(TokenizerText, LossyUtf8MatchesPython) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\x61\x62\xFF", "\x61\x62\xEF\xBF\xBD"},
      {"\xF0\x9F\x91", "\xEF\xBF\xBD"},
      {"\xF0\x9F\x91\x61", "\xEF\xBF\xBD\x61"},
      {"\xE0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"\xC3", "\xEF\xBF\xBD"},
      {"\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"\xE4\xBD\xA0\xE5", "\xE4\xBD\xA0\xEF\xBF\xBD"},
      {"\x6F\x6B\xC3\xA9", "\x6F\x6B\xC3\xA9"},
  };
  for (const auto& [bytes, want] : cases) EXPECT_EQ(tok::utf8_lossy(bytes), want);
}

// The fuzzing seeds are small valid files; they must keep loading as the parser evolves.
TEST(TokenizerHf, FuzzSeedsLoad) {
  int loaded = 0;
  const auto dir = std::filesystem::path(GYRE_SOURCE_DIR) / "fuzz/seeds/fuzz_tokenizer_json";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_NO_THROW(Tokenizer::from_hf(test::read_text(entry.path().string()), nullptr))
        << entry.path();
    ++loaded;
  }
  EXPECT_GE(loaded, 2);
}

}  // namespace
}  // namespace gyre
