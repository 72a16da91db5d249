#!/usr/bin/env bash
# The README's main command: set up (only what a sweep needs: no test extras), run the quick cost
# sweep into a new folder of its own, print its summary, draw its figures. A rerun makes a new folder;
# nothing committed under results/ is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
run=results/runs/quick-$(date +%Y%m%d-%H%M%S)
mkdir -p "$run"
attn-bench sweep --preset quick --out "$run/quick.jsonl"
attn-bench plot "$run/quick.jsonl" --out "$run/figures"
echo "results and figures: $run"
