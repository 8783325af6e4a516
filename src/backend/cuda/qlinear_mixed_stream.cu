// One launch for a mixed weight of two widths at up to kQlinearPairMaxRows tokens whose inputs lie
// in its decode row's layout (QMixedDevice::row, or rows gathered so): the warps of each 16-row
// tile split the tile's work between the two parts, each warp streaming its parts' pieces with
// the stream GEMV's loop (stream_warp_tile, qlinear_stream.cuh) over the parts' slices of the
// staged rows, and the tile's split-K reduction adds the parts' partial sums before the epilogue
// stores them (plain, accumulated, split or SwiGLU outputs).
//
// Why: a mix ran one stream GEMV per part, so a 4/3 mix of the Llama-3-8B shape took 9 GEMV
// launches per layer against 5, and decoded at 394 tok/s where uniform 3-bit weights decode at
// 478 (H100). In one launch, with the tile's bytes cut evenly over its warps and at most one
// wave of blocks, it decodes at 466 (48.5% of its roofline, uniform 3-bit 46.8%); 5/4 371 -> 442,
// 3/2 335 -> 507, 6/5 339 -> 386 (bench/NOTES.md session 23).
//
// Each part keeps the kernel configuration its width takes alone (blocks per piece, register or
// shared-memory ring), groups of 64 or more columns in the in-place arrangement, both parts
// symmetric or both asymmetric (2/3 and 3/4 bits, the asymmetric mixes Gyre's converter emits);
// other mixes keep one launch per part (qlinear_pair_supported says which).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "backend/cuda/qlinear.h"
#include "backend/cuda/qlinear_stream_launch.cuh"
#include "core/error.h"

