#!/usr/bin/env bash
# One-shot GPU check for a machine that can fetch nothing, sized so one run (machine start included)
# takes under 7 of the 15 minutes a lent H200 gives, leaving time for a rerun. Stages and their caps
# (GPU_CHECK_CAP_<STAGE>_S; the budget GPU_CHECK_BUDGET_S defaults to their sum, and each cap is also cut
# to what the budget has left after the later stages' caps):
#   1. install      (30 s) one Python tries every import the check needs and names what is missing; one
#                          offline pip call installs that from the carried wheels (WHEELS, default .whl,
#                          --no-deps into a --target folder on PYTHONPATH); the same check again after it
#                          (each call has a 90 s hang guard: a cut install would only be a failed check)
#   2. equivalence (110 s) every CUDA backend vs the fp64 reference, cheapest first, on 12 pytest-xdist
#                          workers; a backend whose wheel was carried must run
#   3. sweep       (170 s) the `gpu` preset (bf16; forward 4K/16K/128K, train 16K), the most valuable
#                          rows first; cut at the cap, the rows so far are kept
#   4. report       (20 s) report.html of whatever rows exist (--all-figures: every figure embedded, no PNGs to bring back)
# A stage cut at its cap is stopped with SIGINT (`timeout -s INT -k 25`), so pytest still prints each
# case's result, and scripts/pytest_unrun.py the cases it never finished. OUT_DIR ends with at most 6
# files, no folders: what a device call brings back is 8 files, 2 folders deep.
# Usage: scripts/gpu_check.sh OUT_DIR [extra sweep options, e.g. --lengths 1K]
#        scripts/gpu_check.sh --plan   (the caps, the budget and the time limit to give the device call)
# Without a GPU it runs the same install stage, the CPU half of the equivalence file's refusal and
# tolerance checks, and validates the gpu sweep grid (--dry-run): tests/test_gpu_script.py rehearses
# it that way in a fresh virtual environment. Wheels to carry: scripts/gpu_wheels.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGES="install equivalence sweep report"
declare -A CAP=([install]=${GPU_CHECK_CAP_INSTALL_S:-30} [equivalence]=${GPU_CHECK_CAP_EQUIVALENCE_S:-110}
                [sweep]=${GPU_CHECK_CAP_SWEEP_S:-170} [report]=${GPU_CHECK_CAP_REPORT_S:-20})
# Seconds a cut stage has after its SIGINT before SIGKILL: pytest-xdist waits 10 s for its workers before it
# kills them and prints the summary (11 s measured); the sweep closes its worker in 5 s at most.
GRACE=25
total=0; for s in $STAGES; do total=$(( total + CAP[$s] )); done
BUDGET=${GPU_CHECK_BUDGET_S:-$total}
if [ "${1:-}" = --plan ]; then
  for s in $STAGES; do echo "$s ${CAP[$s]}"; done
  echo "budget $BUDGET"
  echo "kill_grace $GRACE"
  # a cut stage's grace, the report's 5 s and the Pythons' exits fit in the margin: the device call's timeout_s
  echo "device_timeout_s $(( BUDGET + 60 ))"
  exit 0
