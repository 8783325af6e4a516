#!/bin/bash
# Quality runs of docs/quantization.md on the device: a model converted on the GPU with
# combinations of the quality options, each scored by `gyre kld --score-all` against the
# reference. Calibration = first 200,000 bytes of wikitext2-test.txt, evaluation = the bytes from
# byte 700,000. Usage (device): bench/ref25_quality.sh GYRE_BIN [SET], .device/shared/fixtures/text
# carried; writes $OUT/quality.log.
#   SET ref25 (default): gyre-ref-25M from .device/ref25/ref25.tar.xz, 14,000 evaluation bytes
#     (3,347 tokens), --head-bits 0, scored in fp32 on the CPU.
#   SET paired: gyre-ref-25M as ref25, GPTQ 4-bit, --hadamard 4.0, --trellis 4.0 and 3.0.
#   SET trellis: gyre-ref-25M as ref25, the trellis-coded rows (session 8) and their baselines.
#   SET smoltrellis: SmolLM2 as smol, the trellis rows.
#   SET smol: SmolLM2-135M-Instruct from /tmp/smol.gguf (the reference: its Q4_1 GGUF), 100,000
#     evaluation bytes (23,501 tokens), default head, scored on the GPU.
#   SET floor: gyre-ref-25M as ref25 (from /tmp/gyre-ref-25M when an earlier call left it
#     there), each model also scored on the GPU against the reference on the CPU (`gyre kld
#     --device cuda --ref-device cpu`): the unquantized model itself (what FP16 inference alone
#     costs top-1), trellis 6.0, scalar 6.0 and 8.0 (session 18).
#   SET mix68: gyre-ref-25M as ref25 at 8.0 bpw with and without the 6/8-bit mix candidates
#     (session 22; the same measurement, those entries deleted), 6.0, GPTQ 8-bit g128.
#   SET smolgrid: SmolLM2 as smol, layers on their grid stored exactly (the default since session
#     14) against --no-exact-grid at 4.0 / 4.25 / 6.0 bpw, 8.0, and the FP16 twin.
# Target correction is on by default since session 7; the ref25 log of session 7
# (bench/session7_ref25_quality.log) was taken before, when it was opt-in.
G=$1
SET=${2:-ref25}
LOG=${OUT:-/tmp}/quality.log
T=.device/shared/fixtures/text/wikitext2-test.txt
[ -f "$T" ] || T=.device/text/fixtures/text/wikitext2-test.txt
head -c 200000 "$T" > /tmp/calib.txt
if [ "$SET" = smol ] || [ "$SET" = smoltrellis ] || [ "$SET" = smolgrid ]; then
  M=/tmp/smol.gguf; EVAL=100000; EXTRA=(); KLD=(--device cuda)
else
  [ -d /tmp/gyre-ref-25M ] || tar -C /tmp -xJf .device/ref25/ref25.tar.xz
  M=/tmp/gyre-ref-25M; EVAL=14000; EXTRA=(--head-bits 0); KLD=(--device cpu)
fi
tail -c +700001 "$T" | head -c $EVAL > /tmp/eval.txt
conv() {  # name, then convert options
  local name=$1; shift
  local t0=$(date +%s.%N)
  $G convert -m $M -o /tmp/q/$name --calibration /tmp/calib.txt "${EXTRA[@]}" "$@" > /tmp/conv_$name.log 2>&1
  local rc=$? t1=$(date +%s.%N)
  echo "== $name rc=$rc convert $(awk "BEGIN{print $t1 - $t0}") s: $*" >> "$LOG"
  [ $rc = 0 ] || { tail -3 /tmp/conv_$name.log >> "$LOG"; return; }
  grep -E "bits per weight|bpw" /tmp/conv_$name.log | tail -1 >> "$LOG"
  $G kld -m /tmp/q/$name --ref $M -f /tmp/eval.txt --score-all --json "${KLD[@]}" \
    > /tmp/kld_$name.json 2>/dev/null
  python3 -c "import json,sys; d=json.load(open('/tmp/kld_$name.json')); print({k: v for k, v in d.items() if k not in ('kld_percentiles', 'model', 'ref')})" >> "$LOG" 2>&1 || tail -c 400 /tmp/kld_$name.json >> "$LOG"
}
# name, model: scored on the GPU against the reference on the CPU.
on_gpu() {
  $G kld -m "$2" --ref $M -f /tmp/eval.txt --score-all --json --device cuda --ref-device cpu \
    > /tmp/kldg_$1.json 2>/tmp/kldg_$1.err
  echo "== $1 on the GPU, the reference on the CPU" >> "$LOG"
  python3 -c "import json,sys; d=json.load(open('/tmp/kldg_$1.json')); print({k: v for k, v in d.items() if k not in ('kld_percentiles', 'model', 'ref')})" >> "$LOG" 2>&1 || tail -c 400 /tmp/kldg_$1.err >> "$LOG"
}
if [ "$SET" = floor ]; then
  on_gpu original $M
  conv t60 --bpw 6.0 --trellis
  on_gpu t60 /tmp/q/t60
  conv g60 --bpw 6.0
  on_gpu g60 /tmp/q/g60
  conv g80 --bpw 8.0 --measurement /tmp/q/g60/measurement.json
  on_gpu g80 /tmp/q/g80
