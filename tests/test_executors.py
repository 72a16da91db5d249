"""Executors: the same sweep on a local Ray cluster and through submitit's local executor (the Slurm code path
without a cluster), against the real engines; a host lost mid-cell; the chain that skips after a failure."""
from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sweep import registry_restored

from harness.cli import main
from harness.cost import KEY_FIELDS
from harness.cost.spec import build_spec, expand, load_spec
from harness.cost.sweep import CostChain, make_chains
from harness.environment import environment
from harness.executors import ExecutorConfig, drive, pending_jobs, sidecar_path
from harness.results import cell_key, read_rows

FAST = ["--heads", "2", "--head-dim", "8", "--min-run-time", "0.01", "--max-run-time", "0.05", "--retries", "0"]
# Two configurations x two lengths; backend=blocked keeps sliding window off FlexAttention (no compile).
GRID = ["--variant", "full", "--variant", "sliding_window:window=16,backend=blocked", "--lengths", "64,128", *FAST]
# The same grid as a sweep file, plus one cell of the host killer (first: its lost hosts overlap the other cells).
WITH_KILLER = """
heads = 2
head_dim = 8
min_run_time = 0.01
max_run_time = 0.05
plugin = "killer.py"

[[grid]]
variant = "test_kills_host"
lengths = [64]

[[grid]]
variant = [{variants}]
lengths = [64, 128]
"""

# A variant whose worker kills its own parent: the Ray actor or the Slurm job that holds the worker --
# a lost machine, as far as the driver can tell. Never run it with the local executor (its parent is the sweep).
KILLER = '''
import os, signal, time
from dataclasses import dataclass
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.registry import register_attention

@dataclass(frozen=True)
class NoParams:
    pass

@register_attention("test_kills_host", config=NoParams)
class KillsHost(Attention):
    backends = (Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}),)

    def backend_reference(self, q, k, v, causal):
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)
        return q
'''


