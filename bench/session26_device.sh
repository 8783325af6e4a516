#!/usr/bin/env bash
# Session 26 device runs (carry .device/lead = gyre_tests.xz, .device/lead2 = gyre.xz, .device/lead3 =
# gyre_old.xz where an A/B needs it, .device/lead4 = gyre_tests_bug.xz, .device/libs,
# .device/shared; see bench/device_binaries.sh, which has bench_line).
#   bench/session26_device.sh busy     session 25's: CudaGemv4.MatchesFloat64WhileDramIsBusy with the
#       staged-scale race put back (gyre_tests_bug), three times, then the fixed binary
#   bench/session26_device.sh diag     where the 4-bit decode step's time goes: gyre bench with
#       GYRE_DIAG_SKIP = (none), attn, attnwork, onekey, head, attn+head, headnorm (core/diag.h),
#       ROUNDS rounds; each line shows the fed decode (the headline), step by step, and the stepwise
#       record replayed back to back (graph only: no host work between steps)
#   bench/session26_device.sh knobs    ring and attention settings against the default (NONE=0),
#       ROUNDS rounds (GYRE_CUDA_GEMV_DEEP and GYRE_CUDA_GEMV_SMEM=8 were a ring of 8 slots, for
#       o_proj only or for all, tried in calls 1-2 and removed: the lines fall back to the default)
#   bench/session26_device.sh final    fed decode against step by step (GYRE_CUDA_FED=0), ROUNDS
#       rounds; -p 2048 --long 8192; 2/3/5/6 bits. In call 3 it also timed fed records of 4 steps
#       (GYRE_FED_UNROLL=4) and the 8-bit GEMV's early loads (GYRE_CUDA_GEMV8_EARLY=1), both
#       removed afterwards: those lines now repeat the default
#   bench/session26_device.sh tests    session 25's list of CUDA tests (FILTER overrides)
#   bench/session26_device.sh table    the final table (bench/device_table.sh)
set -u
for mode in "$@"; do
  case "$mode" in
  busy | tests | table)
    bash bench/session25_device.sh "$mode"
    ;;
  diag)
    . bench/device_binaries.sh >/dev/null
    for r in $(seq 1 "${ROUNDS:-2}"); do
      for skip in "" attn attnwork onekey head attn,head headnorm; do
        GYRE_DIAG_SKIP=$skip bench_line "round $r skip=${skip:-none}" $B/gyre --synthetic llama3-8b \
          --bits 4 -p 512 -n 128 --long 0
      done
    done
    ;;
  knobs)  # ring and attention settings against the default, ROUNDS rounds interleaved
    . bench/device_binaries.sh >/dev/null
    for r in $(seq 1 "${ROUNDS:-1}"); do
      for kv in NONE=0 GYRE_CUDA_GEMV_DEEP=1 "GYRE_CUDA_GEMV_DEEP=1 GYRE_CUDA_STREAM_BUDGET=48" \
        GYRE_CUDA_GEMV_SMEM=8 GYRE_CUDA_GEMV_SMEM=2 GYRE_CUDA_ATTN_SINGLE=0 GYRE_CUDA_ATTN_PREFETCH=0; do
        # shellcheck disable=SC2086 # kv: one or more assignments
        (export $kv; bench_line "round $r $kv" $B/gyre --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0)
      done
    done
    ;;
  final)  # call 3: fed records of 4 steps against 1 and against step by step, the 8-bit GEMV's
    # early loads, 8k context, the narrow widths (then `table`)
    . bench/device_binaries.sh >/dev/null
    for r in $(seq 1 "${ROUNDS:-3}"); do
      for kv in NONE=0 GYRE_FED_UNROLL=4 GYRE_CUDA_FED=0; do
        (export $kv; bench_line "round $r $kv" $B/gyre --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0)
      done
    done
    for r in 1 2; do
      bench_line "8-bit r$r" $B/gyre --synthetic llama3-8b --bits 8 -p 512 -n 128 --long 0
      GYRE_CUDA_GEMV8_EARLY=1 bench_line "8-bit r$r GEMV8_EARLY=1" $B/gyre --synthetic llama3-8b --bits 8 -p 512 -n 128 --long 0
    done
    for r in 1 2; do
      bench_line "long r$r" $B/gyre --synthetic llama3-8b --bits 4 -p 2048 -n 128 --long 8192
      GYRE_CUDA_FED=0 bench_line "long r$r FED=0" $B/gyre --synthetic llama3-8b --bits 4 -p 2048 -n 128 --long 8192
    done
    for b in 2 3 5 6; do bench_line "bits $b" $B/gyre --synthetic llama3-8b --bits $b -p 512 -n 128 --long 0; done
    ;;
  esac
done