elif [ "$SET" = mix68 ]; then  # session 22: 6-bit g128 with most groups at 8 bits, at 8.0 bpw
  conv g80 --bpw 8.0
  python3 - /tmp/q/g80/measurement.json /tmp/q/no68.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for layer in m["layers"]:
    layer["errors"] = [e for e in layer["errors"] if e.get("mix_bits", 0) != 8]
json.dump(m, open(sys.argv[2], "w"))
PY
  conv g80_no68 --bpw 8.0 --measurement /tmp/q/no68.json
  conv g60 --bpw 6.0 --measurement /tmp/q/g80/measurement.json
  conv gptq8 --uniform 8:128
elif [ "$SET" = paired ]; then  # session 9: the paired perplexity ratio of the 4.0 rows
  conv gptq4_noclip --uniform 4:128 --no-clip-search --no-target-correction
  conv g40_tc_h --bpw 4.0 --hadamard
  conv t40 --bpw 4.0 --trellis
  conv t30 --bpw 3.0 --trellis --measurement /tmp/q/t40/measurement.json
elif [ "$SET" = trellis ]; then
  conv gptq4_noclip --uniform 4:128 --no-clip-search --no-target-correction
  conv g40_tc_h --bpw 4.0 --hadamard
  conv t40 --bpw 4.0 --trellis
  conv t40_r128 --bpw 4.0 --trellis --rows 128
  conv t30 --bpw 3.0 --trellis --measurement /tmp/q/t40/measurement.json
  conv t60 --bpw 6.0 --trellis --measurement /tmp/q/t40/measurement.json
  conv t40_notc --bpw 4.0 --trellis --no-target-correction --measurement /tmp/q/t40/measurement.json
elif [ "$SET" = smoltrellis ]; then
  conv g40_h --bpw 4.0 --hadamard
  conv t40 --bpw 4.0 --trellis
  conv t425 --bpw 4.25 --trellis --measurement /tmp/q/t40/measurement.json
  conv t60 --bpw 6.0 --trellis --measurement /tmp/q/t40/measurement.json
elif [ "$SET" = smolgrid ]; then
  conv twin --dequantize-only
  conv g40 --bpw 4.0
  M40=/tmp/q/g40/measurement.json
  conv g40_noexact --bpw 4.0 --no-exact-grid --measurement $M40
  conv g60 --bpw 6.0 --measurement $M40
  conv g60_noexact --bpw 6.0 --no-exact-grid --measurement $M40
  conv g80 --bpw 8.0 --measurement $M40
  conv g425 --bpw 4.25 --measurement $M40
  conv g425_noexact --bpw 4.25 --no-exact-grid --measurement $M40
elif [ "$SET" = smol ]; then
  conv gptq4 --uniform 4:64 --no-target-correction
  conv gptq4_tc --uniform 4:64
  conv g40 --bpw 4.0
  conv g40_h --bpw 4.0 --hadamard
  conv g425 --bpw 4.25 --measurement /tmp/q/g40/measurement.json
  conv g60 --bpw 6.0 --measurement /tmp/q/g40/measurement.json
else
  conv gptq4_noclip --uniform 4:128 --no-clip-search --no-target-correction
  conv g40_plain --bpw 4.0 --no-target-correction
  conv g40_tc --bpw 4.0 --target-correction
  conv g40_tc_h --bpw 4.0 --target-correction --hadamard
  conv g40_tc_h_r128 --bpw 4.0 --target-correction --hadamard --rows 128
  conv g40_tc_r128 --bpw 4.0 --target-correction --rows 128
  conv g30_tc_h_r128 --bpw 3.0 --target-correction --hadamard --rows 128
  conv g60_tc_h --bpw 6.0 --target-correction --hadamard
fi
cat "$LOG"
