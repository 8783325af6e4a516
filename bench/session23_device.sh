#!/usr/bin/env bash
# Session 23 device runs (carry .device/lead2 = stripped gyre as .xz, or .device/lead =
# gyre_tests.xz, and .device/libs, .device/shared; see bench/device_binaries.sh).
#   bench/session23_device.sh tests      the mixed-weight, narrow-width, 4-bit GEMV, EXL2 and
#       fused-weight tests (FILTER overrides)
#   bench/session23_device.sh mix        decode of the Llama-3-8B shape with every weight but the
#       head a two-width mix (GYRE_SYNTHETIC_MIX, as ExLlamaV2's converter sizes a layer's groups),
#       the two-part kernel on and off (GYRE_CUDA_MIXED_ONE=0), then uniform 2/3/5-bit references;
#       MIXES overrides the mixes (ARMS the arms), ROUNDS the rounds, REFBITS the uniform widths
#   bench/session23_device.sh abx        session15's ab (ARMS, ROUNDS, BITS, SHAPE) with EXTRA
#       arguments to gyre bench (e.g. EXTRA="--part-bits 5": EXL2-like fused groups)
#   bench/session23_device.sh ab|serve|table|ncu   as bench/session22_device.sh
set -u
for mode in "$@"; do
  case "$mode" in
  tests)
    . bench/device_binaries.sh
    device_tests "${FILTER:-QMixedCuda*:CudaQbits*:CudaGemv4*:CudaQlinear*:CudaExl2*:CudaFused*:CudaForward*:CudaStories*}" 400
    ;;
  mix)
    . bench/device_binaries.sh
    arms=""
    for m in ${MIXES:-4:128:0.1/3:128:0.9 5:128:0.25/4:128:0.75 3:128:0.25/2:128:0.75 6:128:0.25/5:128:0.75}; do
      arms="$arms GYRE_SYNTHETIC_MIX=$m GYRE_SYNTHETIC_MIX=$m,GYRE_CUDA_MIXED_ONE=0"
    done
    ARMS="${ARMS:-$arms}" bash bench/session23_device.sh abx
    for b in ${REFBITS-3 2 5}; do ARMS=- BITS=$b ROUNDS=1 bash bench/session23_device.sh abx; done
    ;;
  abx)
    # bench/session15_device.sh's ab with EXTRA arguments (e.g. --part-bits 5)
    . bench/device_binaries.sh >/dev/null
    for r in $(seq 1 "${ROUNDS:-1}"); do
      for arm in ${ARMS:--}; do
        envs=()
        [ "$arm" != - ] && envs=(${arm//,/ })
        env "${envs[@]}" timeout 120 $B/gyre bench --synthetic "${SHAPE:-llama3-8b}" \
          --bits "${BITS:-4}" ${EXTRA:-} -p 512 -n 128 --long 8192 --json >"$O/ab.json" 2>"$O/ab.err"
        python3 -c "import json; d=json.load(open('$O/ab.json')); print('round $r [$arm] ${EXTRA:-} ${BITS:-4}-bit: decode@128 %.1f (%.1f%%) @8k %.1f (%.1f%%) prefill %.0f' % (d['decode_short_tok_s'], 100*d['decode_short_roofline'], d['decode_long_tok_s'], 100*d['decode_long_roofline'], d['prefill_tok_s']))" 2>&1 || tail -5 "$O/ab.err"
      done
    done
    ;;
  *)
    bash bench/session22_device.sh "$mode"
    ;;
  esac
done
