#!/usr/bin/env bash
# On a GPU machine: runs the CUDA tests and the synthetic bench table in one go, then prints a
# summary. Binaries are built beforehand (scripts/build.sh, or carried): BIN_DIR holds gyre and
# gyre_tests. JSON results go to OUT_DIR (default bench/out).
# Usage: scripts/gpu_check.sh [BIN_DIR] [OUT_DIR]
set -uo pipefail
bin=${1:-build}
out=${2:-bench/out}
mkdir -p "$out"

# Use the CUDA libraries of this machine (toolkit or a Python wheel) when the loader misses them.
if ldd "$bin/gyre" | grep -q "not found"; then
  for lib in $(find /usr/local /usr/lib /opt "$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)" \
      -name 'libcublas.so.1[0-9]*' 2>/dev/null | head -3); do
    export LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}"
  done
  export LD_LIBRARY_PATH="$bin:${LD_LIBRARY_PATH:-}"
fi
ldd "$bin/gyre" | grep -E "cuda|cublas"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader

echo "== CUDA tests"
# Every CUDA test (parameterized ones are named AllVariants/Cuda...): one line per test.
"$bin/gyre_tests" --gtest_filter='*Cuda*:*FusedWeights*' >"$out/cuda_tests.log" 2>&1
tests_rc=$?
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|^\[==========\]|Failure|Expected|Which is" "$out/cuda_tests.log" |
  cut -c1-160 | head -n 80

echo "== bench"
# Each entry is SHAPE:BITS[:CACHE] (16 = FP16 weights; 8 and 4 = Gyre's group-quantized
# layouts; tK = trellis-coded weights of K bits, rotated; CACHE f16 (default), q8 or q4).
for mb in ${GYRE_BENCH_MODELS-llama3-8b:16 llama3-8b:8 llama3-8b:4 mistral-7b:16 llama2-7b:16}; do
  IFS=: read -r m b c <<<"$mb"
  c=${c:-f16}
  long=8192
  [ "$m" = llama-30b ] && long=0
  name="$m-b$b"
  [ "$c" = f16 ] || name="$name-$c"
  wflags=(--bits "$b")
  [[ $b == t* ]] && wflags=(--trellis "${b#t}")
  [[ $b == t* ]] && export GYRE_SYNTHETIC_HADAMARD=1 || unset GYRE_SYNTHETIC_HADAMARD
  timeout 240 "$bin/gyre" bench --synthetic "$m" "${wflags[@]}" --cache "$c" -p 2048 -n 128 \
    --long "$long" --json >"$out/$name.json" 2>"$out/$name.err" ||
    { echo "$name failed:"; tail -n 3 "$out/$name.err"; }
done
unset GYRE_SYNTHETIC_HADAMARD

echo "== serving (Engine: continuous batching over the paged KV cache)"
# Each entry is SHAPE:BITS[:CACHE]: total generated tokens/s at 1/8/32/128 concurrent requests,
# then time to first token of 32 requests sharing a 2048-token prefix.
for mb in ${GYRE_SERVE_MODELS-llama3-8b:4}; do
  IFS=: read -r m b c <<<"$mb"
  c=${c:-f16}
  timeout 300 "$bin/gyre" bench --synthetic "$m" --bits "$b" --cache "$c" \
    --concurrency "${GYRE_SERVE_CONCURRENCY:-1,8,32,128}" -n 128 --prefix 2048 --ttft-requests 32 \
    2>"$out/serve-$m-b$b-$c.err" | tee "$out/serve-$m-b$b-$c.txt" ||
    { echo "serve $mb failed:"; tail -n 3 "$out/serve-$m-b$b-$c.err"; }
done
python3 - "$out" <<'PY'
import json, pathlib, sys
rows = []
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        j = json.loads(f.read_text())
    except Exception:
        continue
    j["model"] = f.stem
    rows.append(j)
print(f"{'model':22} {'prefill t/s':>11} {'dec128 t/s':>10} {'roof%':>6} {'dec8k t/s':>10} {'roof%':>6} {'GB/s':>6} {'VRAM GiB':>8}")
for j in rows:
    print(f"{j['model']:22} {j['prefill_tok_s']:11.0f} {j['decode_short_tok_s']:10.1f} "
          f"{100*j['decode_short_roofline']:6.1f} {j.get('decode_long_tok_s', 0):10.1f} "
          f"{100*j.get('decode_long_roofline', 0):6.1f} {j['bandwidth_gb_s']:6.0f} "
          f"{j.get('vram_used_bytes', 0)/2**30:8.1f}")
PY
echo "CUDA tests exit code: $tests_rc"
exit "$tests_rc"
