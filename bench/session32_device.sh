#!/usr/bin/env bash
# Session 32 device calls (carry .device/lead, .device/libs, .device/shared). Logs into $OUT.
#   bench/session32_device.sh first   session 30's `pieces` (2/3/5-bit decode at other blocks per
#       piece, with and without the shared-memory ring), ncu of the decode GEMVs at 2 and 4 bits at
#       the running clock, ncu of the decode attention at 4 bits, then `pieces` again if time allows
#   bench/session32_device.sh check   after the flip to 1 block per piece with the shared-memory
#       ring at 2 and 3 bits: the narrow kernels' tests, decode and serving at 2/3 bits against the
#       old defaults (GYRE_CUDA_BITS_PIECES=4 / 2), then every GPU test until CHECK_END (450) s;
#       ROUNDS (2) rounds of decode; SHORT=1: serving at 2 bits only
set -u
O=${OUT:-/tmp}
mode=${1:-first}
if [ "$mode" = first ]; then
  ROUNDS=1 bash bench/session30_device.sh pieces 2>&1 | tee "$O/pieces.log"
  CLOCKS=none BITS="2 4" bash bench/session30_device.sh ncu 2>&1 | tee "$O/ncu.log"
  mv "$O/ncu_4.txt" "$O/ncu_gemv_4.txt" 2>/dev/null
  CLOCKS=none BITS=4 KREGEX=decode_kernel bash bench/session30_device.sh ncu 2>&1 | tee "$O/ncu_attn.log"
  mv "$O/ncu_4.txt" "$O/ncu_attn_4.txt" 2>/dev/null
  if [ "$SECONDS" -lt "${ROUND2_BEFORE:-380}" ]; then
    ROUNDS=1 bash bench/session30_device.sh pieces 2>&1 | sed 's/^r1 /r2 /' | tee "$O/pieces2.log"
  fi
elif [ "$mode" = check ]; then
  set --
  . bench/session29_device.sh  # (no mode: defines dec, device_tests, B; unpacks the carry)
  . bench/session28_device.sh  # (no mode: defines serve_line)
  serve() {  # serve LABEL BITS [ENV=V ...]: serve_line with those variables set
    local label=$1 bits=$2
    shift 2
    (
      export "$@"
      serve_line "$label" "$bits"
    )
  }
  device_tests "CudaQbits*:QMixedCuda*:CudaStories*:CudaGemv4*" 150
  cp "$O/tests.log" "$O/tests_narrow.log"
  for r in $(seq 1 "${ROUNDS:-2}"); do
    dec "r$r 2-bit" 2 X=0
    dec "r$r 2-bit old (S 4)" 2 GYRE_CUDA_BITS_PIECES=4
    dec "r$r 3-bit" 3 X=0
    dec "r$r 3-bit old (S 2)" 3 GYRE_CUDA_BITS_PIECES=2
  done
  dec "4-bit" 4 X=0
  dec "4-bit without attention (results wrong)" 4 GYRE_DIAG_SKIP=attn
  dec "2-bit without attention (results wrong)" 2 GYRE_DIAG_SKIP=attn
  serve "2-bit" 2 X=0
  serve "2-bit old" 2 GYRE_CUDA_BITS_PIECES=4
  [ -n "${SHORT:-}" ] || serve "3-bit" 3 X=0
  [ -n "${SHORT:-}" ] || serve "3-bit old" 3 GYRE_CUDA_BITS_PIECES=2
  left=$((${CHECK_END:-450} - SECONDS))
  [ "$left" -gt 60 ] && device_tests "*Cuda*:FusedWeights*:FedDecode*" "$left"
  grep -cE "^\[       OK \]" "$O/tests.log"
fi
echo "wall $SECONDS s"
