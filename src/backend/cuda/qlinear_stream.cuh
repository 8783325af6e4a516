// The stream decode GEMV (n = 1..8) for the tiled layouts of every width: 4 bits
// (qlinear_tiled.cu's layout, launched from qlinear_gemv_stream.cu) and 2/3/5/6/8 bits (the tiled
// split-plane layout of qlinear_bits_stream.cu; 8 bits: one plane of bytes). Every warp keeps D
// column blocks (with their scales) in flight in a register ring, or P pieces in a cp.async ring in
// shared memory (session 12: 3.5-5% faster decode at 4, 5 and 6 bits), and refills a slot as soon
// as it has consumed it, while x sits in shared memory, staged once per thread block (gathered
// through the act-order permutation there, RMS-normalised when the norm is fused, rotated by R^T
// for a rotated layer: every block stages all columns, so whole Hadamard blocks are always at hand;
// qlinear_stream_stage.cuh).
//
// Why: round 4 (bench/qlinear_notes.md) found each warp of the earlier kernels advancing one
// block per ~0.6 us whatever the weight prefetch depth: the batch-then-wait loop of the
// register-fed kernel waits a full DRAM round trip per batch, and the shared-memory rings waited
// on x loads from global memory (L2 under full load) for every stage. Here nothing global sits
// on the per-block chain: weights and scales were requested D blocks earlier, x is in shared
// memory.
//
// Tiled layouts: rows in tiles of 16, columns in blocks of 64 (kblocks padded to a multiple of
// S), grouped in pieces of S blocks (S = 1 at 4 bits; 1 or 2 for the narrow widths, whose
// blocks are smaller: two per piece make every lane's load 8 or 16 bytes). Tile T, piece i is
// 128 * BITS * S contiguous bytes: the low plane (L = 4 bits for 4/5/6-bit values, 2 for
// 2/3-bit; S * L u32 words per lane, lane-major: one load per lane, two of 16 bytes at S L = 8),
// then the high plane (H = BITS - L bits, S * H words per lane); block s of the piece owns a
// lane's plane words [s P, (s + 1) P). A lane's plane-P words of a block hold the 16 value pairs k
// = 4j + r of its four m16n8k16 A fragments (step j, register r) in order, 16 / P pairs per word,
// pair k at bits P * (k % (16 / P)) (first column) and 16 + the same (second column): the same bit
// placement as the host split planes (qlinear_ref.h), so a pair is a shift and a mask (2/3/5/6 bits
// by default: the in-place arrangement of qlinear_inplace.h instead, the same words). For 4 bits
// this is exactly the 4-bit tiled word (int4_word_to_fragment). Register r of step j holds row 16T
// + g + 8 (r % 2), columns c + 2 (r / 2) + {0, 1}, c = 64b + 32 (j / 2) + 8t + 4 (j % 2). Scales
// (and mins) are [tiles][groups_p][16] with rows ordered 0, 8, 1, 9, ... (padding zero).
//
// Work split: a block holds (warps / ksplit) 16-row tiles x ksplit warps; warp k of a tile takes
// the contiguous piece range [k * per, (k + 1) * per); a ring slot holds one piece; the ksplit
// partial sums meet in shared memory; the epilogue stores bias, split outputs, SwiGLU or adds into
// y (reduce_store_gemv_tile). f16 scales only.
#pragma once

#include "backend/cuda/qlinear_inplace.cuh"
#include "backend/cuda/qlinear_stream_stage.cuh"

