#!/usr/bin/env bash
# Session 24 device runs (carry .device/lead = gyre_tests.xz, .device/lead2 = gyre.xz, .device/libs,
# .device/shared; see bench/device_binaries.sh).
#   bench/session24_device.sh ceiling   build and run bench/stream_ceiling.cu (the 4-bit GEMV
#       chain's ceilings: loads alone, the math's parts, staged scales)
#   bench/session24_device.sh ceilncu   ncu (full set) of the model's ring loop with and without
#       the math at its gate|up launches (the first step of bench/NOTES.md "Session 24" Next; not run yet)
#   bench/session24_device.sh tests     the 4-bit GEMV, fused-weight and forward tests (FILTER
#       overrides), then the narrow widths' (FILTER2)
#   bench/session24_device.sh scales    decode of the Llama-3-8B shape at 4 bits (ROUNDS rounds):
#       the ring's per-piece scale words (GYRE_CUDA_STREAM_SCALES=ring), staged scales (the
#       default), staged with a ring of 2 slots; then 6 bits, ring against staged
set -u
for mode in "$@"; do
  case "$mode" in
  ceiling)
    nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/stream_ceiling.cu \
      -o /tmp/stream_ceiling && /tmp/stream_ceiling
    ;;
  ceilncu)
    nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90a,code=sm_90a bench/stream_ceiling.cu \
      -o /tmp/stream_ceiling &&
      ncu --set full --clock-control none -k regex:cpa_kernel /tmp/stream_ceiling ncu \
        >"${OUT:-/tmp}/ncu_ceiling.txt" 2>&1
    grep -E "cpa_kernel|Duration|DRAM Throughput|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued" \
      "${OUT:-/tmp}/ncu_ceiling.txt" | head -60
    ;;
  tests)
    . bench/device_binaries.sh
    device_tests "${FILTER:-CudaGemv4*:CudaFused*:CudaForward*:CudaStories*:CudaQlinear*}" 75
    cp "$O/tests.log" "$O/tests1.log"
    device_tests "${FILTER2:-CudaQbits*:QMixedCuda*}" 60
    ;;
  scales)
    . bench/device_binaries.sh >/dev/null
    for r in $(seq 1 "${ROUNDS:-2}"); do
      for arm in GYRE_CUDA_STREAM_SCALES=ring - GYRE_CUDA_GEMV_SMEM=2; do
        envs=()
        [ "$arm" != - ] && envs=(${arm//,/ })
        env "${envs[@]}" timeout 40 $B/gyre bench --synthetic llama3-8b --bits 4 -p 512 -n 128 \
          --long 0 --json >"$O/ab.json" 2>"$O/ab.err"
        python3 -c "import json; d=json.load(open('$O/ab.json')); print('round $r [$arm] 4-bit: decode@128 %.1f (%.1f%%) prefill %.0f' % (d['decode_short_tok_s'], 100*d['decode_short_roofline'], d['prefill_tok_s']))" 2>&1 || tail -3 "$O/ab.err"
      done
    done
    for arm in GYRE_CUDA_STREAM_SCALES=ring -; do
      envs=()
      [ "$arm" != - ] && envs=("$arm")
      env "${envs[@]}" timeout 40 $B/gyre bench --synthetic llama3-8b --bits 6 -p 512 -n 128 \
        --long 0 --json >"$O/ab.json" 2>"$O/ab.err"
      python3 -c "import json; d=json.load(open('$O/ab.json')); print('[$arm] 6-bit: decode@128 %.1f (%.1f%%)' % (d['decode_short_tok_s'], 100*d['decode_short_roofline']))" 2>&1 || tail -3 "$O/ab.err"
    done
    ;;
  esac
done
