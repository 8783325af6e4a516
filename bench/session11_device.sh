#!/usr/bin/env bash
# Session 11 device runs (carry .device/lead = stripped gyre and gyre_tests as .xz, .device/libs,
# .device/shared/fixtures/{stories260K,text}; the bench call carries .device/lead2 instead, the
# unpacked binaries of the first call staying in .device/bin on the warm machine).
#   bench/session11_device.sh tests [FILTER]  the CUDA tests of the new 2/3-bit decode and its
#                                             neighbours
#   bench/session11_device.sh e2e / e2e56     gyre bench on the synthetic llama3-8b, each arm
#                                             "bits decode" with the new and the old decode
#                                             (GYRE_CUDA_BITS_DECODE; "old" also sets
#                                             GYRE_CUDA_INT4_LOP3=0), interleaved, two rounds;
#                                             default: 4, 3, 2 bits new/old ("e2e56": 4, 5, 6)
#   bench/session11_device.sh table           the final table (FP16, 8/6/4 bits, mistral, serving)
#   bench/session11_device.sh kernels [BITS]  qlinear_bits_bench decode (old vs new per shape;
#                                             default 5 6 and 4-bit LOP3; "2 3": nb3's run)
set -u
. bench/device_binaries.sh
case "${1:-tests}" in
tests)
  device_tests "${2:-CudaQbits*:CudaQlinear*:CudaGemv4*:Exl2Cuda*:QMixedCuda*:QuantFormatsCuda*:CudaFused*:CudaForward*}" 300
  ;;
e2e | e2e56)
  arms=("4 new" "3 new" "3 old" "2 new" "2 old")
  [ "$1" = e2e56 ] && arms=("4 new" "4 old" "5 new" "5 old" "6 new" "6 old")
  for r in 1 2; do
    for arm in "${arms[@]}"; do
      set -- $arm
      lop3=1
      [ "$2" = old ] && lop3=0
      GYRE_CUDA_BITS_DECODE=$2 GYRE_CUDA_INT4_LOP3=$lop3 timeout 100 $B/gyre bench --synthetic llama3-8b --bits $1 -p 512 \
        -n 128 --long 8192 --json >"$O/ab.json" 2>"$O/ab.err"
      python3 -c "import json; d=json.load(open('$O/ab.json')); print('bits $1 decode $2 run $r: decode@128 %.1f tok/s (%.1f%%) @8k %.1f (%.1f%%) prefill %.0f bw %.0f' % (d['decode_short_tok_s'], 100*d['decode_short_roofline'], d['decode_long_tok_s'], 100*d['decode_long_roofline'], d['prefill_tok_s'], d['bandwidth_gb_s']))" 2>&1 | tee -a "$O/ab.log"
    done
  done
  ;;
table)  # the final binaries' table: FP16, 8, 6, 4 bits at -p 2048, mistral FP16, 4-bit serving
  . bench/device_table.sh
  ;;
kernels)
  shift
  timeout 200 $B/qlinear_bits_bench decode "$@" 2>&1 | tee "$O/kernels.log"
  ;;
esac