namespace gyre::qlinear_detail {

// Blocks per piece of a tiled 2/3/5/6-bit weight with the in-place arrangement, as measured best
// (bits_tiled_layout says where); the serving-batch kernel is instantiated for these only.
__host__ __device__ constexpr int narrow_default_pieces(int bits, bool asym) {
  if (bits == 8) return 1;  // 32 bytes a lane per block already (two 16-byte loads)
  if (asym) return bits == 2 ? 8 : bits == 3 ? 4 : 2;
  return 1;  // with the shared-memory ring (session 32: 2 bits +11%, 3 bits +7% over 4 and 2)
}

template <int BITS>
struct StreamPlanes {
  // low-plane bits (and words per lane); 8 bits: one plane
  static constexpr int kLo = BITS == 2 || BITS == 3 ? 2 : BITS == 8 ? 8 : 4;
  static constexpr int kHi = BITS - kLo;  // high-plane bits (0, 1 or 2)
};

// The shared-memory ring's slot of one piece (gemv_stream_kernel with P > 0): each lane's
// low-plane words, then each lane's high-plane words (lane-major, as in global memory: one
// conflict-free read of 4 to 16 bytes per lane), then one 128-byte row per scale word (and per
// min word), unless the scales are staged (SS, below).
template <int BITS, int S, bool G32, bool ASYM, bool SS = false>
struct StreamRing {
  static_assert(!(SS && ASYM), "staged scales: symmetric weights only");
  static constexpr int kHiOffset = 128 * StreamPlanes<BITS>::kLo * S;
  static constexpr int kScaleOffset = 128 * BITS * S;
  static constexpr int kScaleWords = S * (G32 ? 2 : 1);
  static constexpr int kSlotBytes = kScaleOffset + (SS ? 0 : kScaleWords * (ASYM ? 2 : 1) * 128);
};

// Staged scales (SS, symmetric ring kernels): a warp copies the scale words of every group its
// pieces touch into shared memory once, after its ring slots, with its first piece, instead of
// one scale word per lane in every piece's slot. Why (session 24, H100): in a model of the 4-bit
// decode GEMV chain (bench/stream_ceiling.cu) the weight loads alone stream at 88-94% of the copy
// bandwidth and the scale loads were the largest part of the rest; here, staged scales decode the
// Llama-3-8B shape 0.5-2% faster at 4, 5 and 6 bits (bench/RESULTS.md, session 24). The groups of
// `per` pieces of S blocks: at most this many (G32: two per block).
template <int S, bool G32>
__host__ __device__ inline int stream_staged_groups(int per, int group) {
  return G32 ? 2 * S * per : (64 * S * per + group - 1) / group + 1;
}

// One warp's dynamic shared memory after the staged x: its P ring slots and, with SS, its scales.
template <int BITS, int S, bool G32, bool ASYM, bool SS>
__host__ __device__ inline int stream_warp_smem(const Params& p, int per, int P) {
  return P * StreamRing<BITS, S, G32, ASYM, SS>::kSlotBytes +
         (SS ? 32 * stream_staged_groups<S, G32>(per, p.group) : 0);
}

// W consecutive u32 words (W * 4 bytes, aligned to that or to 16) from global to shared memory
// by cp.async, 16 bytes at a time where they can be.
template <int W>
__device__ __forceinline__ void cp_async_words(unsigned char* dst, const uint8_t* src) {
  if constexpr (W >= 4) {
#pragma unroll
    for (int k = 0; k < W / 4; ++k) cp_async16(dst + 16 * k, src + 16 * k);
  } else if constexpr (W == 2) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(addr), "l"(src) : "memory");
  } else {
    cp_async4(dst, src);
  }
}

// W consecutive u32 words from shared memory (16-, 8- or 4-byte reads as aligned).
template <int W>
__device__ __forceinline__ void shared_words(const unsigned char* src, uint32_t* out) {
  if constexpr (W >= 4) {
#pragma unroll
    for (int k = 0; k < W / 4; ++k) {
      const uint4 v = *reinterpret_cast<const uint4*>(src + 16 * k);
      out[4 * k] = v.x;
      out[4 * k + 1] = v.y;
      out[4 * k + 2] = v.z;
      out[4 * k + 3] = v.w;
    }
  } else if constexpr (W == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    out[0] = v.x;
    out[1] = v.y;
  } else {
    out[0] = *reinterpret_cast<const uint32_t*>(src);
  }
}

