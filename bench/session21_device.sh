#!/usr/bin/env bash
# Session 21 device runs (carry .device/lead2 = stripped gyre as .xz, or .device/lead =
# gyre_tests.xz, and .device/libs, .device/shared; see bench/device_binaries.sh).
#   bench/session21_device.sh ncuattn      the batch-1 decode attention kernel at --long (8192):
#       every launch's time and DRAM bytes (ncu, caches flushed), then the full ncu report of two
#       launches at the long context (stall reasons, occupancy, DRAM throughput)
#   bench/session21_device.sh ab|serve|tests|ncu   as bench/session17_device.sh
set -u
for mode in "$@"; do
  case "$mode" in
  ncuattn)
    . bench/device_binaries.sh
    N=/usr/local/cuda/bin/ncu
    run=($B/gyre bench --synthetic "${SHAPE:-llama3-8b}" --bits "${BITS:-4}" -p 16 -n 2 --long "${LONG:-8192}")
    timeout 240 $N --graph-profiling node --cache-control all --clock-control none \
      -k regex:decode_kernel --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__grid_size \
      "${run[@]}" >"$O/ncu_all.csv" 2>"$O/ncu_all.err"
    skip=$(python3 - "$O/ncu_all.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]
iid, iname, im, iu, iv = (h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
by = {}
for r in rows[1:]:
    by.setdefault(int(r[iid]), {})[r[im]] = (r[iu], r[iv])
ids = sorted(by)
big = [i for i in ids if float(by[i]["dram__bytes_read.sum"][1].replace(",", "")) *
       {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(by[i]["dram__bytes_read.sum"][0], 1) > 8e6]
def us(i):
    u, v = by[i]["gpu__time_duration.sum"]
    return float(v.replace(",", "")) * {"nsecond": 1e-3, "usecond": 1, "msecond": 1e3}.get(u, float("nan"))
small = [i for i in ids if i not in big]
for name, sel in (("short", small[-32:]), ("long", big)):
    if sel:
        t = sorted(us(i) for i in sel)
        print("%s: %d launches, median %.2f us, min %.2f, max %.2f, regs %s grid %s, MB %s" % (
            name, len(sel), t[len(t) // 2], t[0], t[-1], by[sel[0]]["launch__registers_per_thread"][1],
            by[sel[0]]["launch__grid_size"][1], by[sel[0]]["dram__bytes_read.sum"]), file=sys.stderr)
print(ids.index(big[0]) if big else 0)
PY
)
    echo "first long launch: $skip"
    timeout 300 $N --graph-profiling node --cache-control all --clock-control none \
      -k regex:decode_kernel --launch-skip "$skip" --launch-count 1 --set full \
      "${run[@]}" >"$O/ncu_full.txt" 2>"$O/ncu_full.err"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Waves Per SM|Warp Cycles Per Issued|Stall|stall|L2 Hit|Mem Busy|Max Bandwidth|Issue Slots|Eligible|Active Warps" "$O/ncu_full.txt" | head -60
    ;;
  *)
    bash bench/session17_device.sh "$mode"
    ;;
  esac
done
