"""accuracy --executor ray|slurm: the local executor's rows from Ray actors (a local Ray instance) and from Slurm jobs
(submitit's local executor: the Slurm code path without a cluster); a unit whose host dies or raises becomes
error/oom rows; bad executor input is one line and exit 2 with nothing written. The remote path itself (units,
chains, the host, the driver's rows) also runs here without an engine, through the local executor."""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys

import pytest
import torch
from test_sweep import registry_restored

from harness.accuracy import remote
from harness.accuracy.jobs import Job
from harness.accuracy.runner import KEY_FIELDS, plan, run_jobs
from harness.accuracy.train import TrainConfig
from harness.cli import main
from harness.executors import ExecutorConfig, pending_jobs, sidecar_path
from harness.results import cell_key, read_rows

pytestmark = pytest.mark.usefixtures("one_thread")

JOB = ["--task", "mqar", "--position", "rope", "--train-len", "16", "--eval-lens", "16,32", "--num-pairs", "2",
       "--vocab-size", "16", "--eval-examples", "8", "--d-model", "32", "--steps", "6", "--batch-size", "4",
       "--no-progress", "--threads", "1"]
VARIANTS = ["--variant", "full", "--variant", "sliding_window:window=4"]
# When and how long, not what: every other column must equal the local executor's (training is seeded and runs on
# one thread in every process, on this one machine).
TIMING = {"timestamp", "train_seconds", "eval_seconds"}
DRIVER = "ATTN_TEST_DRIVER_PID"

# A variant that kills the process training it: the Ray actor or the Slurm job -- a lost host, as far as the driver
# can tell. Accuracy trains in the host's own process; the guard keeps it from ever killing the test run itself.
KILLER = f'''
import os, signal, time
from dataclasses import dataclass
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.registry import register_attention

@dataclass(frozen=True)
class NoParams:
    pass

@register_attention("test_kills_host", config=NoParams)
class KillsHost(Attention):
    backends = (Backend("reference", {{"cpu": ALL_MODES, "cuda": ALL_MODES}}),)

    def backend_reference(self, q, k, v, causal):
        if str(os.getpid()) == os.environ.get("{DRIVER}"):
            raise RuntimeError("test_kills_host ran in the driver")
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        return q
'''


def accuracy(argv):
    """Run ``attn-bench accuracy`` in this process; returns (exit status, stderr). ``--threads`` sets this process's
    torch threads (the local executor trains here): they are restored for the tests that follow."""
    err, threads = io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(["accuracy", *argv])
    finally:
        torch.set_num_threads(threads)
    return rc, err.getvalue()


def by_key(rows):
    return {cell_key(r, KEY_FIELDS): r for r in rows}


def assert_same_rows(got, expected):
    g, e = by_key(got), by_key(expected)
    assert len(g) == len(got) and g.keys() == e.keys()  # each cell once, the same cells
    for k, row in e.items():
        assert set(g[k]) == set(row)  # one schema, whichever executor
        assert {c: v for c, v in g[k].items() if c not in TIMING} == {c: v for c, v in row.items() if c not in TIMING}


@pytest.fixture(scope="module")
def driver_pid():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(DRIVER, str(os.getpid()))  # before Ray starts: its workers inherit the environment
        yield


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "acc.jsonl"
    rc, err = accuracy([*JOB, *VARIANTS, "--out", str(out)])
    assert rc == 0, err
    rows = read_rows(out)
    assert len(rows) == 2 * 2 * 2 and all(r["status"] == "ok" for r in rows)  # variants x lengths x metrics
    return rows


def killer(d):
    (d / "killer.py").write_text(KILLER)
    return ["--variant", "test_kills_host", "--plugin", str(d / "killer.py")]


def assert_killed(rows, where):
    killed = [r for r in rows if r["variant"] == "test_kills_host"]
    assert len(killed) == 4 and all(r["status"] == "error" and r["value"] is None for r in killed)
    assert all(where in r["error"] for r in killed), killed[0]["error"]


ENGINE = pytest.mark.timeout(300)  # a hung engine becomes a failed test, not a stuck CI job


# -- Ray -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_cluster(driver_pid):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
@ENGINE
def test_ray_actors_write_the_local_rows_and_a_killed_host_becomes_error_rows(ray_cluster, local_rows, tmp_path):
    out = tmp_path / "acc.jsonl"
    with registry_restored():
        rc, err = accuracy([*JOB, *VARIANTS, *killer(tmp_path), "--executor", "ray", "--max-concurrency", "2",
                            "--out", str(out)])
    assert rc == 0, err
    rows = read_rows(out)
    assert_same_rows([r for r in rows if r["variant"] != "test_kills_host"], local_rows)
    assert_killed(rows, "Ray worker lost")
    assert all("lost 2 times" in r["error"] for r in rows if r["status"] == "error")  # retried once on a fresh actor
    assert err.count("retrying on a fresh actor") == 1 and "wrote 12 rows" in err
    assert len(list((tmp_path / ".ckpt").glob("*.pt"))) == 2  # the shared checkpoint directory


