#!/bin/bash
# Device call 2 of the Hadamard work (helper had): gyre-ref-25M converted on the GPU with and
# without --hadamard (GPTQ 4-bit g128 uniform; Gyre 4.0 and 3.0 bpw, the 3.0 run reusing the 4.0
# run's measurement), each scored by `gyre kld` against the original on the GPU. Protocol of
# docs/quantization.md: calibration = first 200,000 bytes of wikitext2-test.txt, evaluation =
# 14,000 bytes from byte 700,000, --head-bits 0. Writes $OUT/log and $OUT/kld_*.json.
export LD_LIBRARY_PATH=$PWD/.device/libs
tar -C /tmp -xJf .device/ref25/ref25.tar.xz
xz -dc .device/had/gyre.xz > /tmp/gyre && chmod +x /tmp/gyre
T=.device/shared/fixtures/text/wikitext2-test.txt
head -c 200000 "$T" > /tmp/calib.txt
tail -c +700001 "$T" | head -c 14000 > /tmp/eval.txt
M=/tmp/gyre-ref-25M
conv() {  # name, then convert options
  local name=$1; shift
  local t0=$(date +%s.%N)
  /tmp/gyre convert -m $M -o /tmp/q/$name --calibration /tmp/calib.txt --head-bits 0 "$@" > /tmp/conv_$name.log 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  echo "== $name rc=$rc convert $(awk "BEGIN{print $t1 - $t0}") s: $*" | tee -a "$OUT/log"
  grep -E "convert: (wrote|measurement|sensitivity|quantization)" /tmp/conv_$name.log | tee -a "$OUT/log"
  [ $rc = 0 ] || tail -5 /tmp/conv_$name.log | tee -a "$OUT/log"
  /tmp/gyre kld -m /tmp/q/$name --ref $M -f /tmp/eval.txt --score-all --json > "$OUT/kld_$name.json" 2>/tmp/kld_$name.err
  tail -c 600 "$OUT/kld_$name.json" | tee -a "$OUT/log"
  echo | tee -a "$OUT/log"
  ls -l /tmp/q/$name/model.safetensors | tee -a "$OUT/log"
}
conv gptq4 --uniform 4:128
conv gptq4h --uniform 4:128 --hadamard
conv g40h --bpw 4.0 --hadamard
conv g30h --bpw 3.0 --hadamard --measurement /tmp/q/g40h/measurement.json
conv g40 --bpw 4.0
conv g30 --bpw 3.0 --measurement /tmp/q/g40/measurement.json
# Cross-check of the CUDA rotation on a real model: the rotated GPTQ 4-bit model scored on the
# CPU (fp32) must give about the GPU's KLD.
/tmp/gyre kld -m /tmp/q/gptq4h --ref $M -f /tmp/eval.txt --score-all --json --device cpu > "$OUT/kld_gptq4h_cpu.json" 2>/dev/null
echo "== gptq4h on the CPU:" | tee -a "$OUT/log"; tail -c 400 "$OUT/kld_gptq4h_cpu.json" | tee -a "$OUT/log"
