#!/usr/bin/env bash
# Configures and builds into build/ (or $GYRE_BUILD_DIR); extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${GYRE_BUILD_DIR:-build}
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=${GYRE_BUILD_TYPE:-Release} "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
