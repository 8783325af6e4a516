#!/usr/bin/env bash
# Session 17 device runs (carry .device/lead2 = stripped gyre as .xz, or .device/lead =
# gyre_tests.xz, and .device/libs, .device/shared; see bench/device_binaries.sh).
#   bench/session17_device.sh ab|serve|tests|table   as bench/session15_device.sh (ARMS, BITS, ...)
#   bench/session17_device.sh ncu                    per-kernel times of the decode GEMVs
#       (gemv_stream launches 9-24 of `gyre bench -p 16 -n 3 --long 0`, caches flushed) for each
#       arm of ARMS (default: plain, act-order as a real act-order model loads), in launch order
set -u
for mode in "$@"; do
  case "$mode" in
  ncu)
    . bench/device_binaries.sh
    for arm in ${ARMS:-- GYRE_SYNTHETIC_ACT_ORDER=2}; do
      envs=()
      [ "$arm" != - ] && envs=(${arm//,/ })
      echo "== ncu [$arm] ${BITS:-4}-bit"
      env "${envs[@]}" timeout 200 /usr/local/cuda/bin/ncu --graph-profiling node \
        --cache-control all --clock-control none -k regex:gemv_stream --launch-skip 8 \
        --launch-count 16 --csv --metrics gpu__time_duration.sum $B/gyre bench \
        --synthetic llama3-8b --bits "${BITS:-4}" -p 16 -n 3 --long 0 >"$O/ncu.csv" 2>"$O/ncu.err"
      python3 - "$O/ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
i_grid, i_block = head.index("Grid Size"), head.index("Block Size")
i_unit, i_val = head.index("Metric Unit"), head.index("Metric Value")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
for r in rows[1:]:
    us = float(r[i_val].replace(",", "")) * scale.get(r[i_unit], float("nan"))
    print("grid %-14s block %-12s %8.2f us" % (r[i_grid], r[i_block], us))
PY
    done
    ;;
  *)
    bash bench/session15_device.sh "$mode"
    ;;
  esac
done