// W (1, 2 or a multiple of 4) consecutive u32 words, read once (kept out of L1 so that x stays
// there).
template <int W>
__device__ __forceinline__ void load_stream_words(const uint8_t* src, uint32_t* out) {
  if constexpr (W > 4) {
#pragma unroll
    for (int k = 0; k < W / 4; ++k) load_stream_words<4>(src + 16 * k, out + 4 * k);
  } else if constexpr (W == 4) {
    const uint4 v = load_stream(src);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else if constexpr (W == 2) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
        : "=r"(out[0]), "=r"(out[1])
        : "l"(src));
  } else if constexpr (W == 1) {
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(out[0]) : "l"(src));
  }
}

// Pair k of a lane's plane of P bits per value (words from `words`): the two values in the low
// bits of the two 16-bit halves.
template <int P>
__device__ __forceinline__ uint32_t stream_pair(const uint32_t* words, int k) {
  constexpr int kPerWord = 16 / P;
  constexpr uint32_t kMask = ((1u << P) - 1) * 0x00010001u;
  return (words[k / kPerWord] >> (P * (k % kPerWord))) & kMask;
}

// Step j of a narrow-width block -> the 4 f16x2 registers of its A fragment, each q - offset
// exactly: the low and high planes' pairs meet under the 0x6400 exponent (the half 1024 + q),
// then one subtraction of base = 1024 + offset.
// lo / hi: the block's low- and high-plane words of this lane.
template <int BITS>
__device__ __forceinline__ void narrow_to_fragment(const uint32_t* lo, const uint32_t* hi, int j,
                                                   __half2 base, uint32_t a[4]) {
  constexpr int kLo = StreamPlanes<BITS>::kLo, kHi = StreamPlanes<BITS>::kHi;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    uint32_t v = stream_pair<kLo>(lo, 4 * j + r) | 0x64006400u;
    if constexpr (kHi > 0) v |= stream_pair<kHi>(hi, 4 * j + r) << kLo;
    const __half2 h = __hsub2(as_half2(v), base);
    memcpy(&a[r], &h, 4);
  }
}

// One piece of S blocks: the lane's low-plane words, then its high-plane words, and the scales
// (mins) of each block's group(s).
template <int BITS, int S, bool G32, bool ASYM>
struct StreamSlot {
  uint32_t q[BITS * S];
  uint32_t s[S * (G32 ? 2 : 1)];
  uint32_t m[ASYM ? S * (G32 ? 2 : 1) : 1];
};

// INPLACE: the in-place word arrangement (qlinear_inplace.h), else the split planes'; at 4 bits
// (one arrangement) the decode with one LOP3 per register (int4_word_to_fragment_lop3).
// P > 0: the pieces go through a ring of P slots per warp in shared memory, filled by cp.async
// (weights and their scales, each lane its own bytes), instead of the register ring (D unused):
// in-flight weights then cost shared memory, not registers (stream_ring_smem).
// AO: 0 handles act-order weights and others (a run-time branch, gather_stream_rows), 1 only
// others, 2 only act-order ones (scatter_stream_rows, which needs inv_perm and the staging space
// act_order_smem gives 4 bits: stream_act_order_scatters). 4 bits takes 1 and 2: without the
// act-order staging in it the common kernel needs 50 registers instead of 59 and decodes the
// Llama-3-8B shape 2.6% faster (H100, session 16); the narrow widths keep 0 (one instantiation
// each: their file's build time).
//
// stream_warp_tile is one warp's share of the kernel: pieces [i_begin, i_end) of tile `tile` of
// p's weight into acc (its lane's fragment quads, before the split-K reduction). It
// requests its first pieces, then calls stage() (the PDL wait and the x staging, block-wide),
// which returns the staged x of this weight's columns (rows `stride` halves apart); the slots of a
// shared-memory ring (P > 0) are the warp's own. The one-weight kernel below and the two-part
// kernel of a mixed weight (qlinear_mixed_stream.cu, whose warps take one part each) share it.
template <int BITS, int S, int D, bool G32, bool ASYM, bool INPLACE, int P, bool SS = false,
          class Stage>
