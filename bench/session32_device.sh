#!/usr/bin/env bash
# Session 32's first device call (carry .device/lead, .device/libs, .device/shared): session 30's
# `pieces` (2/3/5-bit decode at other blocks per piece, with and without the shared-memory ring),
# ncu of the decode GEMVs at 2 and 4 bits at the running clock, ncu of the decode attention at
# 4 bits, then a second round of `pieces` if the call's time allows. Logs into $OUT.
set -u
O=${OUT:-/tmp}
ROUNDS=1 bash bench/session30_device.sh pieces 2>&1 | tee "$O/pieces.log"
CLOCKS=none BITS="2 4" bash bench/session30_device.sh ncu 2>&1 | tee "$O/ncu.log"
mv "$O/ncu_4.txt" "$O/ncu_gemv_4.txt" 2>/dev/null
CLOCKS=none BITS=4 KREGEX=decode_kernel bash bench/session30_device.sh ncu 2>&1 | tee "$O/ncu_attn.log"
mv "$O/ncu_4.txt" "$O/ncu_attn_4.txt" 2>/dev/null
if [ "$SECONDS" -lt "${ROUND2_BEFORE:-380}" ]; then
  ROUNDS=1 bash bench/session30_device.sh pieces 2>&1 | sed 's/^r1 /r2 /' | tee "$O/pieces2.log"
fi
echo "wall $SECONDS s"
