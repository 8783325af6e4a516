// The tiled 2/3/5/6/8-bit layout's words on the host, no GPU needed: the in-place arrangement
// (qlinear_inplace.h) through the repack's and the decode's functions, and the upload's repack
// (tile_bits_on_host) read back as the stream GEMV loads it. The GPU runs are in
// test_cuda_qbits.cc.
#include <gtest/gtest.h>

#ifdef GYRE_HAVE_CUDA
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cuda/qlinear.h"
#include "backend/cuda/qlinear_inplace.h"
#include "core/half.h"

namespace gyre {
namespace {

// The repack's word w and the decode's slot of pair k at a runtime width.
template <typename Q>
uint32_t inplace_word_at(int bits, int w, Q&& q) {
  switch (bits) {
    case 2:
      return qlinear_detail::inplace_word<2>(w, q);
    case 3:
      return qlinear_detail::inplace_word<3>(w, q);
    case 5:
      return qlinear_detail::inplace_word<5>(w, q);
    case 8:
      return qlinear_detail::inplace_word<8>(w, q);
    default:
      return qlinear_detail::inplace_word<6>(w, q);
  }
}

qlinear_detail::InplaceSlot inplace_slot_at(int bits, const uint32_t* lo, const uint32_t* hi,
                                            int k) {
  switch (bits) {
    case 2:
      return qlinear_detail::inplace_slot<2>(lo, hi, k);
    case 3:
      return qlinear_detail::inplace_slot<3>(lo, hi, k);
    case 5:
      return qlinear_detail::inplace_slot<5>(lo, hi, k);
    case 8:
      return qlinear_detail::inplace_slot<8>(lo, hi, k);
    default:
      return qlinear_detail::inplace_slot<6>(lo, hi, k);
  }
}

// The in-place arrangement on the host (no GPU): every pair's word from the repack's
// inplace_word, read back by the decode's inplace_slot, is 1024 + q 2^p under the 0x6400
// exponent (nothing else set), and the HFMA2 constants of inplace_unscale turn it into q - offset
// exactly (float arithmetic on the FP16 values: the product and the sum are exact). Random and
// extreme values; at 2 and 8 bits the words are the split planes' (pair k at bits 2 (k % 8), 8
// (k % 2)). (The device's 8-bit decode is a PRMT; the host's shifts give the same word.)
TEST(CudaQbits, InplaceArrangementOnTheHost) {
  std::mt19937 rng(11);
  for (const int bits : {2, 3, 5, 6, 8}) {
    const int lo_words = bits == 8 ? 8 : bits >= 5 ? 4 : 2;  // the high plane's words follow
    for (int trial = 0; trial < 3000; ++trial) {
      uint32_t q[16][2];
      for (auto& pair : q)
        for (uint32_t& v : pair)
          v = trial == 0 ? 0u : trial == 1 ? (1u << bits) - 1 : rng() % (1u << bits);
      auto value = [&](int k, int c) { return q[k][c]; };
      uint32_t words[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int w = 0; w < bits; ++w) words[w] = inplace_word_at(bits, w, value);
      if (bits == 8) {  // the device's PRMT selectors give the host decode's words
        for (int k = 0; k < 16; ++k) {
          const uint32_t v =
              qlinear_detail::byte_perm_ref(words[k / 2], 0x64u, qlinear_detail::prmt_pair8(k));
          ASSERT_EQ(v, inplace_slot_at(8, words, words + 8, k).v) << "k " << k;
        }
      }
      if (bits == 2 || bits == 8) {
        const int per = 16 / bits;  // pairs per word
        for (int k = 0; k < 16; ++k)
          for (int c = 0; c < 2; ++c)
            ASSERT_EQ((words[k / per] >> (16 * c + bits * (k % per))) & ((1u << bits) - 1), q[k][c])
                << bits << "b k " << k;
      }
      for (int k = 0; k < 16; ++k) {
        const qlinear_detail::InplaceSlot s = inplace_slot_at(bits, words, words + lo_words, k);
        ASSERT_TRUE(s.p >= 0 && s.p + bits <= 10) << "k " << k;
        for (int c = 0; c < 2; ++c) {
          const auto h = static_cast<uint16_t>(s.v >> (16 * c));
          ASSERT_EQ(h, 0x6400u | (q[k][c] << s.p)) << bits << "b k " << k << " half " << c;
          for (const int offset : {0, 1 << (bits - 1)}) {
            const float f =
                f16_to_f32(static_cast<uint16_t>(qlinear_detail::half2_pow2_neg_bits(s.p)));
            const float m = f16_to_f32(
                static_cast<uint16_t>(qlinear_detail::half2_int_bits(-((1024 >> s.p) + offset))));
            ASSERT_EQ(f16_to_f32(h) * f + m, static_cast<float>(q[k][c]) - offset);
          }
        }
      }
    }
  }
}

// The upload's repack (tile_bits_on_host: the kernel's word function on the CPU) read back as
// gemv_stream_kernel reads it (a lane's S kLo low-plane words of a piece, then its S kHi
// high-plane words; block s of the piece at s kLo and s kHi) and decoded by the in-place
// inplace_slot or the split planes' shifts: every pair of every lane gives the stored value at
// its pair_position (0 in padding). No GPU. Rows and columns not multiples of 16 / 64, piece
// counts that pad the block count.
TEST(CudaQbits, TiledWordsReadBackOnTheHost) {
  std::mt19937 rng(5);
  for (const int bits : {2, 3, 5, 6, 8})
    for (const int pieces : {1, 2, 4})
      for (const bool inplace : {false, true}) {
        QWeightDesc d;
        d.bits = bits;
        d.group_size = 32;
        d.rows = 37;
        d.cols = 1120;  // 17.5 blocks
        QWeightHost w = qweight_allocate(d);
        std::vector<int> q(size_t(d.rows) * d.cols);
        for (int r = 0; r < d.rows; ++r)
          for (int c = 0; c < d.cols; ++c) {
            q[size_t(r) * d.cols + c] = static_cast<int>(rng() % (1u << bits));
            qweight_set_q(w, r, c, q[size_t(r) * d.cols + c]);
          }
        const std::vector<uint32_t> words = qlinear_detail::tile_bits_on_host(w, pieces, inplace);
        const int lo_bits = bits == 8 ? 8 : bits >= 5 ? 4 : 2, hi_bits = bits - lo_bits;
        const int kblocks = ((d.cols + 63) / 64 + pieces - 1) / pieces * pieces;
        const int tiles = (d.rows + 15) / 16, npieces = kblocks / pieces;
        ASSERT_EQ(words.size(), size_t(tiles) * kblocks * 32 * bits);
        for (int tile = 0; tile < tiles; ++tile)
          for (int b = 0; b < kblocks; ++b)
            for (int lane = 0; lane < 32; ++lane) {
              const int piece = b / pieces, s = b % pieces;
              const size_t base = (size_t(tile) * npieces + piece) * 32 * bits * pieces;
              const uint32_t* lo = &words[base + size_t(lane) * lo_bits * pieces + s * lo_bits];
              const uint32_t* hi = &words[base + size_t(32) * lo_bits * pieces +
                                          size_t(lane) * hi_bits * pieces + s * hi_bits];
              for (int k = 0; k < 16; ++k) {
                int row = 0, col = 0;
                qlinear_detail::pair_position(tile, b, lane, k, row, col);
                for (int c = 0; c < 2; ++c) {
                  const bool in = row < d.rows && col + c < d.cols;
                  const uint32_t want = in ? uint32_t(q[size_t(row) * d.cols + col + c]) : 0u;
                  uint32_t got = 0;
                  if (inplace) {
                    const qlinear_detail::InplaceSlot sl = inplace_slot_at(bits, lo, hi, k);
                    ASSERT_EQ(sl.v & 0xFC00FC00u, 0x64006400u);
                    got = ((sl.v >> (16 * c)) & 0x3FFu) >> sl.p;
                  } else {  // plane P: 16 / P pairs per word, pair k at bits P (k % (16 / P))
                    const int lp = 16 / lo_bits;
                    got = (lo[k / lp] >> (16 * c + lo_bits * (k % lp))) & ((1u << lo_bits) - 1);
                    if (hi_bits > 0) {
                      const int hp = 16 / hi_bits;
                      got |= ((hi[k / hp] >> (16 * c + hi_bits * (k % hp))) & ((1u << hi_bits) - 1))
                             << lo_bits;
                    }
                  }
                  ASSERT_EQ(got, want)
                      << bits << "b S " << pieces << " inplace " << inplace << " tile " << tile
                      << " block " << b << " lane " << lane << " pair " << k << " half " << c;
                }
              }
            }
      }
}

}  // namespace
}  // namespace gyre
#endif  // GYRE_HAVE_CUDA
