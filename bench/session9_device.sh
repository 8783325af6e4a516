#!/usr/bin/env bash
# Session 9 device run: the CUDA tests of the new code (round-robin split-K chunks of the stream
# GEMV, the stacked trellis LDLQ), then an interleaved A/B of GYRE_CUDA_STREAM_CHUNK (0 = the
# contiguous split-K ranges, 1 / 2 = round-robin chunks of 1 / 2 scale groups) on the synthetic
# llama3-8b at 4 and 3 bits. The knob was measured slower and removed from main: it lives in the
# git tag exp/stream-chunk, whose binaries this script needs (on main the A/B rows are identical). Carry .device (lead/*.xz = stripped gyre and gyre_tests, libs/,
# shared/fixtures/{stories260K,text}).
set -u
[ -e /work/shared ] || { mkdir -p /work && ln -s "$PWD/.device/shared" /work/shared; }
mkdir -p .device/bin
for f in .device/lead/*.xz; do b=.device/bin/$(basename "$f" .xz); xz -dc "$f" >"$b"; chmod +x "$b"; done
cp .device/libs/* .device/bin/
export LD_LIBRARY_PATH=$PWD/.device/bin:${LD_LIBRARY_PATH:-}
B=.device/bin
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 200 $B/gyre_tests --gtest_filter='CudaGemv4*:CudaQbits*:*Trellis*:*QuantCuda*:CudaQlinear*' >"$O/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$O/tests.log" | head -20
for r in 1 2; do
  for bits in 4 3; do
    for c in 0 1 2; do
      GYRE_CUDA_STREAM_CHUNK=$c timeout 100 $B/gyre bench --synthetic llama3-8b --bits $bits -p 512 \
        -n 128 --long 8192 --json >"$O/ab.json" 2>/dev/null
      python3 -c "import json,sys; d=json.load(open('$O/ab.json')); print('bits $bits chunk $c run $r: decode@128 %.1f tok/s (%.1f%%) @8k %.1f (%.1f%%) prefill %.0f bw %.0f' % (d['decode_short_tok_s'], 100*d['decode_short_roofline'], d['decode_long_tok_s'], 100*d['decode_long_roofline'], d['prefill_tok_s'], d['bandwidth_gb_s']))" | tee -a "$O/ab.log"
    done
  done
done
