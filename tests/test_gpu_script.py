"""A rehearsal of scripts/gpu_check.sh on CPU, in a fresh virtual environment that has only what the
H200 image has, installing the rest offline from the pinned wheels (scripts/gpu_wheels.txt).

The image is stood in for by this interpreter's own packages (torch here is the CPU build standing in
for torch 2.11+cu130) seen through a ``.pth`` path entry -- a path, so the editable install of
attn-bench in them is *not* active -- plus triton, which the image has and fla needs at import.
xformers, fla-core and einops are not there, as on the H200: the script must install them.
"""
import os
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


def run_script(py: Path, wheels: Path, out: Path, site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "ATTN_BENCH_REQUIRE_BACKENDS")}
    env.update(PYTHON=str(py), WHEELS=str(wheels), GPU_CHECK_SITE=str(site), PATH=f"{py.parent}:{env['PATH']}")
    return subprocess.run(["bash", "scripts/gpu_check.sh", str(out), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


def git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=ROOT,
                          capture_output=True, text=True).stdout


def test_pinned_wheels_fit_the_carry_limit(wheels):
    files = sorted(wheels.glob("*.whl"))
    assert len(files) == len(pinned())
    assert sum(f.stat().st_size for f in files) < 16 * 2**20  # of the 64 MiB a device call carries


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rehearsal")
def test_gpu_check_installs_offline_and_runs_end_to_end_on_cpu(image_python, wheels, tmp_path):
    for module in ("xformers", "fla", "einops", "attn"):  # not in the stand-in image
        assert subprocess.run([image_python, "-c", f"import {module}"], cwd="/", capture_output=True).returncode != 0, module
    before = git_status()
    out, site = tmp_path / "gpu", tmp_path / "site"
    proc = run_script(image_python, wheels, out, site, "--lengths", "1K")
    log = (out / "gpu_check.log").read_text()
    assert proc.returncode == 0, log[-3000:] + proc.stderr[-2000:]
    assert "every import the check needs succeeds; backends that must run: xformers,fla" in log
    assert "xformers imports" in log and "fla.ops.linear_attn imports" in log
    for name in ("xformers", "fla", "einops", "attn", "harness"):  # installed offline into the target folder
        assert (site / name).is_dir(), name
    stages = [line.split("\t")[0] for line in (out / "stages.tsv").read_text().splitlines()[1:]]
    assert stages == ["install", "equivalence", "sweep-dry-run"]
    assert "passed" in (out / "equivalence.txt").read_text()
    dry = (out / "gpu_dry_run.txt").read_text()
    for variant in ["full:backend=xformers", "linear:backend=fla", "flex_tile=128", "sliding_window", "block_sparse"]:
        assert variant in dry
    assert not (out / "gpu.jsonl").exists(), "a dry run measures nothing and writes no results"
    assert git_status() == before, "the install stage must not build inside the checkout"
    # what the backends do on first use there, run here against the installed wheels: fla's autotuners are
    # cut to 2 configs each; xformers' dispatcher is told its torch-kernel operators need no C extension
    probe = """
import torch, fla.ops.linear_attn, xformers.ops
from attn.attention.linear import limit_fla_autotune
from fla.ops.common import chunk_h
assert limit_fla_autotune() > 10
k = chunk_h.chunk_fwd_kernel_h
while not hasattr(k, "configs"):
    k = k.fn
assert len(k.configs) == 2, len(k.configs)
torch.cuda.is_available = lambda: True  # after the imports: what a CUDA machine would answer
from attn.attention.full import xformers_extension_note
from xformers.ops.fmha import common
assert "C extension did not load" in xformers_extension_note() and common._built_with_cuda is True
"""
    env = {**os.environ, "PYTHONPATH": str(site)}
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
    assert "still missing after the install stage: einops" in log
    assert not (out / "equivalence.txt").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rehearsal")
def test_gpu_check_measuring_stages_rehearsed_on_cpu(image_python, wheels, tmp_path):
    """Stages 3-4 as on a GPU (sweep, figures, report), on CPU at one length: CUDA-only backends become
    `unsupported` rows that say why, the rest are measured, and the figures come from what was written."""
    import json

    out = tmp_path / "gpu"
    env_extra = {"GPU_CHECK_SWEEP_ON_CPU": "1"}
    os.environ.update(env_extra)
    try:
        proc = run_script(image_python, wheels, out, tmp_path / "site", "--lengths", "1K")
    finally:
        for k in env_extra:
            os.environ.pop(k)
    log = (out / "gpu_check.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    stages = [line.split("\t") for line in (out / "stages.tsv").read_text().splitlines()[1:]]
    assert [s[0] for s in stages] == ["install", "equivalence", "sweep", "figures"]
    assert stages[-1][3] == "0", log[-2000:]
    rows = [json.loads(line) for line in (out / "gpu.jsonl").read_text().splitlines()]
    by_backend = {(r["variant"], r["backend_requested"], r["status"]) for r in rows}
    assert ("full", "xformers", "unsupported") in by_backend and ("linear", "fla", "unsupported") in by_backend
    assert any(r["status"] == "ok" for r in rows)
    assert all(r["error"] for r in rows if r["status"] == "unsupported")
    assert (out / "report.html").stat().st_size > 0 and any((out / "figures").rglob("*.png"))
