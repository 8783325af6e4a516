#!/usr/bin/env bash
# Session 15 device runs (carry .device/lead = gyre_tests.xz and .device/lead2 = gyre.xz, both
# stripped, and .device/libs; .device/shared for the fixtures). One call can run several modes:
#   bench/session15_device.sh tests [FILTER]     the CUDA tests
#   bench/session15_device.sh ab                 decode of synthetic llama3-8b @128 and @8k, ROUNDS
#       rounds of the arms interleaved: by default without and with act-order weights as a real
#       act-order model loads (GYRE_SYNTHETIC_ACT_ORDER=2; the fused-MLP runs of the log used
#       GYRE_CUDA_FUSED_MLP of the tag exp/fused-mlp); ARMS overrides the arms (VAR=VAL[,VAR=VAL]
#       or "-"), SHAPE the model, BITS the width
#   bench/session15_device.sh serve              serving at CONC (1,8,32) requests, BITS (4), ARMS
#   bench/session15_device.sh table             the final table (bench/device_table.sh)
set -u
. bench/device_binaries.sh
for mode in "$@"; do
  case "$mode" in
  tests)
    device_tests "${FILTER:-*Cuda*:*Trellis*:*Hadamard*:*QuantMix*:SamplingOp*:*Attention*:*Paged*:Engine*}" 400
    ;;
  ab)
    for r in $(seq 1 "${ROUNDS:-2}"); do
      for arm in ${ARMS:-- GYRE_SYNTHETIC_ACT_ORDER=2}; do
        envs=()
        [ "$arm" != - ] && envs=(${arm//,/ })
        env "${envs[@]}" timeout 120 $B/gyre bench --synthetic "${SHAPE:-llama3-8b}" \
          --bits "${BITS:-4}" -p 512 -n 128 --long 8192 --json >"$O/ab.json" 2>"$O/ab.err"
        python3 -c "import json; d=json.load(open('$O/ab.json')); print('round $r [$arm] ${SHAPE:-llama3-8b} ${BITS:-4}-bit: decode@128 %.1f (%.1f%%) @8k %.1f (%.1f%%) prefill %.0f' % (d['decode_short_tok_s'], 100*d['decode_short_roofline'], d['decode_long_tok_s'], 100*d['decode_long_roofline'], d['prefill_tok_s']))" 2>&1 || tail -5 "$O/ab.err"
      done
    done
    ;;
  serve)
    for arm in ${ARMS:-- GYRE_SYNTHETIC_ACT_ORDER=2}; do
      echo "== serving [$arm]"
      envs=()
      [ "$arm" != - ] && envs=(${arm//,/ })
      env "${envs[@]}" timeout 200 $B/gyre bench --synthetic llama3-8b --bits "${BITS:-4}" -n 128 \
        -p 16 --concurrency "${CONC:-1,8,32}" 2>&1 | tail -"${TAIL:-6}"
    done
    ;;
  table)
    . bench/device_table.sh
    ;;
  esac
done
