"""What a measured cell or accuracy job can reach and leave behind (issue 14): the worker imports
nothing from the directory it is started in, a SIGKILL the parent did not send is not called an
out-of-memory kill, an escaped child dies with its worker, and absurd accuracy lengths are refused
up front while real ones run under a memory cap."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.cost.timing import TimingConfig
from harness.cost.worker import Worker, WorkerConfig, child_command

HERE = Path(__file__).resolve().parent
PLUGIN = str(HERE / "plugins" / "escaping.py")
ATTN_BENCH = shutil.which("attn-bench", path=str(Path(sys.executable).parent)) or "attn-bench"
QUICK = TimingConfig(0.01, 0.05)


def plant(directory: Path, module: str = "psutil") -> Path:
    """A module named like one the worker imports, which leaves a marker file if it is ever executed."""
    marker = directory / f"{module}-was-imported"
    (directory / f"{module}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        f"raise ImportError('planted {module} executed')\n")
    return marker


def cell(variant: str, params: dict | None = None) -> dict:
    return {"variant": variant, "variant_params": params or {}, "backend_requested": "auto", "position": "none",
            "position_params": {}, "scope": "op", "mode": "forward", "device": "cpu", "dtype": "float32",
            "batch_size": 1, "num_heads": 1, "head_dim": 8, "seq_len": 16, "layers": None}


# -- 2: the worker imports only installed modules and the named plugins ------------------------------

def test_sweep_run_from_a_directory_with_a_planted_module_does_not_import_it(tmp_path):
    marker = plant(tmp_path)
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([ATTN_BENCH, "sweep", "--variant", "full", "--lengths", "64", "--heads", "1",
                           "--head-dim", "16", "--min-run-time", "0.01", "--max-run-time", "0.05", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), "the worker executed psutil.py from the current directory"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok"], rows


@pytest.mark.parametrize("version", [(3, 10), sys.version_info[:2]])
def test_worker_started_in_a_planted_directory_ignores_it(version, tmp_path, monkeypatch):
    """Both ways of starting the worker: ``-P`` (3.11+) and the bootstrap that drops '' (3.10)."""
    marker = plant(tmp_path)
    monkeypatch.chdir(tmp_path)
    import harness.cost.worker as worker

    monkeypatch.setattr(worker, "child_command", lambda args: child_command(args, version))
    with Worker(WorkerConfig()) as w:
        w.start()  # raises if the worker does not come up; the planted module fails its import
        assert w.proc.poll() is None
    assert not marker.exists()


def test_a_worker_on_a_refs_import_path_ignores_the_planted_directory_too(tmp_path, monkeypatch):
    """sweep --base / --at: the ref's folder goes first on PYTHONPATH, and nothing else comes with it (an empty entry
    would be the current directory)."""
    marker = plant(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "ref").mkdir()
    with Worker(WorkerConfig(path=(str(tmp_path / "ref"),))) as w:
        w.start()
        assert w.proc.poll() is None
    assert not marker.exists()


def test_child_command_keeps_the_current_directory_off_the_path():
    assert child_command(["--fd", "3"], (3, 11))[1:4] == ["-P", "-m", "harness.cost.worker"]
    fallback = child_command(["--fd", "3"], (3, 10))
    assert fallback[1] == "-c" and fallback[3:] == ["harness.cost.worker", "--fd", "3"]


# -- 12: kills the parent did not send; children that escape the process group ---------------------

def test_a_backend_that_sigkills_itself_is_an_error_not_oom():
    with Worker(WorkerConfig(mem_limit_bytes=8 * 2**30, plugins=(PLUGIN,))) as w:
        result = w.run_cell(cell("test_sigkill"), QUICK, seed=0, time_limit_s=60)
        assert w.proc is None  # a fresh worker for the next cell
    assert result["status"] == "error", result
    assert "SIGKILL" in result["error"] and "not out of memory" in result["error"], result


def test_an_escaped_child_in_its_own_session_dies_with_the_timed_out_worker(tmp_path):
    pidfile = tmp_path / "sleep.pid"
    with Worker(WorkerConfig(plugins=(PLUGIN,))) as w:
        result = w.run_cell(cell("test_orphan", {"pidfile": str(pidfile)}), QUICK, seed=0, time_limit_s=2)
        assert result["status"] == "timeout", result
        pid = int(pidfile.read_text())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.05)
        assert not alive(pid), f"sleep {pid} outlived the timed-out worker"


@pytest.mark.parametrize("peak_gib, kills_before, kills_after, status", [
    (0.3, 5, 5, "error"),  # small, and the kernel killed nothing: the backend did it
    (7.6, 5, 5, "oom"),  # near the 8 GiB limit
    (0.3, 5, 6, "oom"),  # the kernel's OOM-kill count rose during the cell
])
def test_an_unexplained_sigkill_is_oom_only_with_evidence(peak_gib, kills_before, kills_after, status, monkeypatch):
    import harness.cost.worker as worker

    w = Worker(WorkerConfig())
    w._peak_rss, w._rss_limit, w._available, w._oom_kills = int(peak_gib * 2**30), 8 * 2**30, 2**40, kills_before
    monkeypatch.setattr(worker, "oom_kill_count", lambda: kills_after)
    got, why = w._judge_sigkill()
    assert got == status, why
    assert ("not out of memory" in why) == (status == "error")


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (a container's init may never reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- 11: accuracy lengths that cannot fit, and the memory cap ----------------------------------------

TINY = ["--steps", "2", "--batch-size", "2", "--no-progress", "--seeds", "0"]


ABSURD = "1000000000000"


def test_the_issue_command_with_an_absurd_train_length_is_refused_by_dry_run(tmp_path):
    """The command of the report, as a user runs it: one line, exit 2, no traceback, nothing written."""
    out = tmp_path / "acc.jsonl"
    proc = subprocess.run([ATTN_BENCH, "accuracy", "--task", "mqar", "--train-len", ABSURD, "--num-pairs", "2", "--out", str(out),
                           "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"train length {ABSURD} cannot fit in memory" in err
    assert not out.exists()


@pytest.mark.parametrize("args, what", [
    (["--train-len", ABSURD], "train length"),
    (["--train-len", "16", "--eval-lens", f"16,{ABSURD}"], "eval length"),
    (["--train-len", "16", "--finetune-steps", "1", "--finetune-len", ABSURD], "fine-tune length"),
    (["--model", "medium", "--train-len", "16", "--batch-size", "1024", "--eval-lens", "16,10000000000"], "eval length"),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_lengths_that_cannot_fit_are_refused_before_anything_runs(args, what, dry_run, tmp_path, capsys):
    from harness.cli import main

    out = tmp_path / "acc.jsonl"
    rc = main(["accuracy", "--task", "mqar", "--variant", "full", "--position", "learned", "--num-pairs", "2", *TINY,
               *args, "--out", str(out), *(["--dry-run"] if dry_run else [])])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"{what} " in err and "cannot fit in memory" in err, err
    assert not out.exists() and not (tmp_path / ".ckpt").exists()


def test_lengths_that_fit_are_accepted():
    from harness.accuracy.runner import Job, check_lengths_fit

    check_lengths_fit(Job("mqar", train_len=4096, eval_lens=[65536]), [65536], 8192, budget=2**30)
    with pytest.raises(ValueError, match="no eval length above"):
        check_lengths_fit(Job("mqar", train_len=16), [16, 2**30], None, budget=2**30)


def test_accuracy_allocation_past_the_memory_cap_is_an_oom_row(tmp_path):
    out = tmp_path / "acc.jsonl"
    proc = subprocess.run([ATTN_BENCH, "accuracy", "--task", "mqar", "--variant", "test_over_cap", "--position", "rope",
                           "--train-len", "16", "--eval-lens", "16", "--num-pairs", "2", "--vocab-size", "16",
                           "--eval-examples", "4", "--plugin", PLUGIN, *TINY, "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and {r["status"] for r in rows} == {"oom"}, rows
    assert "no address-space cap" not in rows[0]["error"]


def test_memory_cap_is_lifted_afterwards():
    from harness.accuracy.runner import memory_cap

    before = resource.getrlimit(resource.RLIMIT_AS)
    with memory_cap() as cap:
        assert cap is not None
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        assert soft != resource.RLIM_INFINITY
        assert soft - psutil.Process(os.getpid()).memory_info().vms <= 0.8 * psutil.virtual_memory().available + 2**30
    assert resource.getrlimit(resource.RLIMIT_AS) == before
