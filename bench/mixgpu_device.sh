#!/usr/bin/env bash
# Session 9's device runs for the GPU GPTQ of mixes of two widths (docs/quantization.md, "Mixes
# of two widths"), in two calls on one warm machine (gyre + gyre_tests and gyre-ref-25M do not
# fit one 64 MiB transfer with the repo; the second call must come within the machine's 30 s
# warm window, or it finds no binary and stops):
#   bench/mixgpu_device.sh tests    carries .device/lead/{gyre,gyre_tests}.xz and the shared
#                                   libraries the device lacks in .device/libs or .device/lead
#                                   (unpacked into .device/bin, which stays for the next call):
#                                   the quantizer's CUDA tests, then the conversion time of
#                                   `convert --synthetic llama3-8b --synthetic-layers 4
#                                   --head-bits 0 --bpw 4.0` with --no-mixes and without
#   bench/mixgpu_device.sh quality  carries .device/ref25/ref25.tar.xz and .device/text/{calib,
#                                   eval}.txt (the calibration and evaluation bytes of
#                                   bench/ref25_quality.sh; made from .device/shared's wikitext2
#                                   when absent): gyre-ref-25M at 4.0 and 3.0 bpw from one GPU
#                                   measurement, with and without its mixes
# Logs land in $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin "$OUT"
if [ -d .device/lead ]; then
  for f in .device/lead/*.xz; do
    b=.device/bin/$(basename "$f" .xz)
    xz -dc "$f" >"$b" 2>/dev/null ||
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$b"
    chmod +x "$b"
  done
  cp .device/libs/* .device/lead/*.so* .device/bin/ 2>/dev/null
fi
[ -x .device/bin/gyre ] || { echo "no .device/bin/gyre (a fresh machine?)"; exit 3; }
export LD_LIBRARY_PATH=$PWD/.device/bin:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SUMMARY=$OUT/summary.txt
if [ "${1:-tests}" = tests ]; then
  .device/bin/gyre_tests --gtest_filter='QuantCuda*:*/QuantCuda*:*/QuantCudaMix*:QuantTargetCuda*:*/QuantTargetCuda*:QuantTrellisCuda.UnitQuantizer*' \
    >"$OUT/tests.log" 2>&1
  echo "tests rc=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | tr '\n' ' ')" >>"$SUMMARY"
  grep -E '^\[  FAILED|Failure|Expected|Which is|actual' "$OUT/tests.log" | head -40 >>"$SUMMARY"
  for mode in no_mixes mixes; do
    flag=()
    [ $mode = no_mixes ] && flag=(--no-mixes)
    t0=$(date +%s.%N)
    .device/bin/gyre convert --synthetic llama3-8b --synthetic-layers 4 --head-bits 0 --bpw 4.0 \
      ${flag[@]+"${flag[@]}"} -o /tmp/syn_$mode >"$OUT/syn_$mode.log" 2>&1
    rc=$? t1=$(date +%s.%N)
    echo "synthetic 8B x4 blocks $mode rc=$rc wall $(awk "BEGIN{print $t1 - $t0}") s" >>"$SUMMARY"
    grep -iE "measure|pass|seconds| s$|bpw|bits per weight|peak" "$OUT/syn_$mode.log" | tail -10 >>"$SUMMARY"
  done
else
  if [ ! -f .device/text/calib.txt ]; then
    T=.device/shared/fixtures/text/wikitext2-test.txt
    mkdir -p .device/text
    head -c 200000 "$T" >.device/text/calib.txt
    tail -c +700001 "$T" | head -c 14000 >.device/text/eval.txt
  fi
  tar -C /tmp -xJf .device/ref25/ref25.tar.xz
  M=/tmp/gyre-ref-25M
  conv() {  # name, then convert options
    local name=$1
    shift
    local t0=$(date +%s.%N)
    .device/bin/gyre convert -m $M -o /tmp/q/$name --calibration .device/text/calib.txt \
      --head-bits 0 "$@" >"$OUT/conv_$name.log" 2>&1
    local rc=$? t1=$(date +%s.%N)
    echo "== $name rc=$rc convert $(awk "BEGIN{print $t1 - $t0}") s: $*" >>"$SUMMARY"
    grep -E "bits per weight|bpw" "$OUT/conv_$name.log" | tail -1 >>"$SUMMARY"
    python3 -c "import json; l=json.load(open('/tmp/q/$name/config.json'))['quantization_config']['layers']; print('mixed layers:', sum('mix' in v for v in l.values()), 'of', len(l))" >>"$SUMMARY" 2>&1
    .device/bin/gyre kld -m /tmp/q/$name --ref $M -f .device/text/eval.txt --score-all --json \
      --device cpu >/tmp/kld_$name.json 2>/dev/null
    python3 -c "import json; d=json.load(open('/tmp/kld_$name.json')); print({k: v for k, v in d.items() if k not in ('kld_percentiles', 'model', 'ref')})" >>"$SUMMARY" 2>&1
  }
  conv mix40 --bpw 4.0
  # The same measurement without its mixed candidates: the chooser's only difference.
  python3 -c "import json; j=json.load(open('/tmp/q/mix40/measurement.json'))
for l in j['layers']: l['errors'] = [e for e in l['errors'] if 'mix_bits' not in e]
json.dump(j, open('/tmp/nomix.json', 'w'))"
  conv nomix40 --bpw 4.0 --measurement /tmp/nomix.json
  conv mix30 --bpw 3.0 --measurement /tmp/q/mix40/measurement.json
  conv nomix30 --bpw 3.0 --measurement /tmp/nomix.json
fi
cat "$SUMMARY"
