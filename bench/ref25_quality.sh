#!/bin/bash
# gyre-ref-25M converted on the GPU with combinations of the quality options, each scored by
# `gyre kld --score-all` (fp32, CPU) against the original. Protocol of docs/quantization.md:
# calibration = first 200,000 bytes of wikitext2-test.txt, evaluation = the 14,000 bytes from
# byte 700,000 (3,347 tokens), --head-bits 0. Target correction is on by default since session 7;
# the session-7 log (bench/session7_ref25_quality.log) was taken before, when it was opt-in.
# Usage (device): bench/ref25_quality.sh GYRE_BIN, with .device/ref25/ref25.tar.xz and
# .device/shared/fixtures/text carried; writes $OUT/quality.log.
G=$1
LOG=${OUT:-/tmp}/quality.log
tar -C /tmp -xJf .device/ref25/ref25.tar.xz
T=.device/shared/fixtures/text/wikitext2-test.txt
head -c 200000 "$T" > /tmp/calib.txt
tail -c +700001 "$T" | head -c 14000 > /tmp/eval.txt
M=/tmp/gyre-ref-25M
conv() {  # name, then convert options
  local name=$1; shift
  local t0=$(date +%s.%N)
  $G convert -m $M -o /tmp/q/$name --calibration /tmp/calib.txt --head-bits 0 "$@" > /tmp/conv_$name.log 2>&1
  local rc=$? t1=$(date +%s.%N)
  echo "== $name rc=$rc convert $(awk "BEGIN{print $t1 - $t0}") s: $*" >> "$LOG"
  [ $rc = 0 ] || { tail -3 /tmp/conv_$name.log >> "$LOG"; return; }
  grep -E "bits per weight|bpw" /tmp/conv_$name.log | tail -1 >> "$LOG"
  $G kld -m /tmp/q/$name --ref $M -f /tmp/eval.txt --score-all --json --device cpu \
    > /tmp/kld_$name.json 2>/dev/null
  python3 -c "import json,sys; d=json.load(open('/tmp/kld_$name.json')); print({k: v for k, v in d.items() if k not in ('kld_percentiles', 'model', 'ref')})" >> "$LOG" 2>&1 || tail -c 400 /tmp/kld_$name.json >> "$LOG"
}
conv gptq4_noclip --uniform 4:128 --no-clip-search --no-target-correction
conv g40_plain --bpw 4.0 --no-target-correction
conv g40_tc --bpw 4.0 --target-correction
conv g40_tc_h --bpw 4.0 --target-correction --hadamard
conv g40_tc_h_r128 --bpw 4.0 --target-correction --hadamard --rows 128
conv g40_tc_r128 --bpw 4.0 --target-correction --rows 128
conv g30_tc_h_r128 --bpw 3.0 --target-correction --hadamard --rows 128
conv g60_tc_h --bpw 6.0 --target-correction --hadamard
cat "$LOG"
