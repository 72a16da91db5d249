#!/usr/bin/env bash
# One-shot GPU check for a machine that can fetch nothing, sized to end within its budget
# (GPU_CHECK_BUDGET_S, default 450 s). Stages and their caps (each also cut to what is left):
#   1. install   (60 s)  every import the check needs; what is missing comes from the carried wheels
#                        (WHEELS, default .whl), offline, with --no-deps into a --target folder put on
#                        PYTHONPATH; then the project itself, --no-deps
#   2. equivalence (120 s) every CUDA backend vs the fp64 reference (forward with and without grad,
#                        backward, decode; bf16 and fp32); a backend whose wheel was carried must run
#   3. sweep     (230 s) the `gpu` preset (bf16; forward 1K/4K/16K/128K, train 4K/16K), least likely
#                        to work first; cut at the cap, the rows so far are kept
#   4. figures   (40 s)  figures and the report of whatever rows exist
# Usage: scripts/gpu_check.sh OUT_DIR [extra sweep options, e.g. --lengths 1K]
# Without a GPU it runs the same install stage, the CPU half of the equivalence file's refusal and
# tolerance checks, and validates the gpu sweep grid (--dry-run): tests/test_gpu_script.py rehearses
# it that way in a fresh virtual environment. Wheels to carry: scripts/gpu_wheels.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/gpu}
shift || true
mkdir -p "$OUT"
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SITE=${GPU_CHECK_SITE:-/tmp/attn_bench_site}
BUDGET=${GPU_CHECK_BUDGET_S:-450}
START=$(date +%s)
LOG="$OUT/gpu_check.log"
: >"$LOG"
printf 'stage\tseconds\tcap_s\texit_status\n' >"$OUT/stages.tsv"
log() { echo "[gpu_check $(date +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# cap SECONDS [RESERVE]: the stage's cap, cut to what is left after RESERVE seconds kept for later stages.
cap() { local c=$1 l; l=$(( $(left) - ${2:-0} )); [ "$l" -lt "$c" ] && c=$l; [ "$c" -lt 5 ] && c=5; echo "$c"; }
stage_done() { printf '%s\t%s\t%s\t%s\n' "$1" "$(( $(date +%s) - $2 ))" "$3" "$4" >>"$OUT/stages.tsv"; }
# `import` from / so the checkout's own packages (on sys.path from the cwd) cannot hide a missing install.
importable() { (cd / && "$PY" -c "import $1" >/dev/null 2>&1); }

# -- 1. install --------------------------------------------------------------------------------------
t0=$(date +%s); c=$(cap 60 390)
# module:distribution, everything the check imports. The first block is what the H200 image has;
# the last two are the optional GPU backends (distribution names as their wheel files spell them).
NEEDED="torch:torch numpy:numpy pandas:pandas matplotlib:matplotlib seaborn:seaborn click:click tqdm:tqdm
psutil:psutil safetensors:safetensors scipy:scipy pytest:pytest hypothesis:hypothesis
pytest_timeout:pytest_timeout einops:einops"
OPTIONAL="xformers:xformers fla.ops.linear_attn:fla_core"
log "python: $("$PY" -c 'import sys, torch; print(sys.executable, sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"
mkdir -p "$SITE"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
wheels=()
for pair in $NEEDED $OPTIONAL; do
  mod=${pair%%:*}; dist=${pair##*:}
  importable "$mod" && continue
  found=$(ls "$WHEELS"/"$dist"-*.whl 2>/dev/null | head -1)
  if [ -n "$found" ]; then wheels+=("$found"); log "missing $mod: installing $(basename "$found")"
  else log "missing $mod: no $dist wheel in $WHEELS"; fi
done
if [ ${#wheels[@]} -gt 0 ]; then
  timeout "$c" "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${wheels[@]}" >>"$LOG" 2>&1 || log "pip could not install ${wheels[*]}"
fi
# The project: built from a copy (an in-tree build would leave build/ and egg-info in the checkout).
src=$(mktemp -d)
cp -r attn harness pyproject.toml README.md "$src"/
if ! timeout "$c" "$PY" -m pip install --quiet --no-index --no-deps --no-build-isolation --no-compile --upgrade \
     --target "$SITE" "$src" >>"$LOG" 2>&1; then  # --upgrade: a rerun must not keep the first run's copy
  log "could not install the project into $SITE: using the checkout on PYTHONPATH"
  export PYTHONPATH="$PWD:$PYTHONPATH"
fi
rm -rf "$src"
missing=""
for pair in $NEEDED attn:attn harness.cli:harness; do importable "${pair%%:*}" || missing="$missing ${pair%%:*}"; done
required=""
for pair in $OPTIONAL; do
  mod=${pair%%:*}; dist=${pair##*:}
  if importable "$mod"; then log "$mod imports"
  else log "$mod does not import: $(cd / && "$PY" -c "import $mod" 2>&1 | tail -1)"; fi
  # A backend whose wheel was carried must work: the equivalence stage fails if it is refused.
  ls "$WHEELS"/"$dist"-*.whl >/dev/null 2>&1 && required="$required,${mod%%.*}"
done
export ATTN_BENCH_REQUIRE_BACKENDS=${required#,}
if [ -n "$missing" ]; then
  log "still missing after the install stage:$missing -- carry their wheels in $WHEELS (scripts/gpu_wheels.txt)"
  stage_done install "$t0" "$c" 1
  exit 1
fi
log "every import the check needs succeeds; backends that must run: ${ATTN_BENCH_REQUIRE_BACKENDS:-none}"
stage_done install "$t0" "$c" 0

if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then CUDA=1; else CUDA=0; fi
# GPU_CHECK_SWEEP_ON_CPU=1 runs the measuring stages on CPU (the rehearsal of stages 3-4; CUDA-only
# backends then record `unsupported` rows with their reasons).
MEASURE=$CUDA; device_args=()
[ "${GPU_CHECK_SWEEP_ON_CPU:-0}" = 1 ] && [ "$CUDA" = 0 ] && MEASURE=1 && device_args=(--device cpu)

# -- 2. equivalence ----------------------------------------------------------------------------------
t0=$(date +%s); c=$(cap 120 270)
if [ "$CUDA" = 1 ]; then
  select=(-k cuda)  # the CPU cases run in CI
  (cd / && "$PY" -c "import xdist" 2>/dev/null) && select+=(-n 4)  # compiles in parallel on the host's cores
  log "equivalence: every CUDA backend vs the fp64 reference (cap ${c}s)"
else
  select=(-k "refuse or off_by_one")
  log "no CUDA device: equivalence file's CPU refusal and tolerance checks only (cap ${c}s)"
fi
# fp32 dots in Triton default to TF32 (fla's kernels set no precision): checked here in IEEE fp32, so
# the fp32 cases test the kernels' logic against the fp64 reference, not TF32 rounding. -v: a stage
# cut at its cap still lists each result.
TRITON_F32_DEFAULT=ieee timeout -k 10 "$c" "$PY" -m pytest -p no:cacheprovider tests/test_backends_devices.py \
  "${select[@]}" --timeout 100 -v -rfEs >"$OUT/equivalence.txt" 2>&1
tests_rc=$?
tail -25 "$OUT/equivalence.txt" | tee -a "$LOG"
[ "$tests_rc" = 124 ] && log "equivalence stage cut at its cap (${c}s)"
stage_done equivalence "$t0" "$c" "$tests_rc"

# -- 3. sweep ----------------------------------------------------------------------------------------
t0=$(date +%s); c=$(cap 230 40)
if [ "$MEASURE" = 0 ]; then
  log "no CUDA device: validating the gpu sweep grid only (--dry-run, on cpu)"
  "$PY" -m harness.cli sweep --preset gpu --device cpu --out "$OUT/gpu.jsonl" --dry-run "$@" >"$OUT/gpu_dry_run.txt" 2>&1
  sweep_rc=$?
  tail -3 "$OUT/gpu_dry_run.txt" | tee -a "$LOG"
  stage_done sweep-dry-run "$t0" "$c" "$sweep_rc"
  log "done (equivalence exit status $tests_rc, dry run exit status $sweep_rc)"
  [ "$tests_rc" -eq 0 ] && exit "$sweep_rc"
  exit "$tests_rc"
fi
log "gpu sweep (cap ${c}s; rows are written as cells finish)"
timeout -k 10 "$c" "$PY" -m harness.cli sweep --preset gpu "${device_args[@]}" --out "$OUT/gpu.jsonl" --resume "$@" >"$OUT/sweep.txt" 2>&1
sweep_rc=$?
tail -30 "$OUT/sweep.txt" | tee -a "$LOG"
[ "$sweep_rc" = 124 ] && log "sweep cut at its cap (${c}s): figures and report show the rows written so far"
stage_done sweep "$t0" "$c" "$sweep_rc"

# -- 4. figures and report ---------------------------------------------------------------------------
t0=$(date +%s); c=$(cap 40)
if [ -s "$OUT/gpu.jsonl" ]; then
  timeout -k 5 "$c" bash -c '"$0" -m harness.cli plot "$1/gpu.jsonl" --out "$1/figures" && "$0" -m harness.cli report "$1/gpu.jsonl" --out "$1/report.html"' \
    "$PY" "$OUT" >>"$LOG" 2>&1
  fig_rc=$?
else
  log "no rows to draw"; fig_rc=1
fi
stage_done figures "$t0" "$c" "$fig_rc"
log "done in $(( $(date +%s) - START ))s of ${BUDGET}s (equivalence exit status $tests_rc, sweep $sweep_rc, figures $fig_rc)"
exit "$tests_rc"
