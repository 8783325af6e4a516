// Hostile GGUF input: truncations, lying counts, lengths, offsets and sizes, bad versions and
// types. Every one must end in a gyre::Error, never a crash (run under ASan/UBSan too).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "model/gguf.h"
#include "model/gguf_model.h"

namespace gyre {
namespace {

const std::string kData = std::string(GYRE_SOURCE_DIR) + "/tests/data/";

std::vector<uint8_t> read_bytes(const std::string& path) {
  const std::string s = read_text_file(path);
  return {s.begin(), s.end()};
}

// Builds GGUF bytes field by field, so each test can lie in exactly one place.
struct Builder {
  std::vector<uint8_t> b;
  Builder& raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  Builder& u32(uint32_t v) { return raw(&v, 4); }
  Builder& u64(uint64_t v) { return raw(&v, 8); }
  Builder& str(const std::string& s) { return u64(s.size()).raw(s.data(), s.size()); }
  Builder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return raw("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
  }
  Builder& kv_u32(const std::string& k, uint32_t v) { return str(k).u32(4).u32(v); }
  // A tensor info; n_dims taken from ne.
  Builder& tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
                  uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Builder& pad_to(size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  Builder& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    GgufFile::parse(bytes.data(), bytes.size(), "t.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_rejected(const std::vector<uint8_t>& bytes, const std::string& fragment) {
  const std::string msg = parse_error(bytes);
  EXPECT_NE(msg, "") << "accepted; expected an error containing '" << fragment << "'";
  EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
}

TEST(GgufHostile, ValidMinimalFileParses) {
  Builder g;
  g.header(1, 1).kv_u32("general.alignment", 32).tensor("a", {8}, 0, 0).pad_to(32).zeros(32);
  const auto f = GgufFile::parse(g.b.data(), g.b.size(), "t.gguf");
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->tensors()[0].nbytes, 32u);
}

TEST(GgufHostile, BadMagicAndVersions) {
  expect_rejected({'G', 'G', 'U'}, "bad magic");
  expect_rejected(Builder().raw("GGML", 4).u32(3).u64(0).u64(0).b, "bad magic");
  expect_rejected(Builder().header(0, 0, 1).b, "version 1 is not supported");
  expect_rejected(Builder().header(0, 0, 4).b, "unsupported GGUF version 4");
  expect_rejected(Builder().header(0, 0, 0x03000000).b, "big-endian");
  expect_rejected(Builder().raw("GGUF", 4).u32(3).u64(0).b, "truncated");
}

TEST(GgufHostile, LyingCountsAndLengths) {
  expect_rejected(Builder().header(0, 1ull << 40).b, "metadata count");
  expect_rejected(Builder().header(1ull << 62, 0).b, "tensor count");
  expect_rejected(Builder().header(0, 1).u64(~0ull).raw("k", 1).zeros(16).b, "truncated");
  expect_rejected(Builder().header(0, 1).str("k").u32(8).u64(1ull << 63).zeros(16).b, "truncated");
  expect_rejected(Builder().header(0, 1).str("k").u32(13).u32(0).b, "invalid value type 13");
  expect_rejected(Builder().header(0, 1).str("k").u32(9).u32(5).u64(1ull << 61).zeros(16).b,
                  "more than the file holds");
  expect_rejected(
      Builder().header(0, 1).str("k").u32(9).u32(8).u64(3).str("a").u64(1ull << 40).zeros(16).b,
      "truncated");
  expect_rejected(Builder().header(0, 1).str("k").u32(9).u32(77).u64(1).zeros(8).b,
                  "invalid value type 77");
  Builder deep;
  deep.header(0, 1).str("k").u32(9);
  for (int i = 0; i < 100; ++i) deep.u32(9).u64(1);
  deep.u32(4).u64(1).u32(0);
  expect_rejected(deep.b, "too deeply");
  expect_rejected(Builder().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b, "appears twice");
}

TEST(GgufHostile, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u, 1u << 30})
    expect_rejected(Builder().header(0, 1).kv_u32("general.alignment", a).b, "alignment");
  expect_rejected(Builder().header(0, 1).str("general.alignment").u32(8).str("32").b, "alignment");
}

TEST(GgufHostile, LyingTensorInfos) {
  auto one = [](const std::vector<uint64_t>& ne, uint32_t type, uint64_t off, size_t data) {
    Builder g;
    g.header(1, 0).tensor("w", ne, type, off).pad_to(32).zeros(data);
    return g.b;
  };
  expect_rejected(one({}, 0, 0, 64), "dimensions");
  expect_rejected(one({1, 1, 1, 1, 1}, 0, 0, 64), "dimensions");
  expect_rejected(one({1ull << 32, 1ull << 32}, 0, 0, 64), "absurd shape");
  expect_rejected(one({~0ull}, 0, 0, 64), "absurd shape");
  expect_rejected(one({32}, 99, 0, 64), "unknown tensor type 99");
  expect_rejected(one({32}, 4, 0, 64), "unknown tensor type 4");  // retired Q4_2
  expect_rejected(one({16}, 2, 0, 64), "not a multiple of Q4_0's block of 32");
  expect_rejected(one({8}, 0, 8, 64), "not a multiple of the alignment");
  expect_rejected(one({8}, 0, 64, 64), "past the end");
  expect_rejected(one({32}, 0, 0, 64), "past the end");  // 128 bytes in 64
  expect_rejected(one({8}, 0, ~0ull - 31, 64), "past the end");
  Builder dup;
  dup.header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad_to(32).zeros(64);
  expect_rejected(dup.b, "appears twice");
  // Data section start beyond the file: tensor infos end right at the file's end.
  expect_rejected(Builder().header(1, 0).tensor("w", {0}, 0, 0).raw("x", 1).b, "");
}

TEST(GgufHostile, TruncatedAtEveryCutPoint) {
  for (const char* file : {"meta_types.gguf", "tiny_llama.gguf"}) {
    const auto full = read_bytes(kData + file);
    const auto f = GgufFile::parse(full.data(), full.size(), file);
    size_t data_end = 0;  // end of the last tensor's bytes
    for (const auto& t : f->tensors())
      data_end = std::max(data_end, static_cast<size_t>(t.data - full.data()) + t.nbytes);
    // Every byte through the metadata and tensor infos, then strides through the data.
    for (size_t cut = 0; cut < data_end; cut += cut < f->data_offset() + 64 ? 1 : 97) {
      std::vector<uint8_t> part(full.begin(), full.begin() + static_cast<long>(cut));
      EXPECT_THROW(GgufFile::parse(part.data(), part.size(), file), Error) << file << " @" << cut;
    }
  }
}

// Random corruption of the header bytes: every outcome must be either a parse (and model
// reading that succeeds or throws Error) or an Error. ASan/UBSan catch the rest.
TEST(GgufHostile, RandomCorruptionNeverCrashes) {
  const auto full = read_bytes(kData + "tiny_llama.gguf");
  const auto clean = GgufFile::parse(full.data(), full.size(), "tiny");
  const size_t header_end = clean->data_offset();
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 1500; ++iter) {
    auto bytes = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) bytes[rng() % header_end] = static_cast<uint8_t>(rng());
    try {
      const auto f = GgufFile::parse(bytes.data(), bytes.size(), "tiny");
      try {
        const ModelConfig c = gguf_read_config(*f);
        WeightSet w;
        gguf_read_weights(*f, w);
        weights_validate(w, c);
        gguf_read_vocab(*f);
      } catch (const Error&) {
      }
    } catch (const Error&) {
    }
  }
}

