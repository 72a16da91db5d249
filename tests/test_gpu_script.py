"""A rehearsal of scripts/gpu_check.sh on CPU, in a fresh virtual environment that has only what the
H200 image has, installing the rest offline from the pinned wheels (scripts/gpu_wheels.txt).

The image is stood in for by this interpreter's own packages (torch here is the CPU build standing in
for torch 2.11+cu130) seen through a ``.pth`` path entry -- a path, so the editable install of
attn-bench in them is *not* active -- plus triton, which the image has and fla needs at import.
xformers, fla-core and einops are not there, as on the H200: the script must install them.

What a device call brings back is checked on every run's output folder (at most 8 files, 2 folders down,
16 MiB each, plain names); the Pythons the script starts are counted through a shim (one import check
before and one after a single pip call); one run cuts its equivalence stage on purpose.
"""
import json
import os
import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TRITON = "triton==3.6.0"  # the H200 image's version


def pinned() -> list[str]:
    lines = (ROOT / "scripts" / "gpu_wheels.txt").read_text().splitlines()
    return [ln.split("#")[0].strip() for ln in lines if ln.split("#")[0].strip()]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    proc = subprocess.run(["bash", "scripts/gpu_wheels.sh", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def image_python(tmp_path_factory) -> Path:
    """A fresh venv whose only packages are the stand-in image's (see the module docstring)."""
    root = tmp_path_factory.mktemp("image")
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    py = root / "venv" / "bin" / "python"
    # Python 3.12's venv (the image's) bundles no setuptools; 3.11's bundles an old one that would
    # shadow the image's (the project builds with setuptools' own bdist_wheel, >= 70.1).
    subprocess.run([py, "-m", "pip", "uninstall", "--quiet", "--yes", "setuptools"], check=True, timeout=120)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([py, "-c", purelib], text=True).strip())
    extra = root / "image-extra"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(extra), TRITON],
                   check=True, timeout=600)
    (site / "image.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n{extra}\n")
    return py


NAME = re.compile(r"[A-Za-z0-9._-]+")


