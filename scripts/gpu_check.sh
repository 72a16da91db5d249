#!/usr/bin/env bash
# One-shot GPU validation, sized for a single short run on one H200 (target: < 8 minutes):
#   1. install attn-bench into the machine's own CUDA python (no network needed: --no-deps;
#      wheels for xformers / flash-linear-attention are taken from ./wheels if present);
#   2. every CUDA backend vs its variant's reference, forward and backward, fp32/bf16/fp16;
#   3. the `gpu` sweep preset (bf16, forward + train, 1K..128K) and its figures and report.
# Usage: scripts/gpu_check.sh OUT_DIR [extra sweep options, e.g. --lengths 1K..8K]
# Without a GPU it still runs end to end: the CUDA tests skip (the CPU half checks that CUDA-only
# backends refuse with a reason) and the gpu sweep is only validated (--dry-run), which is how CI
# checks this script.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/gpu}
shift || true
mkdir -p "$OUT"
PY=${PYTHON:-python3}
log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$OUT/gpu_check.log"; }

log "python: $($PY -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())')"
if ! $PY -c "import attn" 2>/dev/null; then
  $PY -m pip install --quiet --no-deps --no-build-isolation -e . >>"$OUT/gpu_check.log" 2>&1 \
    || { log "install failed"; exit 1; }
fi
if [ -d wheels ]; then
  $PY -m pip install --quiet --no-deps --no-index --find-links wheels xformers flash-linear-attention \
    >>"$OUT/gpu_check.log" 2>&1 || log "optional GPU wheels not installed (xformers / fla backends will say why)"
fi
$PY -c "import torch; torch.cuda.is_available() and print(torch.cuda.get_device_name())" | tee -a "$OUT/gpu_check.log"

log "equivalence tests (every CUDA backend vs reference, fwd+bwd, fp32/bf16/fp16)"
timeout 240 $PY -m pytest -p no:cacheprovider tests/test_backends_devices.py 2>&1 | tee "$OUT/equivalence.txt" | tail -15
tests_rc=${PIPESTATUS[0]}

if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  log "no CUDA device: validating the gpu sweep grid only (--dry-run, on cpu)"
  $PY -m harness.cli sweep --preset gpu --device cpu --out "$OUT/gpu.jsonl" --dry-run "$@" 2>&1 | tee "$OUT/gpu_dry_run.txt" | tail -5
  sweep_rc=${PIPESTATUS[0]}
  log "done (equivalence tests exit status $tests_rc, dry run exit status $sweep_rc)"
  [ "$tests_rc" -eq 0 ] && exit "$sweep_rc"
  exit "$tests_rc"
fi

log "gpu sweep"
timeout 330 $PY -m harness.cli sweep --preset gpu --out "$OUT/gpu.jsonl" --resume "$@" 2>&1 | tail -40 | tee -a "$OUT/gpu_check.log"

log "figures and report"
$PY -m harness.cli plot "$OUT/gpu.jsonl" --out "$OUT/figures" 2>&1 | tail -5 | tee -a "$OUT/gpu_check.log"
$PY -m harness.cli report "$OUT/gpu.jsonl" --out "$OUT/report.html" 2>&1 | tail -3 | tee -a "$OUT/gpu_check.log"
log "done (equivalence tests exit status $tests_rc)"
exit "$tests_rc"