fi
OUT=${1:-results/gpu}
shift || true
mkdir -p "$OUT"
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SITE=${GPU_CHECK_SITE:-/tmp/attn_bench_site}
START=$(date +%s)
LOG="$OUT/gpu_check.log"
: >"$LOG"
printf 'stage\tseconds\tcap_s\texit_status\n' >"$OUT/stages.tsv"
log() { echo "[gpu_check $(date +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# cap STAGE: its cap, cut to what is left once the later stages' caps are kept back.
cap() {
  local c=${CAP[$1]} later=0 seen=0 s l
  for s in $STAGES; do [ "$seen" = 1 ] && later=$(( later + CAP[$s] )); [ "$s" = "$1" ] && seen=1; done
  l=$(( $(left) - later )); [ "$l" -lt "$c" ] && c=$l; [ "$c" -lt 5 ] && c=5; echo "$c"
}
stage_done() { printf '%s\t%s\t%s\t%s\n' "$1" "$(( $(date +%s) - $2 ))" "$3" "$4" >>"$OUT/stages.tsv"; }
# The project is pure Python: it runs from the checkout, so nothing is built and nothing lands in it.
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1
mkdir -p "$SITE"

# check_imports PHASE MODULE:DIST...: one Python, run from / (so only what is installed or on PYTHONPATH
# counts), imports every MODULE and prints `missing MODULE DIST: why` for each that fails. After the
# install it also says what xformers' FlashAttention-2 operator resolves to and whether CUDA works.
check_imports() {
  (cd / && timeout -k 5 "$HANG_S" "$PY" - "$@" <<'EOF'
import importlib, sys

phase, pairs = sys.argv[1], sys.argv[2:]
for pair in pairs:
    module, dist = pair.split(":")
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001  (a wheel that does not load is as missing as one not there)
        print(f"missing {module} {dist}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
if phase == "after":
    import torch

    cuda = torch.cuda.is_available()
    print(f"python {sys.executable} {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"device: {torch.cuda.get_device_name() if cuda else 'none'}")
    try:  # a torch/xformers schema mismatch shows here first
        from xformers.ops.fmha import flash

        schema = getattr(getattr(torch.ops.aten, "_flash_attention_forward", None), "default", None)
        print(f"xformers.ops.fmha.flash.FwOp: {flash.FwOp.NAME} -> {flash.FwOp.OPERATOR}; torch's own flash kernels: "
              f"{getattr(flash, '_USE_PT_FLASH_ATTN', 'unknown')}; aten::_flash_attention_forward: {getattr(schema, '_schema', 'absent')}")
    except Exception as e:  # noqa: BLE001
        print(f"xformers.ops.fmha.flash.FwOp: does not resolve: {type(e).__name__}: {e}")
    print(f"cuda {'yes' if cuda else 'no'}")
EOF
  )
}

# -- 1. install --------------------------------------------------------------------------------------
# A cut install is a failed check, so its cap is no cut: each of its three calls has a hang guard, and
# the later stages' caps take back any time it overran.
t0=$(date +%s); c=$(cap install); HANG_S=90
# module:distribution, everything the check imports. The first block is what the H200 image has; the
# optional ones are the GPU backends (distribution names as their wheel files spell them).
NEEDED="torch:torch numpy:numpy pandas:pandas matplotlib:matplotlib seaborn:seaborn click:click tqdm:tqdm
psutil:psutil safetensors:safetensors scipy:scipy pytest:pytest hypothesis:hypothesis
pytest_timeout:pytest_timeout einops:einops"
OPTIONAL="xformers:xformers fla.ops.linear_attn:fla_core"
PROJECT="attn:attn harness.cli:harness harness.cost.command:harness harness.analysis.report:harness"
TOOLS="xdist:pytest_xdist"  # optional: without it the equivalence stage runs in one process
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"
# shellcheck disable=SC2086
before=$(check_imports before $NEEDED $OPTIONAL 2>&1); echo "$before" >>"$LOG"
wheels=()
while read -r _ mod dist _; do
  found=$(ls "$WHEELS"/"${dist%:}"-*.whl 2>/dev/null | head -1)
  if [ -n "$found" ]; then wheels+=("$found"); log "missing $mod: installing $(basename "$found")"
  else log "missing $mod: no ${dist%:} wheel in $WHEELS"; fi
done < <(grep '^missing ' <<<"$before")
if [ ${#wheels[@]} -gt 0 ]; then
  timeout -k 5 "$HANG_S" "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${wheels[@]}" >>"$LOG" 2>&1 || log "pip could not install ${wheels[*]}"
fi
# shellcheck disable=SC2086
after=$(check_imports after $NEEDED $PROJECT $OPTIONAL $TOOLS 2>&1); echo "$after" | tee -a "$LOG"
missing=""; required=""
for pair in $NEEDED $PROJECT; do grep -q "^missing ${pair%%:*} " <<<"$after" && missing="$missing ${pair%%:*}"; done
for pair in $OPTIONAL; do
  mod=${pair%%:*}; dist=${pair##*:}
  if grep -q "^missing $mod " <<<"$after"; then log "$mod does not import (why: above)"; else log "$mod imports"; fi
  # A backend whose wheel was carried must work: the equivalence stage fails if it is refused.
  ls "$WHEELS"/"$dist"-*.whl >/dev/null 2>&1 && required="$required,${mod%%.*}"
done
export ATTN_BENCH_REQUIRE_BACKENDS=${required#,}
if [ -n "$missing" ] || ! grep -q '^cuda ' <<<"$after"; then
  log "still missing after the install stage:${missing:- (the import check did not finish)} -- carry their wheels in $WHEELS (scripts/gpu_wheels.txt)"
  stage_done install "$t0" "$c" 1
  exit 1
fi
log "every import the check needs succeeds; backends that must run: ${ATTN_BENCH_REQUIRE_BACKENDS:-none}"
stage_done install "$t0" "$c" 0

if grep -q '^cuda yes' <<<"$after"; then CUDA=1; else CUDA=0; fi
# GPU_CHECK_SWEEP_ON_CPU=1 runs the measuring stages on CPU (the rehearsal of stages 3-4; CUDA-only
# backends then record `unsupported` rows with their reasons).
MEASURE=$CUDA; device_args=()
[ "${GPU_CHECK_SWEEP_ON_CPU:-0}" = 1 ] && [ "$CUDA" = 0 ] && MEASURE=1 && device_args=(--device cpu)

# -- 2. equivalence ----------------------------------------------------------------------------------
t0=$(date +%s); c=$(cap equivalence)
# GPU_CHECK_EQUIVALENCE_K: another -k selection (a rerun of what a cut run did not reach, say)
if [ "$CUDA" = 1 ]; then
  select=(-k "${GPU_CHECK_EQUIVALENCE_K:-cuda}")  # the CPU cases run in CI
  # The work is compiles (Flex's Inductor, fla's Triton), so one worker per core or so, each compiling
  # in-process (TORCHINDUCTOR_COMPILE_THREADS=1): twelve pools of compile processes would fight for 16 cores.
  grep -q '^missing xdist ' <<<"$after" || select+=(-n "${GPU_CHECK_TEST_WORKERS:-12}")
  log "equivalence: every CUDA backend vs the fp64 reference (cap ${c}s, ${select[*]})"
else
  select=(-k "${GPU_CHECK_EQUIVALENCE_K:-refuse or off_by_one}")
  log "no CUDA device: equivalence file's CPU refusal and tolerance checks only (cap ${c}s)"
fi
# fp32 dots in Triton default to TF32 (fla's kernels mostly set no precision): checked here in IEEE fp32.
# Not every one: fla's gated_delta_rule hard-codes tf32 in its triangular solve on sm80+, so that backend's
# fp32 cases keep the TF32 floor of attn.checks' tolerance. `-o addopts=` drops the project's -q (with -v
# it would leave xdist's dots only); SIGINT, not SIGTERM, lets pytest print its summary.
TRITON_F32_DEFAULT=ieee TORCHINDUCTOR_COMPILE_THREADS=1 PYTHONPATH="$PWD/scripts:$PYTHONPATH" \
  timeout -s INT -k "$GRACE" "$c" "$PY" -m pytest -p no:cacheprovider -p pytest_unrun -o addopts= -v -rfEs \
  tests/test_backends_devices.py "${select[@]}" --timeout 90 >"$OUT/equivalence.txt" 2>&1
tests_rc=$?
grep -E '^=+ .*(passed|failed|error|skipped|no tests ran|not run).* =+$' "$OUT/equivalence.txt" | tee -a "$LOG"
[ "$tests_rc" = 124 ] && log "equivalence stage cut at its cap (${c}s): equivalence.txt lists every case's result, and those not run"
stage_done equivalence "$t0" "$c" "$tests_rc"

# -- 3. sweep ----------------------------------------------------------------------------------------
t0=$(date +%s); c=$(cap sweep)
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
timeout -s INT -k "$GRACE" "$c" "$PY" -m harness.cli sweep --preset gpu "${device_args[@]}" --out "$OUT/gpu.jsonl" --resume "$@" \
  >"$OUT/sweep.txt" 2>&1
sweep_rc=$?
tail -20 "$OUT/sweep.txt" | tee -a "$LOG"
[ "$sweep_rc" = 124 ] && log "sweep cut at its cap (${c}s): the report shows the rows written so far"
stage_done sweep "$t0" "$c" "$sweep_rc"

# -- 4. report ---------------------------------------------------------------------------------------
t0=$(date +%s); c=$(cap report)
if [ -s "$OUT/gpu.jsonl" ]; then
  timeout -s INT -k 5 "$c" "$PY" -m harness.cli report "$OUT/gpu.jsonl" --all-figures --out "$OUT/report.html" >>"$LOG" 2>&1
  report_rc=$?
else
  log "no rows to report"; report_rc=1
fi
stage_done report "$t0" "$c" "$report_rc"
log "files under $OUT: $(find "$OUT" -type f | wc -l) (8 come back); done in $(( $(date +%s) - START ))s of ${BUDGET}s" \
    "(equivalence exit status $tests_rc, sweep $sweep_rc, report $report_rc)"
exit "$tests_rc"
