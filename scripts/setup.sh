#!/usr/bin/env bash
# One-time setup on a fresh Debian machine: dependencies, the SmolLM2 model, and the build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/fetch_models.sh
scripts/build.sh