# -- Slurm through submitit's local executor -----------------------------------------------------

@pytest.mark.slow
@ENGINE
def test_slurm_jobs_write_the_local_rows_and_can_be_left_and_collected(driver_pid, local_rows, tmp_path):
    pytest.importorskip("submitit")
    out = tmp_path / "acc.jsonl"
    slurm = ["--executor", "slurm", "--slurm-cluster", "local", "--slurm-time", "5", "--out", str(out)]
    argv = [*JOB, *VARIANTS, *killer(tmp_path), *slurm]
    with registry_restored():
        rc, err = accuracy([*argv, "--detach"])
        assert rc == 0, err
        assert pending_jobs(out) == 3 and not read_rows(out)  # one job per trained model; nothing collected yet

        rc, err = accuracy(argv)  # a new run into the same file must not start while its jobs are out
        assert rc == 2 and "--resume" in err.strip().splitlines()[-1]

        rc, err = accuracy([*argv, "--resume"])
        assert rc == 0, err
    rows = read_rows(out)
    assert not sidecar_path(out).exists()  # every job collected
    assert_same_rows([r for r in rows if r["variant"] != "test_kills_host"], local_rows)
    assert_killed(rows, "slurm job")
    rc, err = accuracy([*JOB, *VARIANTS, *slurm, "--resume"])  # without the killer: nothing is left to run
    assert rc == 0 and "wrote 0 rows" in err and "submitted" not in err, err


# -- the remote path without an engine -----------------------------------------------------------

def tiny_job(**kw):
    return Job(task="mqar", positions=["rope", "rope_linear"], train_len=16, eval_lens=[16, 32], d_model=32,
               train=TrainConfig(steps=6, batch_size=4),
               task_params={"num_pairs": 2, "vocab_size": 16, "eval_examples": 8}, **kw)


def test_units_sharing_a_trained_model_are_one_chain_and_keys_are_stable():
    p = plan(tiny_job(variants=["full", "sliding_window:window=4"], seeds=[0, 1]))
    units = remote.units([p])
    assert len(units) == len(p.runs) == 8
    chains = remote.chains(units)
    # rope and rope_linear at factor 1 train one model: 2 variants x 2 seeds models, two units each
    assert [len(c.tasks) for c in chains] == [2, 2, 2, 2]
    assert all(len({u.model for u in c.tasks}) == 1 for c in chains)
    fewer = remote.units([plan(tiny_job(variants=["full"], seeds=[1]))])
    assert {remote.unit_key(u) for u in fewer} <= {remote.unit_key(u) for u in units}  # the same run, the same key
    fidelity = plan(Job(task="fidelity", variants=["sliding_window:window=4"], positions=["rope"], seeds=[0, 1],
                        train_len=16, eval_lens=[16], base_task="mqar", train=TrainConfig(steps=2, batch_size=2),
                        task_params={"num_pairs": 2, "vocab_size": 16, "eval_examples": 4}))
    assert [u.run is None for u in remote.units([fidelity])] == [True, False, True, False]  # random inputs per seed


def test_the_remote_path_writes_the_local_rows_and_resumes(tmp_path):
    job = tiny_job()
    local = tmp_path / "local.jsonl"
    run_jobs([plan(job)], local, tmp_path / "ck-local", False, progress=False, echo=lambda s: None)
    out, lines = tmp_path / "remote.jsonl", []
    r = remote.run_remote([plan(job)], out, tmp_path / "ck", False, ExecutorConfig(), threads=1, echo=lines.append)
    rows = read_rows(out)
    assert r.written == len(rows) == 8
    assert_same_rows(rows, read_rows(local))
    assert [cell_key(x, KEY_FIELDS) for x in rows] == [cell_key(x, KEY_FIELDS) for x in read_rows(local)]  # order too
    assert sum(line.startswith("  trained") for line in lines) == 1  # rope_linear reused rope's model on its host
    # a driver killed part-way: the rows it had appended stay, --resume runs only what is missing
    out.write_text("".join(line + "\n" for line in out.read_text().splitlines()[:-3]))
    r = remote.run_remote([plan(job)], out, tmp_path / "ck", True, ExecutorConfig(), threads=1, echo=lines.append)
    assert r.written == 3 and by_key(read_rows(out)).keys() == by_key(rows).keys() and len(read_rows(out)) == 8


