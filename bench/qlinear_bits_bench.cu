// Throughput of the 2/3/5/6-bit decode GEMV on Llama-3 shapes, n = 1, 2 and 8: the host-layout
// CUDA-core kernel (qlinear_bits.cu, "old", rows per warp auto) against the tiled stream
// kernel (qlinear_bits_stream.cu: "new_sS" the default, S blocks per piece; "sS" the others), with
// the 4-bit stream GEMV on the same shape for reference, plus the FP16 dequantization of each
// layout (prefill, n > 8); `decode`: the narrow decodes old against new (decode_ab). Build:
// bench/qlinear_device.sh. Weights are random bytes (speed only; correctness is in the tests),
// rotated over > 300 MB so the numbers are DRAM numbers.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/qlinear.h"

using namespace gyre;

#include "bench_common.cuh"

namespace gyre::qlinear_detail {
void set_int4_lop3(int mode);  // qlinear_gemv_stream.cu (declared in qlinear_stream.cuh)
}  // namespace gyre::qlinear_detail

Weight make(const QWeightDesc& d, uint32_t seed) {
  return make_weight(d, seed);
}

// The benched weights: rows x cols = sh, group 128.
QWeightDesc g128_desc(const int* sh, int bits, bool asym) {
  QWeightDesc d;
  d.bits = bits;
  d.group_size = 128;
  d.asymmetric = asym;
  d.rows = sh[0];
  d.cols = sh[1];
  return d;
}

// Bytes of the codes and scales (and mins).
double weight_bytes(const QWeightDesc& d) {
  return double(d.qweight_bytes()) + d.scale_count() * (d.asymmetric ? 4.0 : 2.0);
}

// Copies of a weight to rotate through so that its launches read > 300 MB (not L2).
int rotation_copies(const QWeightDesc& d) {
  return std::max(1, int(std::ceil(300e6 / weight_bytes(d))));
}

