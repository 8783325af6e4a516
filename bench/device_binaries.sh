# Sourced by the session device scripts (bench/session*_device.sh), run from the repository root
# on the device: unpacks the carried binaries (.device/lead*/NAME.xz, newer than .device/bin/NAME,
# or .device/lead*/*.tar.xz)
# and libraries into .device/bin, links the carried fixtures to /work/shared, and sets B (the
# binaries), O (the output folder) and LD_LIBRARY_PATH; prints the GPU.
[ -e /work/shared ] || { mkdir -p /work && ln -s "$PWD/.device/shared" /work/shared 2>/dev/null; }
mkdir -p .device/bin
# Binaries that share most of their bytes (the CUDA kernels) travel as one tar.xz with a large
# dictionary (bench/pack_binaries.sh): about half the size of two .xz files.
for f in .device/lead*/*.tar.xz; do
  [ -e "$f" ] || continue
  [ "$f" -nt .device/bin/.unpacked ] || continue
  xz -dc "$f" | tar xf - -C .device/bin && touch .device/bin/.unpacked
done
for f in .device/lead*/*.xz; do
  [ -e "$f" ] || continue
  case "$f" in *.tar.xz) continue ;; esac
  b=.device/bin/$(basename "$f" .xz)
  [ "$f" -nt "$b" ] || continue
  xz -dc "$f" >"$b" && chmod +x "$b"
done
cp .device/libs/* .device/bin/ 2>/dev/null
export LD_LIBRARY_PATH=$PWD/.device/bin:${LD_LIBRARY_PATH:-}
B=.device/bin
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

# device_tests FILTER SECONDS: gyre_tests with that filter into $O/tests.log, then its summary.
device_tests() {
  timeout "$2" $B/gyre_tests --gtest_filter="$1" >"$O/tests.log" 2>&1
  echo "tests rc=$?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]|Failure|Expected|Which is" "$O/tests.log" | head -30
}

# bench_line LABEL BINARY ARGS...: one gyre bench --json run, one line (session 27 on; the
# graph-only figure where the bench printed one).
bench_line() {
  local label=$1 bin=$2
  shift 2
  timeout 60 "$bin" bench "$@" --json >"$O/b.json" 2>"$O/b.err"
  python3 -c "
import json; d=json.load(open('$O/b.json'))
g = d.get('decode_short_graph_only_tok_s')
print('$label: prefill %.0f decode@128 %.1f (%.1f%%) stepwise %.1f graph-only %s decode@long %s bw %.0f weights %.0f MiB' % (
    d['prefill_tok_s'], d['decode_short_tok_s'], 100*d['decode_short_roofline'],
    d.get('decode_short_stepwise_tok_s', 0),
    ('%.1f' % g) if g else '-',
    ('%.1f (%.1f%%)' % (d['decode_long_tok_s'], 100*d['decode_long_roofline'])) if d.get('decode_long_tok_s') else '-',
    d.get('bandwidth_gb_s', 0), d.get('vram_weights_bytes', 0) / 2**20))" 2>&1 || tail -3 "$O/b.err"
}
