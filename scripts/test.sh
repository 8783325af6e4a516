#!/usr/bin/env bash
# The whole test suite, as CI runs it: format check, the release build and its tests, the tests
# again under AddressSanitizer + UndefinedBehaviorSanitizer, the end-to-end server tests (the
# official openai Python client and wrk against `gyre serve` on 127.0.0.1), and a short fuzzing
# run per parser.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/fetch_models.sh
jobs=$(nproc)

echo "== clang-format"
files=$(git ls-files 'src/*.cc' 'src/*.h' 'src/*.cu' 'src/*.cuh' 'tests/*.cc' 'tests/*.h' 'fuzz/*.cc')
clang-format --dry-run --Werror $files

echo "== release build + tests"
# CI compiles the CUDA backend (when nvcc is there) for one architecture to save time.
GYRE_BUILD_DIR=build scripts/build.sh -DGYRE_CUDA_ARCHS="${GYRE_CUDA_ARCHS:-90}"
(cd build && ctest --output-on-failure -j"$jobs")

echo "== e2e: openai client + wrk against gyre serve (loopback only, bounded)"
scripts/e2e_venv.sh
GYRE_BIN="$PWD/build/gyre" GYRE_FIXTURES="$PWD/../shared/fixtures" \
  timeout "${GYRE_E2E_SECONDS:-300}" .venv-e2e/bin/python -m pytest -q -p no:cacheprovider tests/e2e

echo "== sanitizers (ASan + UBSan) build + tests"
# -O1 and line tables only: half the compile time of -O2 -g (the larger part of CI), stack
# traces still name files and lines.
GYRE_BUILD_DIR=build-asan GYRE_BUILD_TYPE=RelWithDebInfo scripts/build.sh -DGYRE_SANITIZE=ON \
  -DGYRE_CUDA=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j"$jobs")

echo "== fuzzing (${GYRE_FUZZ_SECONDS:-20}s per target)"
# Only the fuzz targets: they link the file-format library alone (CMakeLists.txt).
fuzzers=$(ls fuzz/*.cc | xargs -n1 basename | sed 's/\.cc$//')
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DGYRE_FUZZ=ON -DGYRE_CUDA=OFF -DGYRE_TESTS=OFF >/dev/null
cmake --build build-fuzz -j"$jobs" --target $fuzzers
for f in build-fuzz/fuzz_*; do
  [ -x "$f" ] || continue
  name=$(basename "$f")
  mkdir -p build-fuzz/corpus/"$name"
  "$f" -max_total_time="${GYRE_FUZZ_SECONDS:-20}" -max_len=65536 -rss_limit_mb=2048 \
    build-fuzz/corpus/"$name" fuzz/seeds/"$name" 2>&1 | tail -n 2
done
echo "all test stages passed"