// `qlinear_bits_bench tune`: the dispatch sweeps of session 7 (bench/qlinear_notes.md): asymmetric
// weights on every shape by layout (blocks per piece) and warp budget, and the passes (tokens per
// pass) of long rows at n = 3..8; `qlinear_bits_bench verify`: the default dispatch and the
// host-layout kernel on every shape. Lines: T shape bits sym n layout budget chunk us.
int tune(const __half* x, __half* y, bool verify) {
  const int shapes[][2] = {{4096, 4096}, {6144, 4096}, {14336, 4096}, {4096, 14336}, {28672, 4096}};
  auto sweep = [&](const int* sh, int bits, bool asym, const std::vector<int>& layouts,
                   const std::vector<int>& budgets, const std::vector<int>& chunks,
                   const std::vector<int>& ns) {
    const QWeightDesc d = g128_desc(sh, bits, asym);
    const double bytes = weight_bytes(d);
    const int copies = rotation_copies(d);
    for (const int layout : layouts) {
      qlinear_detail::set_bits_stream(layout == 0 ? 0 : 1);
      qlinear_detail::set_bits_stream_pieces(layout < 0 ? 0 : layout);
      std::vector<Weight> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(make(d, 17 + c));
      for (const int budget : layout == 0 ? std::vector<int>{0} : budgets) {
        qlinear_detail::set_bits_stream_warps(budget);
        for (const int chunk : layout == 0 ? std::vector<int>{0} : chunks) {
          qlinear_detail::set_bits_stream_chunk(chunk);
          for (const int n : ns) {
            const float ms = time_ms(
                [&](int i) { qlinear_matmul(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 40);
            std::printf("T %5dx%-6d %d %-4s %d %s%d b%d c%d %8.2f\n", sh[0], sh[1], bits,
                        asym ? "asym" : "sym", n, layout == 0 ? "old" : "s",
                        layout == 0 ? 0 : ws[0].w.narrow_tiled, budget, chunk, ms * 1e3);
          }
        }
      }
      qlinear_detail::set_bits_stream_warps(0);
      qlinear_detail::set_bits_stream_chunk(0);
      CK(cudaGetLastError());
      for (auto& w : ws) CK(cudaFree(w.mem));
    }
    qlinear_detail::set_bits_stream_pieces(0);
    qlinear_detail::set_bits_stream(-1);
  };
  if (verify) {  // the default dispatch against the host-layout kernel
    std::printf("\n# verify: old (host layout) and the default dispatch\n");
    for (const auto& sh : shapes)
      for (const int bits : {2, 3, 5, 6})
        for (const bool asym : {false, true})
          sweep(
              sh, bits, asym, {0, -1}, {0}, {0},
              sh[1] > 8192 ? std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8} : std::vector<int>{1, 2, 8});
    return 0;
  }
  std::printf("\n# asymmetric: layout x warp budget (0 = default)\n");
  for (const auto& sh : shapes)
    for (const int bits : {2, 3, 5, 6})
      sweep(sh, bits, true,
            bits == 2 ? std::vector<int>{0, 1, 2, 4, 8} : std::vector<int>{0, 1, 2, 4}, {0, 32, 64},
            {0}, {1, 2, 8});
  std::printf("\n# long rows: tokens per pass x warp budget\n");
  for (const int bits : {2, 3, 5, 6})
    for (const bool asym : {false, true})
      sweep(shapes[3], bits, asym, {0, -1}, {0, 16, 32, 64}, {0, 1, 2, 3, 4, 5, 7}, {3, 4, 6, 8});
  std::printf("\n# long rows 6-bit n = 8 by layout\n");
  sweep(shapes[3], 6, false, {1, 2, 4}, {0, 32, 64}, {0, 2, 3, 4, 7}, {8});
  CK(cudaDeviceSynchronize());
  return 0;
}

// `qlinear_bits_bench decode [bits...]` (default 5 6; "decode 2 3": session 11's 2/3-bit run):
// the decodes at the default pieces, "dec_new" (the in-place arrangement, qlinear_inplace.h: the
// default) against "dec_old" (the split planes', set_bits_decode(0)), n = 1, 2, 8 on the five
// shapes; the in-place decode at other piece sizes ("new_sS", n = 1, 2: its registers differ
// from the old kernel's, so another size may win now; "new_s1w64": 6 bits at 1 block per piece,
// 64 registers, with the warp budget of 64), at 3 bits with 2 blocks per piece the ring of 4
// ("s2d4", 77 registers) alone and with a warp budget of 32 ("s2d4w32"); asymmetric at 4096x4096;
// the 4-bit stream GEMV ("4bit": one LOP3 per register, "4bit_old": two, set_int4_lop3(0)); then
// the Llama-3-8B layer sum (QKV 6144 + o 4096 + gate/up 28672 + down 4096x14336) at n = 1 per
// decode.
template <typename Row>
int decode_ab(const __half* x, __half* y, Row&& row, const std::vector<int>& widths) {
  const int shapes[][2] = {{4096, 4096}, {6144, 4096}, {14336, 4096}, {4096, 14336}, {28672, 4096}};
  const double layer_weight[] = {1, 1, 0, 1, 1};  // 14336x4096 is not in the layer
  double layer[7][2] = {};                        // [bits][old, new]
  std::vector<int> all = {4};
  all.insert(all.end(), widths.begin(), widths.end());
  for (int si = 0; si < 5; ++si) {
    const int* sh = shapes[si];
    for (const int bits : all)
      for (const bool asym : {false, true}) {
        if (asym && (si != 0 || bits == 4)) continue;
        const QWeightDesc d = g128_desc(sh, bits, asym);
        const double bytes = weight_bytes(d);
        const int copies = rotation_copies(d);
        // decode 0 / 1 at the default pieces, then 1 at other pieces, depth, budget (n <= 2)
        struct Config {
          int decode, pieces, depth, budget;
          const char* name;
        };
        std::vector<Config> configs = {{0, 0, 0, 0, "dec_old"}, {1, 0, 0, 0, "dec_new"}};
        if (bits == 4) configs = {{0, 0, 0, 0, "4bit_old"}, {1, 0, 0, 0, "4bit"}};
        if (bits == 2 && !asym)
          configs.insert(configs.end(),
                         {{1, 1, 0, 0, "new_s1"}, {1, 2, 0, 0, "new_s2"}, {1, 8, 0, 0, "new_s8"}});
        if (bits == 3 && !asym)
          configs.insert(configs.end(), {{1, 1, 0, 0, "new_s1"},
                                         {1, 4, 0, 0, "new_s4"},
                                         {1, 2, 4, 0, "s2d4"},
                                         {1, 2, 4, 32, "s2d4w32"}});
        if (bits == 5 && !asym)
          configs.insert(configs.end(), {{1, 2, 0, 0, "new_s2"}, {1, 4, 0, 0, "new_s4"}});
        if (bits == 6 && !asym)
          configs.insert(
              configs.end(),
              {{1, 1, 0, 0, "new_s1"}, {1, 1, 0, 64, "new_s1w64"}, {1, 4, 0, 0, "new_s4"}});
        for (const Config& cf : configs) {
          const int decode = cf.decode, pieces = cf.pieces;
          qlinear_detail::set_bits_decode(decode);
          qlinear_detail::set_bits_stream_pieces(pieces);
          std::vector<Weight> ws;
          for (int c = 0; c < copies; ++c) ws.push_back(make(d, 17 + c));
          qlinear_detail::set_bits_stream_pieces(0);
          qlinear_detail::set_bits_decode(-1);
          if (bits != 4 && (ws[0].w.narrow_tiled == 0 || ws[0].w.narrow_inplace != (decode == 1))) {
            std::printf("unexpected layout for %dx%d\n", sh[0], sh[1]);
            return 1;
          }
          const bool is_default = pieces == 0 && cf.depth == 0 && cf.budget == 0;
          qlinear_detail::set_bits_stream_depth(cf.depth);
          qlinear_detail::set_bits_stream_warps(cf.budget);
          if (bits == 4) qlinear_detail::set_int4_lop3(decode);
          for (const int n : {1, 2, 8}) {
            if (!is_default && n == 8) continue;
            const float ms = time_ms(
                [&](int i) { qlinear_matmul(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 40);
            row(sh, bits, asym, n, cf.name, ms, bytes);
            if (n == 1 && is_default && !asym) layer[bits][decode] += layer_weight[si] * ms * 1e3;
          }
          qlinear_detail::set_bits_stream_depth(0);
          qlinear_detail::set_bits_stream_warps(0);
          qlinear_detail::set_int4_lop3(-1);
          CK(cudaGetLastError());
          for (auto& w : ws) CK(cudaFree(w.mem));
        }
      }
  }
  std::printf("\nLlama-3-8B layer at n = 1, us: 4-bit old %.2f new %.2f", layer[4][0], layer[4][1]);
  for (const int bits : widths)
    std::printf("; %d-bit old %.2f new %.2f", bits, layer[bits][0], layer[bits][1]);
  std::printf("\n");
  CK(cudaDeviceSynchronize());
  return 0;
}

int main(int argc, char** argv) {
  const double copy_gbs = print_device_and_copy_gbs();

  const int shapes[][2] = {{4096, 4096}, {6144, 4096}, {14336, 4096}, {4096, 14336}, {28672, 4096}};
  __half *x, *y, *deq;
  CK(cudaMalloc(&x, 16 * 14336 * 2));
  CK(cudaMalloc(&y, 16 * 28672 * 2));
  CK(cudaMalloc(&deq, size_t(28672) * 4096 * 2));
  fill_halves<<<1024, 256>>>(x, 16 * 14336, -1.0f, 2.0f, 5);
  std::printf(
      "\nqlinear_matmul, g128 f16 scales; GB/s = (weight + scales + x + y bytes, unpadded) / time\n"
      "%-12s %4s %-5s %2s %-7s %9s %8s %7s\n",
      "shape", "bits", "sym", "n", "kernel", "us", "GB/s", "%copy");
  if (argc > 1 && std::string(argv[1]) == "tune") return tune(x, y, false);
  if (argc > 1 && std::string(argv[1]) == "verify") return tune(x, y, true);
  auto row = [&](const int* sh, int bits, bool asym, int n, const char* kernel, float ms,
                 double bytes) {
    const double moved = bytes + 2.0 * n * (sh[0] + sh[1]);
    std::printf("%5dx%-6d %4d %-5s %2d %-7s %9.2f %8.0f %6.1f%%\n", sh[0], sh[1], bits,
                asym ? "asym" : "sym", n, kernel, ms * 1e3, moved / ms / 1e6,
                100.0 * moved / ms / 1e6 / copy_gbs);
  };
  if (argc > 1 && std::string(argv[1]) == "decode") {
    std::vector<int> widths;
    for (int i = 2; i < argc; ++i) {
      const int b = std::atoi(argv[i]);
      if (b != 2 && b != 3 && b != 5 && b != 6) {
        std::printf("decode: widths are 2, 3, 5, 6\n");
        return 1;
      }
      widths.push_back(b);
    }
    if (widths.empty()) widths = {5, 6};
    return decode_ab(x, y, row, widths);
  }
  for (const auto& sh : shapes) {
    for (const int bits : {2, 3, 4, 5, 6}) {
      for (const bool asym : {false, true}) {
        if (asym && sh[0] * size_t(sh[1]) != size_t(4096) * 4096) continue;  // one asym shape
        const QWeightDesc d = g128_desc(sh, bits, asym);
        const double bytes = weight_bytes(d);
        const int copies = rotation_copies(d);
        // layout 0: host layout (old kernel, rows per warp auto); -1: tiled with the default
        // pieces per width; 1, 2, 4 (8 at 2 bits): tiled with that many blocks per piece (default
        // warp budget).
        for (const int layout : bits == 4   ? std::vector<int>{-1}
                                : bits == 2 ? std::vector<int>{0, -1, 1, 2, 4, 8}
                                            : std::vector<int>{0, -1, 1, 2, 4}) {
          qlinear_detail::set_bits_stream(layout == 0 ? 0 : 1);
          qlinear_detail::set_bits_stream_pieces(layout < 0 ? 0 : layout);
          std::vector<Weight> ws;
          for (int c = 0; c < copies; ++c) ws.push_back(make(d, 17 + c));
          if (bits != 4 && (ws[0].w.narrow_tiled == 0) != (layout == 0)) {
            std::printf("unexpected layout for %dx%d\n", sh[0], sh[1]);
            return 1;
          }
          for (const int n : {1, 2, 8}) {
            const float ms = time_ms(
                [&](int i) { qlinear_matmul(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 40);
            char name[16];
            if (bits == 4)
              std::snprintf(name, sizeof(name), "4bit");
            else if (layout == 0)
              std::snprintf(name, sizeof(name), "old");
            else if (layout < 0)
              std::snprintf(name, sizeof(name), "new_s%d", ws[0].w.narrow_tiled);
            else
              std::snprintf(name, sizeof(name), "s%d", layout);
            row(sh, bits, asym, n, name, ms, bytes);
          }
          if (!asym && layout <= 0) {
            const float dq_ms =
                time_ms([&](int i) { qlinear_dequantize(ws[i % copies].w, deq, nullptr); }, 10);
            std::printf("%5dx%-6d %4d dequant %s: %.1f us\n", sh[0], sh[1], bits,
                        layout == 0 ? "old" : "new", dq_ms * 1e3);
          }
          CK(cudaGetLastError());
          for (auto& w : ws) CK(cudaFree(w.mem));
        }
        qlinear_detail::set_bits_stream_pieces(0);
        qlinear_detail::set_bits_stream(-1);
      }
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
