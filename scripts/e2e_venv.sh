#!/usr/bin/env bash
# Creates .venv-e2e (ignored by git) with the official `openai` Python client, which the
# end-to-end tests in tests/e2e/ drive `gyre serve` with. Skips the install when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-e2e
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import openai' 2>/dev/null; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'openai>=1.0,<4' pytest
echo "created $venv"