def sweep(argv):
    """Run ``attn-bench sweep`` in this process; returns (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["sweep", *argv])
    return rc, err.getvalue()


def keys(rows):
    return {cell_key(r, KEY_FIELDS) for r in rows}


# Each host starts Python, torch and a worker process: seconds apiece. The timeout turns a hung sweep
# into a failed test instead of a stuck CI job.
ENGINE = pytest.mark.timeout(400)


# -- Slurm through submitit's local executor -----------------------------------------------------

@pytest.mark.slow
@ENGINE
def test_slurm_jobs_can_be_left_and_collected_later(tmp_path):
    pytest.importorskip("submitit")
    out = tmp_path / "rows.jsonl"
    argv = ["--config", str(killer_sweep(tmp_path, "full")), "--executor", "slurm", "--slurm-cluster", "local",
            "--slurm-time", "5", "--out", str(out)]
    with registry_restored():
        rc, err = sweep([*argv, "--detach"])
        assert rc == 0, err
        assert pending_jobs(out) == 2 and not read_rows(out)  # one job per configuration; nothing collected yet
        jobs = json.loads(sidecar_path(out).read_text())["jobs"]
        assert sorted(len(j["keys"]) for j in jobs.values()) == [1, 2]

        rc, err = sweep(argv)  # a second sweep into the same file must not start while jobs are out
        assert rc == 2 and "--resume" in err.strip().splitlines()[-1]

        rc, err = sweep([*argv, "--resume"])
        assert rc == 1, err  # every cell of test_kills_host ended in error: the sweep says so in its exit status
        assert "every cell of test_kills_host failed" in err
    rows = read_rows(out)
    assert not sidecar_path(out).exists()  # every job collected
    assert len(rows) == len(keys(rows)) == 3
    got = {(r["variant"], r["seq_len"]): r for r in rows}
    assert all(got[("full", L)]["status"] == "ok" and got[("full", L)]["executor"] == "slurm" for L in (64, 128))
    killed = got[("test_kills_host", 64)]
    assert killed["status"] == "error" and "slurm job" in killed["error"] and "ended before" in killed["error"]

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        # collected and complete: resuming runs nothing; the file still holds a variant that failed everywhere
        assert main(["sweep", *argv, "--resume"]) == 1
    assert len(read_rows(out)) == 3


# -- Ray -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "rows.jsonl"
    rc, err = sweep([*GRID, "--out", str(out)])
    assert rc == 0, err
    return read_rows(out)


def killer_sweep(d, *variants):
    (d / "killer.py").write_text(KILLER)
    (d / "sweep.toml").write_text(WITH_KILLER.format(variants=", ".join(f'"{v}"' for v in variants)))
    return d / "sweep.toml"


@pytest.fixture(scope="module")
def ray_rows(ray_cluster, tmp_path_factory):
    d = tmp_path_factory.mktemp("ray")
    out = d / "rows.jsonl"
    config = killer_sweep(d, "full", "sliding_window:window=16,backend=blocked")
    with registry_restored():
        rc, err = sweep(["--config", str(config), "--executor", "ray", "--max-concurrency", "2", "--out", str(out)])
    assert rc == 1, err  # test_kills_host ends in error everywhere (by design): exit status 1 says so
    return read_rows(out), err


@pytest.mark.slow
@ENGINE
def test_ray_measures_the_same_cells_as_the_local_executor(local_rows, ray_rows):
    rows, _ = ray_rows
    measured = [r for r in rows if r["variant"] != "test_kills_host"]
    assert len(measured) == len(keys(measured)) == len(local_rows) == 4  # each cell once
    assert keys(measured) == keys(local_rows)
    assert {frozenset(r) for r in measured} == {frozenset(r) for r in local_rows}  # one schema, whichever executor
    assert all(r["status"] == "ok" and r["latency_ms"] > 0 and r["peak_flops_per_s"] > 0 for r in measured)
    assert {r["executor"] for r in rows} == {"ray"} and {r["executor"] for r in local_rows} == {"local"}
    assert len({r["run_id"] for r in rows}) == 1


@pytest.mark.slow
@ENGINE
def test_ray_rows_describe_the_actor_that_measured_them(ray_rows):
    rows, _ = ray_rows
    # Ray gives a one-CPU actor OMP_NUM_THREADS=1; this driver runs torch with its own thread count, so the
    # thread count on a row says which process took the environment.
    measured = [r for r in rows if r["status"] == "ok"]
    assert {r["num_threads"] for r in measured} == {1}
    assert all(r["hostname"] == environment()["hostname"] for r in measured)  # one machine here


@pytest.mark.slow
@ENGINE
def test_a_ray_worker_killed_mid_cell_is_retried_once_then_recorded(ray_rows):
    rows, err = ray_rows
    (killed,) = [r for r in rows if r["variant"] == "test_kills_host"]
    assert killed["status"] == "error" and killed["latency_ms"] is None
    assert "Ray worker lost" in killed["error"] and "lost 2 times" in killed["error"]
    assert err.count("retrying on a fresh actor") == 1


# -- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, module, extra", [("ray", "ray", "ray"), ("slurm", "submitit", "slurm")])
def test_a_missing_engine_is_one_line_and_exit_2(tmp_path, monkeypatch, kind, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if it were not installed
    out = tmp_path / "x.jsonl"
    rc, err = sweep(["--variant", "full", "--lengths", "64", "--executor", kind, "--out", str(out)])
    assert rc == 2
    assert err.strip().splitlines() == [f"attn-bench: error: --executor {kind} needs {module}: "
                                        f"pip install 'attn-bench[{extra}]'"]
    assert not out.exists()


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="this machine has Slurm")
def test_slurm_without_a_cluster_says_how_to_run_locally(tmp_path):
    pytest.importorskip("submitit")
    rc, err = sweep(["--variant", "full", "--lengths", "64", "--executor", "slurm", "--out", str(tmp_path / "x.jsonl")])
    assert rc == 2 and "sbatch not found" in err and "--slurm-cluster local" in err


def test_executor_settings_come_from_the_sweep_file_and_are_checked(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('variant = "full"\nexecutor = "slurm"\nslurm_cluster = "local"\nslurm_partition = "gpu"\n'
                 'slurm_time = 30\nslurm_gpus = 2\nmax_concurrency = 4\n')
    spec = load_spec(config=f, cli={"max_concurrency": 8})
    assert spec.run.executor == ExecutorConfig(kind="slurm", slurm_cluster="local", slurm_partition="gpu", slurm_time=30,
                                               slurm_gpus=2, max_concurrency=8)
    for text, message in [('executor = "dask"', "valid: local, ray, slurm"),
                          ("max_concurrency = 0", "integer >= 1"),
                          ("max_concurrency = 2", "needs --executor ray or slurm"),
                          ('executor = "ray"\ndetach = true', "--detach needs --executor slurm")]:
        f.write_text(f'variant = "full"\n{text}\n')
        with pytest.raises(ValueError, match=message):
            load_spec(config=f)


# -- chains: skipping after a failure, wherever the chain runs -----------------------------------

class ScriptedHost:
    """Answers each cell with the status scripted for its length (the worker's real statuses are tested in
    test_sweep; here only the order and the skipping are under test)."""

    def __init__(self, statuses):
        self.statuses, self.ran = statuses, []

    def run(self, cell):
        self.ran.append(cell.seq_len)
        return {"result": {"status": self.statuses[cell.seq_len], "error": None}, "env": {"hostname": "h"},
                "run_id": "r", "extra": {}}

    def close(self):
        pass


LENGTHS = [16, 32, 64, 128, 256]


@given(st.lists(st.sampled_from(["ok", "oom", "timeout", "error", "unsupported"]), min_size=5, max_size=5),
       st.permutations(LENGTHS))
def test_a_chain_runs_lengths_in_order_and_skips_after_oom_or_timeout(statuses, order):
    script = dict(zip(LENGTHS, statuses, strict=True))
    cells = {c.seq_len: c for c in expand(build_spec([("t", {"variant": ["full"], "lengths": LENGTHS})]))}
    (chain,) = make_chains([cells[L] for L in order], {}, skip=True)
    host, got = ScriptedHost(script), {}
    drive(chain, host, lambda cell, payload: got.__setitem__(cell.seq_len, payload["result"]))
    first = next((L for L in LENGTHS if script[L] in ("oom", "timeout")), None)
    expected_run = [L for L in LENGTHS if first is None or L <= first]
    assert host.ran == expected_run  # ascending, and nothing past the first oom/timeout
    for L in LENGTHS:
        if L in expected_run:
            assert got[L]["status"] == script[L]
        else:
            assert got[L]["status"] == "skipped" and f"{script[first]} at seq_len {first}" in got[L]["error"]


def test_without_skipping_every_cell_is_its_own_chain():
    cells = expand(build_spec([("t", {"variant": ["full", "linear"], "lengths": [16, 32]})]))
    chains = make_chains(cells, {}, skip=False)
    assert sorted(len(c.tasks) for c in chains) == [1, 1, 1, 1]
    with_skip = make_chains(cells, {cells[0].config_key(): ("oom", 8)}, skip=True)
    assert [len(c.tasks) for c in with_skip] == [2, 2]
    assert isinstance(with_skip[0], CostChain) and with_skip[0].next()[1]["result"]["status"] == "skipped"


def test_a_jobs_rows_file_is_read_once_and_a_torn_line_waits(tmp_path):
    """The driver tails a job's rows file: each complete line once, a line still being written not yet."""
    pytest.importorskip("submitit")
    from harness.executors.slurm import SlurmExecutor, _Job

    cells = expand(build_spec([("t", {"variant": ["full"], "lengths": [16, 32]})]))
    by_key = {c.key(): c for c in cells}
    ex = SlurmExecutor(ExecutorConfig(kind="slurm", slurm_cluster="local"), tmp_path / "o.jsonl")
    ex.folder = tmp_path
    payload = {"result": {"status": "ok"}, "env": None, "run_id": None, "extra": {}}
    (tmp_path / "t.rows.jsonl").write_text("".join(json.dumps([c.key(), payload]) + "\n" for c in cells) + '["torn')
    job, seen = _Job("t", "1", list(by_key)), []
    ex._drain(job, by_key, lambda cell, p: seen.append(cell.seq_len))
    ex._drain(job, by_key, lambda cell, p: seen.append(cell.seq_len))  # nothing new: the offset moved past them
    assert seen == [16, 32] and job.seen == set(by_key)