__device__ __forceinline__ void stream_warp_tile(const Params& p, int tile, int i_begin, int i_end,
                                                 int stride, unsigned char* slots, Stage&& stage,
                                                 float (&acc)[4]) {
  static_assert(!SS || P > 0, "staged scales need the shared-memory ring");
  constexpr int kLo = StreamPlanes<BITS>::kLo, kHi = StreamPlanes<BITS>::kHi;
  constexpr int kPieceBytes = 128 * BITS * S, kGroupsPerBlock = G32 ? 2 : 1;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tile_c = min(tile, p.tiles - 1);  // surplus warps compute a copy, store nothing
  const int pieces = p.kblocks / S;
  const int np = i_end - i_begin, b_end = i_end * S;
  const uint8_t* wbase = p.qweight + int64_t{tile_c} * pieces * kPieceBytes;
  const uint8_t* lo_ptr = wbase + lane * 4 * kLo * S;
  const uint8_t* hi_ptr = wbase + 128 * kLo * S + lane * 4 * (kHi > 0 ? kHi : 1) * S;
  const unsigned int* sbase = reinterpret_cast<const unsigned int*>(
      static_cast<const __half*>(p.scales) + int64_t{tile_c} * p.groups_p * 16 + 2 * g);
  const unsigned int* mbase =
      ASYM ? reinterpret_cast<const unsigned int*>(static_cast<const __half*>(p.mins) +
                                                   int64_t{tile_c} * p.groups_p * 16 + 2 * g)
           : nullptr;

  // Groups are powers of two >= 32 and pieces start at multiples of 64 S columns: a piece lies
  // in one group when 64 S <= group, and then one scale load serves all its blocks.
  const bool one_group = 64 * S <= p.group;
  auto fetch = [&](int i, StreamSlot<BITS, S, G32, ASYM>& d) {
    load_stream_words<kLo * S>(lo_ptr + int64_t{i} * kPieceBytes, d.q);
    if constexpr (kHi > 0)
      load_stream_words<kHi * S>(hi_ptr + int64_t{i} * kPieceBytes, d.q + kLo * S);
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const int b = i * S + s, gi = G32 ? 2 * b : (64 * b) >> p.group_log2;
      if (!G32 && s > 0 && one_group) {  // the piece's first block has the group's scale
        d.s[s] = d.s[0];
        if constexpr (ASYM) d.m[s] = d.m[0];
        continue;
      }
#pragma unroll
      for (int k = 0; k < kGroupsPerBlock; ++k) {
        d.s[s * kGroupsPerBlock + k] = __ldg(sbase + (gi + k) * 8);
        if constexpr (ASYM) d.m[s * kGroupsPerBlock + k] = __ldg(mbase + (gi + k) * 8);
      }
    }
  };

  using Slot = StreamSlot<BITS, S, G32, ASYM>;
  using Ring = StreamRing<BITS, S, G32, ASYM, SS>;
  constexpr int kScaleWords = S * kGroupsPerBlock;
  // SS: group g_first's 8 scale words (rows 0, 8, 1, 9, ...) and the later groups' after the slots.
  [[maybe_unused]] const int g_first = G32 ? 2 * S * i_begin : (64 * S * i_begin) >> p.group_log2;
  [[maybe_unused]] const uint32_t* staged =
      reinterpret_cast<const uint32_t*>(slots + P * Ring::kSlotBytes);
  if constexpr (SS) {  // joins the first piece's cp.async group (issued below)
    const int groups =
        np <= 0 ? 0 : (G32 ? 2 * S * np : ((64 * S * i_end - 1) >> p.group_log2) - g_first + 1);
    const uint8_t* src =
        reinterpret_cast<const uint8_t*>(p.scales) + (int64_t{tile_c} * p.groups_p + g_first) * 32;
    unsigned char* dst = slots + P * Ring::kSlotBytes;
    if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
      for (int c = lane; c < 2 * groups; c += 32) cp_async16(dst + 16 * c, src + 16 * c);
    } else {
      for (int c = lane; c < 8 * groups; c += 32) cp_async4(dst + 4 * c, src + 4 * c);
    }
  }
  // Piece i into slot dst: weight planes (wp: the lane's low-plane words of the piece), then
  // scales (mins).
  auto issue = [&](int i, unsigned char* dst, const uint8_t* wp) {
    cp_async_words<kLo * S>(dst + lane * 4 * kLo * S, wp);
    if constexpr (kHi > 0)
      cp_async_words<kHi * S>(dst + Ring::kHiOffset + lane * 4 * kHi * S, wp + (hi_ptr - lo_ptr));
    if constexpr (!SS) {
#pragma unroll
      for (int sidx = 0; sidx < S; ++sidx) {
        const int b = i * S + sidx;
#pragma unroll
        for (int k = 0; k < kGroupsPerBlock; ++k) {
          const int gi = (G32 ? 2 * b : (64 * b) >> p.group_log2) + k;
          const int wsl = sidx * kGroupsPerBlock + k;
          cp_async4(dst + Ring::kScaleOffset + wsl * 128 + lane * 4, sbase + gi * 8);
          if constexpr (ASYM)
            cp_async4(dst + Ring::kScaleOffset + (kScaleWords + wsl) * 128 + lane * 4,
                      mbase + gi * 8);
        }
      }
    }
  };
  // Piece i from its slot src; staged scales (SS) only where the caller does not read them.
  auto read_slot = [&](const unsigned char* src, int i, Slot& d, bool staged_read) {
    shared_words<kLo * S>(src + lane * 4 * kLo * S, d.q);
    if constexpr (kHi > 0)
      shared_words<kHi * S>(src + Ring::kHiOffset + lane * 4 * kHi * S, d.q + kLo * S);
#pragma unroll
    for (int k = 0; k < kScaleWords; ++k) {
      if constexpr (SS) {
        if (staged_read) {
          const int b = i * S + k / kGroupsPerBlock;
          const int gi = (G32 ? 2 * b : (64 * b) >> p.group_log2) + k % kGroupsPerBlock;
          d.s[k] = staged[(gi - g_first) * 8 + g];
        }
      } else {
        d.s[k] = *reinterpret_cast<const uint32_t*>(src + Ring::kScaleOffset + k * 128 + lane * 4);
        if constexpr (ASYM)
          d.m[k] = *reinterpret_cast<const uint32_t*>(src + Ring::kScaleOffset +
                                                      (kScaleWords + k) * 128 + lane * 4);
      }
    }
  };

  Slot ring[P > 0 ? 1 : D];
  const uint8_t* wnext = lo_ptr + int64_t{i_begin} * kPieceBytes;  // the next piece to request
  if constexpr (P > 0) {
#pragma unroll
    for (int u = 0; u < P; ++u) {
      if (u < np) issue(i_begin + u, slots + u * Ring::kSlotBytes, wnext);
      cp_async_commit();
      wnext += kPieceBytes;
    }
  } else {
#pragma unroll
    for (int u = 0; u < D; ++u)
      if (u < np) fetch(i_begin + u, ring[u]);
  }
  // The weight loads above overlap the previous kernel's tail (PDL, launch.h); x is its output.
  const __half* xs = stage();

  const __half* xrow = xs + min(g, p.n - 1) * stride + 8 * t;  // B column g: token g
  constexpr uint32_t kOffset = ASYM ? 0u : 1u << (BITS - 1);
  const __half2 lo_base = __float2half2_rn(1024.f + kOffset);
  const __half2 hi_base = __float2half2_rn(-64.f - kOffset);  // 4 bits: the 16q registers
  const uint32_t ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = 0.f;
  float cg[4] = {0.f, 0.f, 0.f, 0.f}, cx[4] = {0.f, 0.f, 0.f, 0.f};
  auto flush = [&](uint32_t sr, uint32_t mr) {
    const float2 m = ASYM ? __half22float2(as_half2(mr)) : make_float2(0.f, 0.f);
    flush_group(acc, cg, cx, __half22float2(as_half2(sr)), m, ASYM);
  };
  // Block b from its lane words (lo, hi), its staged x (xb) and scales (mins) of its group(s);
  // flushes its group(s) where they end, unless the caller's loop flushes whole groups
  // (group_flush: a group of one or more whole blocks).
  auto compute_block = [&](const uint32_t* lo, const uint32_t* hi, const uint32_t* sc,
                           const uint32_t* mn, int b, const __half* xb, bool group_flush) {
    const uint4 x0 = *reinterpret_cast<const uint4*>(xb);
    const uint4 x1 = *reinterpret_cast<const uint4*>(xb + 32);
    const uint32_t xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t a[4];
      if constexpr (BITS == 4 && INPLACE)
        int4_word_to_fragment_lop3(lo[j], lo_base, hi_base, a);
      else if constexpr (BITS == 4)
        int4_word_to_fragment(lo[j], lo_base, hi_base, a);
      else if constexpr (INPLACE)
        inplace_to_fragment<BITS, kOffset>(lo, hi, j, a);
      else
        narrow_to_fragment<BITS>(lo, hi, j, lo_base, a);
      mma_16816(cg, a, xv[2 * j], xv[2 * j + 1]);
      if constexpr (ASYM) mma_16816(cx, ones, xv[2 * j], xv[2 * j + 1]);
      if (G32 && j == 1) flush(sc[0], ASYM ? mn[0] : 0u);
    }
    if constexpr (G32) {
      flush(sc[1], ASYM ? mn[1] : 0u);
    } else if (!group_flush) {
      // A group spans 2+ blocks: flush when the next block starts a new group (or at the end).
      const int b1 = b + 1;
      if (b1 == b_end || ((64 * b1) & ((1 << p.group_log2) - 1)) == 0)
        flush(sc[0], ASYM ? mn[0] : 0u);
    }
  };
  auto compute = [&](const StreamSlot<BITS, S, G32, ASYM>& d, int i, const __half* xp,
                     bool group_flush) {
#pragma unroll
    for (int s = 0; s < S; ++s)
      compute_block(d.q + s * kLo, d.q + kLo * S + s * kHi, d.s + s * kGroupsPerBlock,
                    d.m + (ASYM ? s * kGroupsPerBlock : 0), i * S + s, xp + 64 * s, group_flush);
  };

  if constexpr (P > 0) {
    // Lean on purpose (session 25): per piece only the slot's wait, read, math, refill and
    // commit, with the slot, x and refill addresses advanced rather than recomputed; where a
    // warp's range is made of whole groups of one or two pieces (g64 and g128 at S = 1, g128 at
    // S = 2), each group's scale is read once and flushed after its last piece without a test per
    // block. In a model of the 4-bit chain (bench/stream_ceiling.cu) such a loop took the step
    // from 1,580 to 1,480 us.
    unsigned char* const slots_end = slots + P * Ring::kSlotBytes;
    unsigned char* slot = slots;  // piece i's slot, which its refill (piece i + P) reuses
    const __half* xp = xrow + 64 * S * i_begin;
    // group_flush: the caller flushes (its scale word sw) after the group's last piece.
    auto piece = [&](int i, unsigned char* at, bool group_flush) {
      cp_async_wait<P - 1>();  // piece i's group (one group per piece, in order)
      read_slot(at, i_begin + i, ring[0], !group_flush);
      compute(ring[0], i_begin + i, xp, group_flush);
      if (i + P < np) issue(i_begin + i + P, at, wnext);  // after the slot was read
      cp_async_commit();
      wnext += kPieceBytes;
      xp += 64 * S;
    };
    // SS: the next group's scale word, read after the group's first piece: the staged scales
    // came with the warp's first piece (cp.async group 0), whose wait is in piece().
    [[maybe_unused]] const uint32_t* sp = staged + g;
    auto group_scale = [&]() -> uint32_t {
      if constexpr (SS) {
        const uint32_t w = *sp;
        sp += 8;
        return w;
      } else {
        return 0u;  // read from the slot with the piece
      }
    };
    auto group_end = [&](uint32_t sw) { flush(SS ? sw : ring[0].s[0], ASYM ? ring[0].m[0] : 0u); };
    const int span = G32 || (S > 1 && !one_group) ? 0 : (1 << p.group_log2) / (64 * S);
    if (P % 2 == 0 && span == 2 && ((i_begin | np) & 1) == 0) {
      for (int i = 0; i < np; i += 2) {
        piece(i, slot, true);
        const uint32_t sw = group_scale();
        piece(i + 1, slot + Ring::kSlotBytes, true);
        group_end(sw);
        slot += 2 * Ring::kSlotBytes;
        if (slot == slots_end) slot = slots;
      }
    } else if (span == 1) {
      for (int i = 0; i < np; ++i) {
        piece(i, slot, true);
        group_end(group_scale());
        slot += Ring::kSlotBytes;
        if (slot == slots_end) slot = slots;
      }
    } else {  // groups of 32 columns, across pieces or ranges: compute_block flushes
      for (int i = 0; i < np; ++i) {
        piece(i, slot, false);
        slot += Ring::kSlotBytes;
        if (slot == slots_end) slot = slots;
      }
    }
  } else {
    for (int i0 = 0; i0 < np; i0 += D) {
#pragma unroll
      for (int u = 0; u < D; ++u) {
        const int i = i0 + u;
        if (i < np) {
          compute(ring[u], i_begin + i, xrow + 64 * S * (i_begin + i), false);
          if (i + D < np) fetch(i_begin + i + D, ring[u]);
        }
      }
    }
  }
}

