#!/usr/bin/env bash
# Session 12 device runs (carry .device/lead2 = stripped gyre as .xz, .device/libs; the tests
# call carries .device/lead = gyre_tests.xz; unpacked binaries stay in .device/bin while warm).
#   bench/session12_device.sh ab [ROUNDS] BITS ARM...  gyre bench --synthetic $SHAPE (llama3-8b)
#       at BITS per arm, arms interleaved, ROUNDS rounds (default 2); ARM "-" or VAR=VAL[,..],
#       e.g. GYRE_CUDA_GEMV_SMEM=0 or GYRE_DIAG_SKIP=attn (bench/NOTES.md, session 12)
#   bench/session12_device.sh serve [VAR=VAL ...]  4-bit serving at 1/8/32 requests
#   bench/session12_device.sh tests [FILTER]       the CUDA tests
#   bench/session12_device.sh table                the final table (FP16, 8/6/4 bits, mistral, serving)
set -u
. bench/device_binaries.sh
case "${1:-tests}" in
tests)
  device_tests "${2:-*Cuda*:*Trellis*:*Hadamard*:*QuantMix*}" 400
  ;;
ab)  # ab [ROUNDS] BITS ARM...: ARM = "-" or VAR=VAL[,VAR=VAL...] (environment of that arm)
  shift
  rounds=2
  [[ "${1:-}" =~ ^[0-9]+$ && "${2:-}" =~ ^[0-9]+$ ]] && { rounds=$1; shift; }
  bits=$1
  shift
  shape=${SHAPE:-llama3-8b}
  for r in $(seq 1 "$rounds"); do
    for arm in "$@"; do
      envs=()
      [ "$arm" != - ] && IFS=, read -r -a envs <<<"$arm"
      env "${envs[@]}" timeout 100 $B/gyre bench --synthetic "$shape" --bits "$bits" \
        -p "${PROMPT:-512}" -n 128 --long 8192 --json >"$O/ab.json" 2>"$O/ab.err" ||
        { echo "arm $arm failed: $(tail -3 "$O/ab.err")"; continue; }
      python3 -c "import json; d=json.load(open('$O/ab.json')); print('$shape bits $bits [$arm] run $r: decode@128 %.1f tok/s (%.1f%%) graph-only %.1f @8k %.1f (%.1f%%) prefill %.0f bw %.0f' % (d['decode_short_tok_s'], 100*d['decode_short_roofline'], d.get('decode_short_graph_only_tok_s', 0), d['decode_long_tok_s'], 100*d['decode_long_roofline'], d['prefill_tok_s'], d['bandwidth_gb_s']))" 2>&1 | tee -a "$O/ab.log"
    done
  done
  ;;
serve)  # 4-bit serving at 1/8/32 concurrent requests, with the environment in $@ (VAR=VAL ...)
  shift
  env "$@" timeout 200 $B/gyre bench --synthetic llama3-8b --bits 4 -n 128 -p 16 \
    --concurrency 1,8,32 2>&1 | tail -8
  ;;
table)  # the final table: FP16, 8/6/4 bits at -p 2048, mistral FP16, 4-bit serving
  . bench/device_table.sh
  ;;
esac