namespace gyre {
namespace qlinear_detail {

namespace {

// A part's configuration: the stream kernel's template arguments its width takes alone
// (qlinear_bits_stream.cu's launch_decode, qlinear_gemv_stream.cu's launch_depth): blocks per
// piece S, register ring depth D or shared-memory ring of P slots, asymmetric (mins), the in-place
// decode (at 4 bits: the one-LOP3 decode, symmetric only).
template <int BITS, int S, int D, int P, bool ASYM = false, bool INPLACE = true>
struct PartCfg {
  static constexpr int kBits = BITS, kS = S, kD = D, kP = P;
  static constexpr bool kAsym = ASYM, kInplace = INPLACE;
  static constexpr int kSlotBytes = P * StreamRing<BITS, S, false, ASYM>::kSlotBytes;
  static constexpr int kPieceBytes = 128 * BITS * S;
};
using Cfg2 = PartCfg<2, 1, 4, 4>;
using Cfg3 = PartCfg<3, 1, 4, 4>;
using Cfg4 = PartCfg<4, 1, 4, 4>;
using Cfg5 = PartCfg<5, 1, 4, 4>;
using Cfg6 = PartCfg<6, 1, 4, 4>;
// Asymmetric: Gyre's converter mixes 2/3 and 3/4 bits so (narrow_default_pieces).
using Cfg2a = PartCfg<2, 8, 2, 0, true>;
using Cfg3a = PartCfg<3, 4, 2, 0, true>;
using Cfg4a = PartCfg<4, 1, 4, 0, true, false>;
static_assert(Cfg2::kS == narrow_default_pieces(2, false) &&
                  Cfg3::kS == narrow_default_pieces(3, false) &&
                  Cfg2a::kS == narrow_default_pieces(2, true) &&
                  Cfg3a::kS == narrow_default_pieces(3, true),
              "a part's blocks per piece are its width's layout (pair_part)");

struct PairArgs {
  Params part[2];  // the parts' weights (A, the wider, first)
  Params stage;    // the row both read: x = its start, cols = its padded columns, the fused norm
  Params epi;      // outputs and epilogue fusions; ksplit = the warps of one tile
  int pieces[2] = {}, cost[2] = {};  // each part's pieces and bytes per piece
  int x_offset[2] = {};              // each part's place in the row (halves)
  int slot_bytes = 0;                // shared-memory ring bytes per warp (the larger part's)
};

// The shared memory of the staged row (stream_smem of the stage Params) and the warps' rings.
int pair_smem(const PairArgs& a, int warps) {
  return stream_smem_aligned(a.stage) + warps * a.slot_bytes;
}

// Warp k of a tile's share: the tile's bytes (A's pieces, then B's) cut into ksplit equal runs,
// each cut at the nearest piece boundary, so that neighbours agree and a run may end in A's
// pieces and go on in B's.
__device__ __forceinline__ void pair_ranges(const PairArgs& a, int k, int (&r)[4]) {
  const int64_t ca = a.cost[0], cb = a.cost[1], ta = int64_t{a.pieces[0]} * ca;
  const int64_t total = ta + int64_t{a.pieces[1]} * cb;
  const int64_t lo = total * k / a.epi.ksplit, hi = total * (k + 1) / a.epi.ksplit;
  auto in_a = [&](int64_t u) {
    return static_cast<int>(min((u + ca / 2) / ca, int64_t{a.pieces[0]}));
  };
  auto in_b = [&](int64_t u) {
    return u <= ta ? 0 : static_cast<int>(min((u - ta + cb / 2) / cb, int64_t{a.pieces[1]}));
  };
  r[0] = in_a(lo);
  r[1] = in_a(hi);
  r[2] = in_b(lo);
  r[3] = in_b(hi);
}

template <class A, class B>
__global__ void __launch_bounds__(512) gemv_stream_pair_kernel(const __grid_constant__ PairArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* xs = reinterpret_cast<__half*>(smem_raw);
  const int warp = threadIdx.x >> 5, kst = a.epi.ksplit;
  const int tile = blockIdx.x * (blockDim.x / 32 / kst) + warp / kst, k = warp % kst;
  const int stride = a.stage.kblocks * 64 + kStreamXPad;
  unsigned char* slots = smem_raw + stream_smem_aligned(a.stage) + warp * a.slot_bytes;
  int r[4];
  pair_ranges(a, k, r);
  // The first part a warp streams stages the row (after requesting its first pieces, so that the
  // two parts' rings never live at once); its barriers are the non-aligned kind for that reason.
  auto stage = [&](int part) {
    return [&, part] {
      cuda::pdl_begin();
      stage_stream_x<1, false>(a.stage, xs, stride, nullptr, nullptr);
      return static_cast<const __half*>(xs + a.x_offset[part]);
    };
  };
  constexpr bool kG32 = false;
  float acc[4];
  if (r[1] > r[0]) {
    stream_warp_tile<A::kBits, A::kS, A::kD, kG32, A::kAsym, A::kInplace, A::kP>(
        a.part[0], tile, r[0], r[1], stride, slots, stage(0), acc);
    if (r[3] > r[2]) {  // the run goes on in B's pieces: the row is staged already
      float more[4];
      stream_warp_tile<B::kBits, B::kS, B::kD, kG32, B::kAsym, B::kInplace, B::kP>(
          a.part[1], tile, r[2], r[3], stride, slots,
          [&] { return static_cast<const __half*>(xs + a.x_offset[1]); }, more);
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += more[i];
    }
  } else {  // B's pieces only (possibly none: the staging's barriers still count this warp)
    stream_warp_tile<B::kBits, B::kS, B::kD, kG32, B::kAsym, B::kInplace, B::kP>(
        a.part[1], tile, r[2], r[3], stride, slots, stage(1), acc);
  }
  __shared__ float4 partial[16][32];
  reduce_store_gemv_tile(a.epi, partial, warp, k, tile, acc);
}

uint64_t g_launches = 0;  // qlinear_pair_launches
int g_pair = -1;          // -1: GYRE_CUDA_MIXED_ONE (default on)
int g_tile_ks = -1;       // warps per tile (0: by the plan); -1: GYRE_CUDA_MIXED_TILE_WARPS

int env_int(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e != nullptr && *e != 0 ? std::atoi(e) : fallback;
}

// Warps per tile as the one-weight kernel sizes its split-K, over both parts' pieces and at the
// narrow widths' budget of 64 warps per SM (32 to 128 measured the same, session 23), then the
// one-wave rule (stream_grid), not below one warp per part; or forced (set_mixed_pair).
template <class A, class B>
void launch_pair(PairArgs a, cudaStream_t stream) {
  int sms = 0, optin = 0;
  stream_device_limits(sms, optin);
  if (g_tile_ks < 0) g_tile_ks = env_int("GYRE_CUDA_MIXED_TILE_WARPS", 0);
  a.pieces[0] = a.part[0].kblocks / A::kS;
  a.pieces[1] = a.part[1].kblocks / B::kS;
  a.cost[0] = A::kPieceBytes;
  a.cost[1] = B::kPieceBytes;
  a.slot_bytes = std::max(A::kSlotBytes, B::kSlotBytes);
  auto kernel = gemv_stream_pair_kernel<A, B>;
  static const bool raised = allow_optin_shared(kernel, optin, "gemv stream pair");
  (void)raised;
  const int pieces = a.pieces[0] + a.pieces[1];
  const int ks = g_tile_ks > 0 ? std::min(g_tile_ks, pieces)
                               : stream_ksplit_for(a.epi.tiles, pieces, a.epi.n, 64);
  const StreamGrid g =
      stream_grid(reinterpret_cast<const void*>(kernel), a.epi.tiles, ks, 2, g_tile_ks == 0,
                  [&](int, int warps) { return pair_smem(a, warps); });
  a.epi.ksplit = g.ks;
  qlaunch(kernel, g.blocks, g.warps * 32, g.smem, stream, a);
  ++g_launches;
}

// The kernel pair of two widths (wider first) and symmetry: the wider width (negated when
// asymmetric), 0 where no pair kernel exists.
int pair_code(int bits_a, int bits_b, bool asym) {
  if (bits_a - bits_b != 1) return 0;
  if (asym) return bits_b == 2 || bits_b == 3 ? -bits_a : 0;
  return bits_b >= 2 && bits_b <= 5 ? bits_a : 0;
}

// The row both parts read, as the staging's Params.
Params pair_stage(const QlinearPairRow& r) {
  Params s{};
  s.x = r.row;
  s.cols = r.cols;
  s.kblocks = r.cols / 64;
  s.n = r.n;
  s.norm_w = r.norm_w;
  s.norm_eps = r.norm_eps;
  s.norm_cols = r.norm_cols;
  return s;
}

// Blocks per piece of a part's configuration (0 at 4 bits: the 4-bit tiled layout).
int pair_pieces(int bits, bool asym) {
  return bits == 4 ? 0 : narrow_default_pieces(bits, asym);
}

// A part as the kernel takes it: f16 scales in groups of 64+ columns, no act-order or rotation,
// in the tiled layout its width's configuration reads.
bool pair_part(const QWeightDevice& w) {
  const QWeightDesc& d = w.desc;
  if (d.trellis || d.scale_f32 || d.group_size < 64 || w.perm != nullptr || w.had_block > 0)
    return false;
  if (d.bits == 4) return true;
  return d.narrow() && w.narrow_inplace && w.narrow_tiled == pair_pieces(d.bits, d.asymmetric);
}

bool pair_enabled() {
  if (g_pair < 0) g_pair = env_int("GYRE_CUDA_MIXED_ONE", 1) == 0 ? 0 : 1;
  return g_pair == 1;
}

}  // namespace

void set_mixed_pair(int mode, int tile_warps) {
  GYRE_CHECK(mode >= -1 && mode <= 1 && tile_warps >= 0 && tile_warps <= 16,
             "qlinear: pair mode -1..1, warps per tile 0..16");
  g_pair = mode;
  g_tile_ks = tile_warps == 0 ? -1 : tile_warps;
}

uint64_t qlinear_pair_launches() {
  return g_launches;
}

void launch_gemv_stream_pair(const Params& pa, const Params& pb, const QlinearPairRow& row,
                             const Params& epi, cudaStream_t stream) {
  PairArgs a;
  const bool swap = pb.bits > pa.bits;
  a.part[0] = swap ? pb : pa;
  a.part[1] = swap ? pa : pb;
  a.x_offset[0] = row.offset[swap ? 1 : 0];
  a.x_offset[1] = row.offset[swap ? 0 : 1];
  a.stage = pair_stage(row);
  a.epi = epi;
  switch (pair_code(a.part[0].bits, a.part[1].bits, a.part[0].asym)) {
    case -3:
      return launch_pair<Cfg3a, Cfg2a>(a, stream);
    case -4:
      return launch_pair<Cfg4a, Cfg3a>(a, stream);
    case 3:
      return launch_pair<Cfg3, Cfg2>(a, stream);
    case 4:
      return launch_pair<Cfg4, Cfg3>(a, stream);
    case 5:
      return launch_pair<Cfg5, Cfg4>(a, stream);
    case 6:
      return launch_pair<Cfg6, Cfg5>(a, stream);
    default:
      fail("qlinear: no two-part kernel for ", a.part[0].bits, " and ", a.part[1].bits, " bits");
  }
}

}  // namespace qlinear_detail

bool qlinear_pair_supported(const QWeightDevice& a, const QWeightDevice& b, int row_cols, int n) {
  using namespace qlinear_detail;
  if (!pair_enabled() || n < 1 || n > kQlinearPairMaxRows || !pair_part(a) || !pair_part(b) ||
      a.desc.rows != b.desc.rows || row_cols % 64 != 0 || a.desc.asymmetric != b.desc.asymmetric ||
      pair_code(std::max(a.desc.bits, b.desc.bits), std::min(a.desc.bits, b.desc.bits),
                a.desc.asymmetric) == 0)
    return false;
  int sms = 0, optin = 0;
  stream_device_limits(sms, optin);
  QlinearPairRow r;
  r.cols = row_cols;
  r.n = n;
  PairArgs args;
  args.stage = pair_stage(r);
  args.slot_bytes = Cfg6::kSlotBytes;  // the largest ring, at the most warps a block takes
  return pair_smem(args, 16) + 9 * 1024 <= optin;
}

}  // namespace gyre