template <int BITS, int S, int D, bool G32, bool ASYM, bool INPLACE, int P = 0, int AO = 0,
          bool SS = false>
__global__ void __launch_bounds__(512) gemv_stream_kernel(Params p, int per) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* xs = reinterpret_cast<__half*>(smem_raw);
  const int warp = threadIdx.x >> 5;
  const int tile = blockIdx.x * (blockDim.x / 32 / p.ksplit) + warp / p.ksplit;
  const int ks = warp % p.ksplit;
  const int stride = p.kblocks * 64 + kStreamXPad;
  // P > 0: this warp's slots (and staged scales) after the staged x (and rotation data), 16-byte
  // aligned.
  unsigned char* slots =
      smem_raw + stream_smem_aligned(p) +
      static_cast<size_t>(warp) * stream_warp_smem<BITS, S, G32, ASYM, SS>(p, per, P);
  float acc[4];
  const int pieces = p.kblocks / S;
  const int i_begin = min(ks * per, pieces), i_end = min(i_begin + per, pieces);
  stream_warp_tile<BITS, S, D, G32, ASYM, INPLACE, P, SS>(
      p, tile, i_begin, i_end, stride, slots,
      [&] {
        int8_t* signs = reinterpret_cast<int8_t*>(xs + p.n * stride);
        __half* norm_s = reinterpret_cast<__half*>(signs + p.cols);  // cols: a multiple of 32
        if (p.had_block > 0) stage_rotation_async(p, signs, norm_s);
        const NormAhead ahead = norm_ahead(p);
        // x (the previous kernel's output) and everything written below wait for its completion. A
        // late part (Params::late_wait) reads nothing of that kernel's before its epilogue, so it
        // lets the next kernel in and stages and computes now.
        if (p.late_wait)
          cuda::pdl_launch_dependents();
        else
          cuda::pdl_begin();
        stage_stream_x<AO>(p, xs, stride, signs, norm_s, &ahead);
        return static_cast<const __half*>(xs);
      },
      acc);
  __shared__ float4 partial[16][32];
  if (p.late_wait) cuda::pdl_wait();  // the previous part's sum (prior, or y to accumulate)
  reduce_store_gemv_tile(p, partial, warp, ks, tile, acc);
}

}  // namespace gyre::qlinear_detail