TEST(GgufHostile, ModelLevelErrorsNameTheProblem) {
  auto model_error = [](Builder& g) {
    try {
      const auto f = GgufFile::parse(g.b.data(), g.b.size(), "t.gguf");
      const ModelConfig c = gguf_read_config(*f);
      WeightSet w;
      gguf_read_weights(*f, w);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto kv_str = [](Builder& g, const std::string& k, const std::string& v) {
    g.str(k).u32(8).str(v);
  };
  Builder no_arch;
  no_arch.header(0, 0);
  EXPECT_NE(model_error(no_arch).find("general.architecture"), std::string::npos);
  Builder neox;
  neox.header(0, 1);
  kv_str(neox, "general.architecture", "gptneox");
  EXPECT_NE(model_error(neox).find("gptneox"), std::string::npos);
  Builder arch_int;
  arch_int.header(0, 1).kv_u32("general.architecture", 5);
  EXPECT_NE(model_error(arch_int).find("expected a string"), std::string::npos);
  // A used tensor of a ggml type Gyre cannot read names the type.
  Builder q5;
  q5.header(1, 7);
  kv_str(q5, "general.architecture", "llama");
  q5.kv_u32("llama.embedding_length", 64).kv_u32("llama.feed_forward_length", 128);
  q5.kv_u32("llama.block_count", 1).kv_u32("llama.attention.head_count", 4);
  q5.kv_u32("llama.context_length", 64).kv_u32("llama.vocab_size", 32);
  q5.tensor("blk.0.attn_q.weight", {64, 64}, 6, 0).pad_to(32).zeros(64 * 64 / 32 * 22);
  EXPECT_NE(model_error(q5).find("Q5_0"), std::string::npos) << model_error(q5);
}

}  // namespace
}  // namespace gyre
