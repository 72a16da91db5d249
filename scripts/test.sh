#!/usr/bin/env bash
# The README's test command: set up from scratch if needed, lint, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
ruff check .
python -m pytest -p no:cacheprovider tests
