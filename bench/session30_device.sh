#!/usr/bin/env bash
# Session 30 device runs (the carry of bench/prepare_device.sh: .device/lead, .device/libs,
# .device/shared).
#   bench/session30_device.sh first   (run on the binaries of dace649 plus an opt-in attention
#       change, GYRE_CUDA_ATTN_NEWROW, since removed) the kernels' and attention tests with the
#       switches on, then decode of the Llama-3-8B shape: 4-bit as then / undecoded fragments
#       (modes 1, 2) / newrow, 8-bit host / tiled / tiled undecoded, 6-bit / undecoded
#   bench/session30_device.sh tests   every GPU test (names with Cuda, FusedWeights, FedDecode)
#       with today's defaults (tiled 8-bit on), then one decode line each at 4 and 8 bits
#   bench/session30_device.sh sweep   decode at several warp budgets: 2/3/5/8 bits
#       (GYRE_CUDA_BITS_WARPS: WARPS), 4 bits (GYRE_CUDA_STREAM_BUDGET: BUDGETS4)
#   bench/session30_device.sh pieces  2/3/5-bit decode at other blocks per piece
#       (GYRE_CUDA_BITS_PIECES, written after the last call; not yet run)
#   bench/session30_device.sh ncu     ncu of four decode GEMVs (BITS "4 2") with stall reasons
#   bench/session30_device.sh ab      ROUNDS (2) interleaved rounds of decode: 4-bit, 8-bit
#       tiled and host layout, 6-bit
set -u
args=("$@")
set --
. bench/session29_device.sh  # (no mode: defines dec, B, O; unpacks the carry)
for mode in "${args[@]}"; do
  case "$mode" in
  tests)
    device_tests "${FILTER:-*Cuda*:FusedWeights*:FedDecode*}" 420
    grep -cE "^\[       OK \]" "$O/tests.log"
    dec "4-bit" 4 X=0
    dec "8-bit" 8 X=0
    ;;
  sweep)  # warp budgets per SM of the narrow widths' and tiled 8-bit launches (GYRE_CUDA_BITS_WARPS;
    # 0: the plan's own: 64 at n <= 2 below 6 bits, else 32) and the 4-bit one (STREAM_BUDGET)
    for bits in ${WIDTHS:-2 3 5 8}; do
      for w in ${WARPS:-0 16 48 64 96}; do
        dec "$bits-bit warps $w" "$bits" GYRE_CUDA_BITS_WARPS="$w"
      done
    done
    for b in ${BUDGETS4:-0 24 48}; do
      dec "4-bit budget $b" 4 GYRE_CUDA_STREAM_BUDGET="$b"
    done
    ;;
  pieces)  # blocks per 16-row piece of the narrow widths (GYRE_CUDA_BITS_PIECES; default 4 at 2
    # bits, 2 at 3, 1 at 5): the 2-bit kernel at S = 4 has 94 registers, 2 blocks of 8 warps per SM
    # and split-K 1 (ncu, session 30); fewer blocks per piece means fewer registers, more warps
    for r in $(seq 1 "${ROUNDS:-2}"); do
      dec "r$r 2-bit (S 4)" 2 X=0
      dec "r$r 2-bit S 2" 2 GYRE_CUDA_BITS_PIECES=2
      dec "r$r 2-bit S 1" 2 GYRE_CUDA_BITS_PIECES=1
      dec "r$r 2-bit S 2 smem ring" 2 GYRE_CUDA_BITS_PIECES=2 GYRE_CUDA_BITS_SMEM=4
      dec "r$r 2-bit S 1 smem ring" 2 GYRE_CUDA_BITS_PIECES=1 GYRE_CUDA_BITS_SMEM=4
      dec "r$r 3-bit (S 2)" 3 X=0
      dec "r$r 3-bit S 1" 3 GYRE_CUDA_BITS_PIECES=1
      dec "r$r 5-bit (S 1)" 5 X=0
      dec "r$r 5-bit S 2" 5 GYRE_CUDA_BITS_PIECES=2
    done
    ;;
  ncu)  # stall reasons of the decode GEMVs (BITS, default "4 2"): 4 launches of a decode step
    # (q|k|v, o, gate|up, down) with warp states and source counters, into $O/ncu_BITS.txt
    ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for bits in ${BITS:-4 2}; do
      timeout 150 "$ncu_bin" -k regex:${KREGEX:-gemv_stream} --launch-skip 200 --launch-count 4 \
        --clock-control ${CLOCKS:-base} \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section SourceCounters --section LaunchStats --section Occupancy \
        $B/gyre bench --synthetic llama3-8b --bits "$bits" -p 16 -n 8 --long 0 >"$O/ncu_$bits.txt" 2>&1
      echo "ncu $bits-bit rc=$?"
      grep -E "^  void|Duration|DRAM Throughput|Issued Warp|Eligible Warps|Achieved Occupancy" \
        "$O/ncu_$bits.txt" | head -40
    done
    ;;
  ab)
    for r in $(seq 1 "${ROUNDS:-2}"); do
      dec "r$r 4-bit" 4 X=0
      dec "r$r 8-bit tiled" 8 X=0
      dec "r$r 8-bit host" 8 GYRE_CUDA_BITS8_STREAM=0
      dec "r$r 6-bit" 6 X=0
    done
    ;;
  esac
done
