#!/usr/bin/env bash
# Device run for the fuse helper: tests, then llama3-8b synthetic benches (FP16, 8-bit, 4-bit).
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/bin:${LD_LIBRARY_PATH:-}"
for lib in $(find /usr/local /usr/lib /opt "$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)" -name 'libcublas.so.1[0-9]*' 2>/dev/null | head -3); do
  export LD_LIBRARY_PATH="$(dirname "$lib"):$LD_LIBRARY_PATH"
done
mkdir -p /work/wt/fuse /work/wt/shared/fixtures 2>/dev/null && cp -r fixtures/stories260K /work/wt/shared/fixtures/ 2>/dev/null
ldd bin/gyre | grep -E "not found|cublas|cudart"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
echo "== tests"
timeout 120 bin/gyre_tests --gtest_filter='Cuda*:FusedWeights*' 2>&1 | grep -E "^\[  (FAILED|PASSED|  OK) |Failure|error|expected|Which is" | head -40
mkdir -p $OUT/json
for bits in 16 4 8; do
  timeout 150 bin/gyre bench --synthetic llama3-8b --bits $bits -p 2048 -n 128 --long 8192 --json > $OUT/json/llama3-8b-b$bits.json 2>$OUT/json/b$bits.err || tail -3 $OUT/json/b$bits.err
done
python3 - $OUT/json <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try: j = json.loads(f.read_text())
    except Exception as e: print(f.name, "bad", e); continue
    print(f"{f.stem:18} pf {j['prefill_tok_s']:7.0f} d128 {j['decode_short_tok_s']:6.1f} ({100*j['decode_short_roofline']:4.1f}%) d8k {j.get('decode_long_tok_s',0):6.1f} ({100*j.get('decode_long_roofline',0):4.1f}%) GB/s {j['bandwidth_gb_s']:5.0f}")
PY
