#!/usr/bin/env bash
# The README's main command: set up, run the quick cost sweep, print its summary, draw the plots.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
attn-bench sweep --preset quick --out results/quick.jsonl --resume
attn-bench plot results/quick.jsonl --out results/figures/quick