def run_script(py: Path, wheels: Path, out: Path, site: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    """The script as the device machine runs it, with this slow CPU's caps raised (logic is rehearsed, not time)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "ATTN_BENCH_REQUIRE_BACKENDS")}
    shim = out.parent / "python-shim"  # logs each Python the script starts, then runs it
    shim.write_text(f'#!/bin/sh\necho "$*" >> {out.parent / "python-calls.txt"}\nexec {py} "$@"\n')
    shim.chmod(0o755)
    env.update(PYTHON=str(shim), WHEELS=str(wheels), GPU_CHECK_SITE=str(site), PATH=f"{py.parent}:{env['PATH']}",
               GPU_CHECK_CAP_INSTALL_S="300", GPU_CHECK_CAP_SWEEP_S="600", GPU_CHECK_CAP_REPORT_S="120", **env_extra)
    return subprocess.run(["bash", "scripts/gpu_check.sh", str(out), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


def python_calls(out: Path) -> list[str]:
    """What each Python the script started was for: its first two arguments (``- before``, ``-m pip``)."""
    return [" ".join(line.split()[:2]) for line in (out.parent / "python-calls.txt").read_text().splitlines()]


def assert_comes_back(out: Path) -> list[str]:
    """Everything under ``out`` is what a device call brings back: 8 plain files at most, at most 2 folders
    down ($OUT/a/b/file comes back, $OUT/a/b/c/file does not), 16 MiB each, letters, digits, '.', '_', '-'."""
    found = sorted(out.rglob("*"))
    assert not [p for p in found if p.is_symlink() or not (p.is_file() or p.is_dir())], found
    files = [p.relative_to(out) for p in found if p.is_file()]
    assert len(files) <= 8, files
    for f in files:
        assert len(f.parts) <= 3 and all(NAME.fullmatch(part) for part in f.parts), f
        assert (out / f).stat().st_size <= 16 * 2**20, f
    return [str(f) for f in files]


def git_status() -> str:
    """What the checkout holds beyond its commit, ignored files too; the test runner's own caches aside (the suite's
    other worker writes byte code and hypothesis's constants as it imports, while this test runs)."""
    out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    return "\n".join(line for line in out.splitlines() if "__pycache__/" not in line and " .hypothesis/" not in line)


def test_pinned_wheels_fit_the_carry_limit(wheels):
    files = sorted(wheels.glob("*.whl"))
    assert len(files) == len(pinned())
    assert sum(f.stat().st_size for f in files) < 16 * 2**20  # of the 64 MiB a device call carries


def readme_gpu_section() -> str:
    """The GPU guide (moved from the README to docs/gpu.md)."""
    return (ROOT / "docs" / "gpu.md").read_text()


def test_the_stage_caps_fit_the_budget_and_the_readme_gives_the_call_that_fits():
    """The budget is the caps' sum; the device call's time limit leaves every cut stage its kill grace; the
    guide's call uses that limit and its stage-by-stage GPU time, machine start included, is <= 7 minutes."""
    plan = dict(line.split() for line in subprocess.run(["bash", "scripts/gpu_check.sh", "--plan"], cwd=ROOT,
                                                        capture_output=True, text=True, check=True).stdout.splitlines())
    caps = {stage: int(plan[stage]) for stage in ("install", "equivalence", "sweep", "report")}
    budget, grace, limit = int(plan["budget"]), int(plan["kill_grace"]), int(plan["device_timeout_s"])
    assert sum(caps.values()) == budget <= 330
    # a cut stage's overrun comes out of the later caps: what is left past the budget is the last cut stage's
    # grace, the report's 5 s kill grace and the Pythons' exits
    assert limit == budget + 60 >= budget + grace + 5 + 10
    section = readme_gpu_section()
    assert f'"timeout_s": {limit}' in section and '"carry": [".whl"]' in section and "give_back" in section
    rows = {cells[0]: cells for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| "))}
    for stage, cap in caps.items():
        assert rows[stage][1] == f"{cap} s", rows[stage]
    parts = {name: re.findall(r"≤ (\d+) s", cells[2]) for name, cells in rows.items() if name not in ("stage", "total")}
    assert "machine start" in parts and all(len(p) == 1 for p in parts.values()), parts  # one bound per step
    total = re.findall(r"≤ (\d+) s", rows["total"][2])
    assert sum(int(p[0]) for p in parts.values()) == int(total[0]) <= 7 * 60


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rehearsal")
def test_gpu_check_installs_offline_and_runs_end_to_end_on_cpu(image_python, wheels, tmp_path):
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as run_script: the image's packages only
    for module in ("xformers", "fla", "einops", "attn"):  # not in the stand-in image
        assert subprocess.run([image_python, "-c", f"import {module}"], cwd="/", env=bare,
                              capture_output=True).returncode != 0, module
    before = git_status()
    out, site = tmp_path / "gpu", tmp_path / "site"
    proc = run_script(image_python, wheels, out, site, "--lengths", "1K")
    log = (out / "gpu_check.log").read_text()
    assert proc.returncode == 0, log[-3000:] + proc.stderr[-2000:]
    # one import check before and one after a single pip call; then the equivalence tests and the dry run
    assert python_calls(out) == ["- before", "-m pip", "- after", "-m pytest", "-m harness.cli"]
    assert "every import the check needs succeeds; backends that must run: xformers,fla" in log
    assert "xformers imports" in log and "fla.ops.linear_attn imports" in log
    assert "xformers.ops.fmha.flash.FwOp: fa2F@" in log  # what xformers' FlashAttention-2 operator resolves to
    for name in ("xformers", "fla", "einops"):  # installed offline into the target folder
        assert (site / name).is_dir(), name
    assert not (site / "attn").exists(), "the project runs from the checkout: nothing to build"
    stages = [line.split("\t")[0] for line in (out / "stages.tsv").read_text().splitlines()[1:]]
    assert stages == ["install", "equivalence", "sweep-dry-run"]
    equivalence = (out / "equivalence.txt").read_text()
    assert "passed" in equivalence and "not run:" not in equivalence  # a stage within its cap runs every case
    dry = (out / "gpu_dry_run.txt").read_text()
    for variant in ["full:backend=xformers", "linear:backend=fla", "flex_tile=128", "sliding_window", "block_sparse"]:
        assert variant in dry
    assert assert_comes_back(out) == ["equivalence.txt", "gpu_check.log", "gpu_dry_run.txt", "stages.tsv"]
    assert git_status() == before, "the install stage must not build inside the checkout"
    # what the backends do on first use there, run here against the installed wheels: fla's autotuners are
    # cut to 2 configs each, in fla.modules too (gated_delta_rule's l2norm); xformers' dispatcher is told its
    # torch-kernel operators need no C extension
    probe = """
import sys, torch, fla.ops.linear_attn, xformers.ops
from triton.runtime.autotuner import Autotuner
from fla.ops.common import chunk_h
from attn.attention.linear import limit_fla_autotune
def tuner(k):
    while not isinstance(k, Autotuner):
        k = k.fn
    return k
l2norm = sys.modules["fla.modules.norm.l2norm"]  # imported by fla.ops: gated_delta_rule normalises q and k with it
kernels = [chunk_h.chunk_fwd_kernel_h, l2norm.l2norm_fwd_kernel, l2norm.l2norm_bwd_kernel]
before = [len(tuner(k).configs) for k in kernels]
assert min(before) > 2, before
assert limit_fla_autotune() > 10
assert [len(tuner(k).configs) for k in kernels] == [2, 2, 2], before
torch.cuda.is_available = lambda: True  # after the imports: what a CUDA machine would answer
from attn.attention.full import xformers_extension_note
from xformers.ops.fmha import common
assert "C extension did not load" in xformers_extension_note() and common._built_with_cuda is True
"""
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT}"}
    r = subprocess.run([image_python, "-c", probe], cwd="/", env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rehearsal")
def test_gpu_check_stops_at_once_when_a_needed_import_has_no_wheel(image_python, wheels, tmp_path):
    partial = tmp_path / "wheels"
    partial.mkdir()
    for f in wheels.glob("*.whl"):
        if not f.name.startswith("einops"):
            (partial / f.name).symlink_to(f)
    out = tmp_path / "gpu"
    proc = run_script(image_python, partial, out, tmp_path / "site")
    log = (out / "gpu_check.log").read_text()
    assert proc.returncode == 1
    assert "missing einops: no einops wheel" in log
    assert "still missing after the install stage: einops" in log
    assert python_calls(out) == ["- before", "-m pip", "- after"]
    assert not (out / "equivalence.txt").exists()


def case_outcomes(text: str) -> tuple[dict[str, str], dict[str, str], int | None]:
    """(case -> its reported outcome, case -> CUT or NOT STARTED, cases selected: None if collection never finished)
    from a -v pytest log."""
    reported = dict(m.group(1, 2) for m in re.finditer(r"^(tests/\S+) (PASSED|FAILED|SKIPPED|ERROR)", text, re.M))
    unrun = {m.group(2): m.group(1) for m in re.finditer(r"^(CUT|NOT STARTED) (tests/\S+)$", text, re.M)}
    selected = re.search(r"(\d+) selected", text)
    return reported, unrun, int(selected.group(1)) if selected else None


# A pytest plugin (PYTEST_PLUGINS) that holds the last selected case until the stage's cap interrupts it: the cut
# then lands inside a case, after every other one finished, whatever this machine's speed -- not wherever 15 s fell.
HOLD_PLUGIN = '''
import time


def pytest_runtest_call(item):
    if item is item.session.items[-1]:
        while True:  # until the cap's SIGINT (a KeyboardInterrupt here)
            time.sleep(0.05)
'''


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rehearsal")
def test_gpu_check_measuring_stages_rehearsed_on_cpu_after_a_cut_equivalence_stage(image_python, wheels, tmp_path):
    """Stages 3-4 as on a GPU (sweep, report), on CPU at one length, after an equivalence stage cut at its cap
    on purpose: its log still lists every case, as passed or as never finished. CUDA-only backends become
    `unsupported` rows that say why, the rest are measured, and the report comes from what was written."""
    out = tmp_path / "gpu"
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "gpu_check_hold.py").write_text(HOLD_PLUGIN)
    # The refusals take milliseconds; the last one is held until the cap cuts it. Collecting (importing torch and
    # the test file) may take longer than the cap on a loaded machine: then nothing was collected, which the
    # stage must say too (the second branch below), never a crash of the script or of this test.
    proc = run_script(image_python, wheels, out, tmp_path / "site",
                      "--lengths", "1K", "--variant", "full", "--variant", "full:backend=xformers",
                      "--variant", "linear:backend=fla",
                      GPU_CHECK_SWEEP_ON_CPU="1", GPU_CHECK_EQUIVALENCE_K="refuse", GPU_CHECK_CAP_EQUIVALENCE_S="25",
                      PYTEST_PLUGINS="gpu_check_hold", PYTHONPATH=str(hold))
    log = (out / "gpu_check.log").read_text()
    assert proc.returncode == 124, log[-3000:]  # the script's status is the equivalence stage's: cut
    stages = [line.split("\t") for line in (out / "stages.tsv").read_text().splitlines()[1:]]
    assert [(s[0], s[3]) for s in stages] == [("install", "0"), ("equivalence", "124"), ("sweep", "0"), ("report", "0")]
    assert "equivalence stage cut at its cap (25s)" in log
    equivalence = (out / "equivalence.txt").read_text()
    reported, unrun, selected = case_outcomes(equivalence)
    if selected is None:  # cut while collecting: no case ran, and both files say so
        assert not reported and not unrun, equivalence[-3000:]
        assert "not run: every case, the cut came before collection finished" in equivalence
        assert "not run: every case, the cut came before collection finished" in log
    else:  # cut inside a case (the held one, unless the cap fell within the milliseconds of another): one CUT
        assert unrun and list(unrun.values()).count("CUT") == 1, equivalence[-3000:]
        assert not set(reported) & set(unrun) and len(reported) + len(unrun) == selected, equivalence[-3000:]
        assert set(reported.values()) <= {"PASSED"} and all("refuse" in c for c in [*reported, *unrun]), reported
        assert f"not run: {len(unrun)} of {selected} cases" in log  # the stage's counts reach the log too
    rows = [json.loads(line) for line in (out / "gpu.jsonl").read_text().splitlines()]
    by_backend = {(r["variant"], r["backend_requested"], r["status"]) for r in rows}
    assert ("full", "xformers", "unsupported") in by_backend and ("linear", "fla", "unsupported") in by_backend
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r["peak_timing"] == "cell" and r["host_limit_rule"] == "available" for r in ok)
    assert all(r["error"] for r in rows if r["status"] == "unsupported")
    assert assert_comes_back(out) == ["equivalence.txt", "gpu.jsonl", "gpu_check.log", "report.html", "stages.tsv",
                                      "sweep.txt"]
