#!/usr/bin/env bash
# Install attn-bench into ./.venv. The CPU build of torch goes first: a bare `torch`
# requirement would pull a multi-GB CUDA build. On a GPU machine, install your CUDA torch first.
# Usage: scripts/setup.sh [EXTRAS]   e.g. `test` (scripts/test.sh) -- none for a sweep (scripts/main.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install --quiet "torch==2.13.0" \
  || python -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
EXTRAS=${1:-}
python -m pip install --quiet -e ".${EXTRAS:+[$EXTRAS]}"
