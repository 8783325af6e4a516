#!/usr/bin/env bash
# Session 14 device runs (carry .device/lead2 = stripped gyre as .xz, .device/libs; the tests
# call carries .device/lead = gyre_tests.xz; unpacked binaries stay in .device/bin while warm).
#   bench/session14_device.sh tests [FILTER]        the CUDA tests
#   bench/session14_device.sh serve BITS... [-- VAR=VAL ...]   (BITS tK: trellis-coded, K bits)
#       serving at 1/8/32/64 requests of synthetic llama3-8b at each width, the serving-batch
#       kernel of the narrow widths on (default) and off (GYRE_CUDA_BITS_BATCH=0: FP16
#       dequantization + cuBLAS beyond 8 rows), arms interleaved per width; ARMS="A B ..." other
#       arms (VAR=VAL[,VAR=VAL], "-" for none); CONC the request counts
#   bench/session14_device.sh table                 the final table (bench/device_table.sh)
#   bench/session14_device.sh smolpart A|B          SmolLM2's GGUF (98 MB) in two calls, as the
#       carry limit (64 MiB with the tracked files) allows: here `split -b 48M
#       models/SmolLM2-135M-Instruct.Q4_1.gguf`, parts in .device/smolA/smolpart_aa and
#       .device/smolB/smolpart_ab; call A (carry .device/smolA) keeps part A in /tmp, call B (carry
#       .device/smolB, right after: the machine goes back after 30 s idle) writes models/ (what
#       CudaSmolLM2.* read) and /tmp/smol.gguf (bench/ref25_quality.sh SET smol*)
set -u
. bench/device_binaries.sh
case "${1:-tests}" in
tests)
  device_tests "${2:-*Cuda*:*Trellis*:*Hadamard*:*QuantMix*}" 400
  ;;
serve)
  shift
  widths=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do widths+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  for bits in "${widths[@]}"; do
    for arm in ${ARMS:-- GYRE_CUDA_BITS_BATCH=0}; do
      envs=("$@")
      [ "$arm" != - ] && envs+=(${arm//,/ })
      echo "== ${bits}-bit [$arm]"
      wopt=(--bits "$bits")
      [[ "$bits" == t* ]] && wopt=(--trellis "${bits#t}")  # tK: trellis-coded at K bits
      env "${envs[@]}" timeout 240 $B/gyre bench --synthetic "${SHAPE:-llama3-8b}" "${wopt[@]}" \
        -n 128 -p 16 --concurrency "${CONC:-1,8,32,64}" 2>&1 | tail -7
    done
  done
  ;;
table)
  . bench/device_table.sh
  ;;
smolpart)
  mkdir -p /tmp/smolparts
  if [ "${2:-A}" = A ]; then
    cp .device/smolA/smolpart_aa /tmp/smolparts/
  else
    mkdir -p models
    cat /tmp/smolparts/smolpart_aa .device/smolB/smolpart_ab >models/SmolLM2-135M-Instruct.Q4_1.gguf
    cp models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smol.gguf
    sha256sum /tmp/smol.gguf  # b179c952... (docs/quantization.md)
  fi
  ;;
esac