def test_a_unit_that_raises_on_its_host_becomes_rows_for_its_missing_cells(tmp_path, monkeypatch):
    @contextlib.contextmanager
    def no_memory():
        raise MemoryError("cannot allocate memory for the unit")
        yield

    monkeypatch.setattr(remote, "memory_cap", no_memory)
    out, lines = tmp_path / "acc.jsonl", []
    r = remote.run_remote([plan(tiny_job())], out, tmp_path / "ck", False, ExecutorConfig(), echo=lines.append)
    rows = read_rows(out)
    assert r.written == len(rows) == len(by_key(rows)) == 8  # every cell of both units, once
    assert all(x["status"] == "oom" and "cannot allocate memory" in x["error"] and x["n"] == 0 for x in rows)
    assert sum("oom: MemoryError" in line for line in lines) == 2  # one line per unit, not per cell


# -- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--executor", "dask"], "'dask' is not one of"),
    (["--executor", "ray", "--max-concurrency", "0"], "--max-concurrency must be an integer >= 1"),
    (["--executor", "slurm", "--slurm-cluster", "local", "--slurm-time", "0"], "--slurm-time must be an integer >= 1"),
    (["--executor", "slurm", "--slurm-cluster", "nope"], "'nope' is not one of"),
    (["--executor", "slurm", "--slurm-cluster", "local", "--slurm-gpus", "x"], "'x' is not a valid integer"),
    (["--executor", "ray", "--detach"], "--detach needs --executor slurm"),
    (["--max-concurrency", "2"], "needs --executor ray or slurm"),
    (["--executor", "ray", "--hf-model", "some/dir"], "is not an existing directory"),  # checked before any host starts
])
def test_bad_executor_input_is_one_line_and_exit_2(tmp_path, args, message):
    out = tmp_path / "acc.jsonl"
    argv = [*JOB, "--out", str(out), *args]
    if "--hf-model" in args:
        argv = ["--out", str(out), *args]
    rc, err = accuracy(argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not out.exists() and not (tmp_path / ".ckpt").exists()


@pytest.mark.parametrize("kind, module, extra", [("ray", "ray", "ray"), ("slurm", "submitit", "slurm")])
def test_a_missing_engine_is_one_line_and_exit_2(tmp_path, monkeypatch, kind, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if it were not installed
    out = tmp_path / "acc.jsonl"
    rc, err = accuracy([*JOB, "--executor", kind, "--out", str(out)])
    assert rc == 2
    assert err.strip().splitlines() == [f"attn-bench: error: --executor {kind} needs {module}: "
                                        f"pip install 'attn-bench[{extra}]'"]
    assert not out.exists()


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="this machine has Slurm")
def test_slurm_without_a_cluster_says_how_to_run_locally(tmp_path):
    pytest.importorskip("submitit")
    out = tmp_path / "acc.jsonl"
    rc, err = accuracy([*JOB, "--executor", "slurm", "--out", str(out)])
    assert rc == 2 and "sbatch not found" in err and "--slurm-cluster local" in err and not out.exists()


def test_a_checkpoint_evaluation_runs_one_unit_per_setting_with_the_local_rows(tmp_path):
    """--hf-model through the remote path (no engine): one unit per setting (variant x position override, its press
    arms inside), rows equal to the local evaluation's; the unit pickles as Ray and submitit ship it."""
    from transformers import AutoModelForCausalLM

    from attn import hf
    from harness.accuracy import pretrained
    from harness.accuracy.tasks import get_checkpoint_task

    cloudpickle = pytest.importorskip("cloudpickle")
    config = hf.tiny_config("llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "ckpt")

    def make():
        passkey = get_checkpoint_task("passkey").config({"depths": (0.5,), "eval_examples": 2})
        return pretrained.plan(tmp_path / "ckpt", ("passkey",), ["full", "sliding_window:window=64,backend=blocked"],
                               ["checkpoint", "rope_yarn:factor=2"], [300], {"passkey": passkey}, ["none"])

    local = tmp_path / "local.jsonl"
    pretrained.run([make()], local, False, echo=lambda s: None)
    units = remote.units([make()])
    assert [u.run for u in units] == [0, 1, 2, 3] and len({remote.unit_key(u) for u in units}) == 4
    assert remote.unit_key(cloudpickle.loads(cloudpickle.dumps(units[1]))) == remote.unit_key(units[1])
    out = tmp_path / "remote.jsonl"
    r = remote.run_remote([make()], out, tmp_path / "ck", False, ExecutorConfig(), threads=1, echo=lambda s: None)
    assert r.written == len(read_rows(local)) == 4
    assert_same_rows(read_rows(out), read_rows(local))
    r = remote.run_remote([make()], out, tmp_path / "ck", True, ExecutorConfig(), threads=1, echo=lambda s: None)
    assert r.written == 0  # resumed: every cell on record
