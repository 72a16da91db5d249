"""How the cost half is put together: scopes as a registry, a sweep as one pass, the memory policy in harness.memory,
every sweep option declared once. (What the cells measure is tested in test_sweep, test_worker and test_flops.)"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import harness.cost.sweep as sweep
import harness.results as results
from harness.cli import main
from harness.cost import SCOPES, Cell, Measured, Scope, build, register_scope
from harness.cost.command import sweep_command
from harness.cost.options import cli_names, spec_keys
from harness.cost.scopes.op import OpScope, build_op
from harness.cost.spec import GRID_KEYS, RUN_KEYS, Grid, RunSettings, build_spec, expand
from harness.executors import EXECUTOR_KEYS
from harness.memory import available_budget
from harness.plugins import absolute_plugins

REPO = Path(__file__).resolve().parents[1]


def cli_spec(**options):
    return build_spec([("command line", options)])


# -- scopes ----------------------------------------------------------------------------------------

def test_each_scope_registers_from_its_own_file_in_the_order_scope_lists_them():
    assert list(SCOPES) == ["op", "model", "hf"]
    for name, scope in SCOPES.items():
        assert type(scope).__module__ == f"harness.cost.scopes.{name}" and scope.name == name
    with pytest.raises(ValueError, match="scope 'op' is already registered"):
        register_scope("op")(OpScope)


def test_a_new_scope_is_one_class_and_the_spec_the_labels_and_build_follow_the_registry():
    built = []

    @register_scope("toy_test")
    class ToyScope(OpScope):
        def label(self, cell: Cell) -> list[str]:
            return ["toy!"]

        def build(self, cell: Cell) -> Measured:
            built.append(cell)
            return build_op(cell)

    try:
        (cell,) = expand(cli_spec(variant=["full"], lengths=[16], scope=["toy_test"], heads=[2], head_dim=[8]))
        assert cell.scope == "toy_test" and cell.layers is None and cell.label == "full toy! forward L=16"
        assert build(cell).fn().shape == (1, 2, 16, 8) and built == [cell]
    finally:
        del SCOPES["toy_test"]
    with pytest.raises(ValueError, match="unknown scope 'toy_test'; valid: op, model, hf"):
        expand(cli_spec(variant=["full"], scope=["toy_test"]))


def test_no_scope_is_named_outside_its_own_file():
    """Scope-specific behaviour lives in harness/cost/scopes/<name>.py, never in a branch on the name elsewhere."""
    branch = re.compile(r"""scope\s*[!=]=\s*["']|["'](op|model|hf)["']\s+(not\s+)?in\s+\w*\.?scope""")
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
             for p in sorted((REPO / "harness" / "cost").rglob("*.py")) if "scopes" not in p.parts
             for n, line in enumerate(p.read_text().splitlines(), 1) if branch.search(line)]
    assert not found, "\n".join(found)
    assert branch.search('if cell.scope == "hf":') and branch.search('"hf" in grid.scope')  # the check can fail


def test_op_cells_never_import_transformers():
    code = ("import sys\nfrom harness.cost.spec import build_spec, expand\nfrom harness.cost import build\n"
            "(c,) = expand(build_spec([('t', {'variant': ['full'], 'lengths': [16], 'heads': [1], 'head_dim': [8]})]))\n"
            "build(c).fn()\nassert 'transformers' not in sys.modules, 'op cells imported transformers'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# -- a sweep is one pass -----------------------------------------------------------------------------

class _FakeWorker:
    """Answers each cell ``ok`` (or ``oom`` past ``oom_from``) without a process."""

    startup_s, starts = 0.0, 1
    oom_from = 10**9

    def run_cell(self, row, timing, seed, time_limit_s, peaks, options=None):
        if row["seq_len"] >= self.oom_from:
            return {"status": "oom", "error": "MemoryError"}
        return {"status": "ok", "error": None, "latency_ms": 1.0, "achieved_flops_per_s": 1e9, "cpus": 2,
                "num_threads": 2, "other_cpu": 0.0, "peak_before_flops_per_s": 2e9, "peak_after_flops_per_s": 2e9}

    def close(self):
        pass


class _FakeMeasurer(sweep.CellMeasurer):
    def __init__(self, run, run_id, profiles=None):
        super().__init__(run, run_id, profiles)
        self.worker.close()
        self.worker = _FakeWorker()


@pytest.fixture
def counted(monkeypatch):
    """Counts whole-file reads of results files, locks taken and noise assessments while a sweep runs."""
    counts = {"reads": 0, "locks": 0, "assess": 0}
    lines, exclusive, assess = results._lines, sweep.exclusive, sweep.assess

    def counting(name, fn):
        def wrapper(*a, **k):
            counts[name] += 1
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(results, "_lines", counting("reads", lines))
    monkeypatch.setattr(sweep, "exclusive", counting("locks", exclusive))
    monkeypatch.setattr(sweep, "assess", counting("assess", assess))
    monkeypatch.setattr(sweep, "CellMeasurer", _FakeMeasurer)
    return counts


def test_a_sweep_locks_and_reads_its_results_file_once_and_assesses_each_cell_once(tmp_path, counted):
    out = tmp_path / "r.jsonl"
    spec = cli_spec(variant=["full", "linear"], lengths=[16, 32], heads=[2], head_dim=[8], retries=0)
    cells = expand(spec)
    rows = sweep.run_sweep(spec, cells, out, resume=False, echo=lambda s: None)
    assert counted == {"reads": 1, "locks": 1, "assess": 4}
    counted["reads"] = 0
    assert rows == results.read_rows(out) and len(rows) == 4  # the rows returned are the file's, as they read back
    assert all(r["noisy"] is False and r["peak_fraction"] == 0.5 for r in rows)

    more = cli_spec(variant=["full", "linear"], lengths=[16, 32, 64], heads=[2], head_dim=[8], retries=0)
    counted.update(reads=0, locks=0, assess=0)
    rows = sweep.run_sweep(more, expand(more), out, resume=True, echo=lambda s: None)
    assert counted == {"reads": 1, "locks": 1, "assess": 2}  # only the two new cells are measured
    counted["reads"] = 0
    assert rows == results.read_rows(out) and len(rows) == 6


def test_a_failure_in_an_earlier_run_skips_the_longer_lengths_of_its_configuration(tmp_path, counted):
    out = tmp_path / "r.jsonl"
    _FakeWorker.oom_from = 32
    try:
        spec = cli_spec(variant=["full"], lengths=[16, 32], heads=[2], head_dim=[8], retries=0)
        sweep.run_sweep(spec, expand(spec), out, resume=False, echo=lambda s: None)
        longer = cli_spec(variant=["full"], lengths=[16, 32, 64, 128], heads=[2], head_dim=[8], retries=0)
        rows = sweep.run_sweep(longer, expand(longer), out, resume=True, echo=lambda s: None)
    finally:
        _FakeWorker.oom_from = 10**9
    assert [(r["seq_len"], r["status"]) for r in rows] == [(16, "ok"), (32, "oom"), (64, "skipped"), (128, "skipped")]
    assert all("oom at seq_len 32" in r["error"] for r in rows[2:])
    failures = sweep.failure_index(rows)
    assert list(failures.values()) == [("oom", 32)]
    sweep.note_failure(failures, next(iter(failures)), "timeout", 16, "cpu")  # a shorter failure replaces it
    sweep.note_failure(failures, next(iter(failures)), "error", 8, "cpu")  # a CPU error does not skip
    assert list(failures.values()) == [("timeout", 16)]


# -- memory policy and plugin paths -------------------------------------------------------------------

def test_the_default_budget_is_eighty_percent_of_what_is_available(monkeypatch):
    import psutil

    class Mem:
        total, available = 128 * 2**30, 10 * 2**30

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Mem)
    assert available_budget() == 8 * 2**30


def test_the_address_space_cap_fails_an_allocation_past_it_and_keeps_a_tighter_cap_only_when_asked():
    code = """
import resource
from harness.memory import address_space_cap, cap_address_space, proc_status
gib = 2**30
size = proc_status("VmSize")
old = cap_address_space(gib)
soft = resource.getrlimit(resource.RLIMIT_AS)[0]
assert size + gib <= soft <= proc_status("VmSize") + gib, (size, soft)
try:
    bytearray(2 * gib)
    raise SystemExit("an allocation past the cap succeeded")
except MemoryError:
    pass
with address_space_cap(64 * gib) as cap:  # never loosens the tighter cap already set
    assert cap == resource.getrlimit(resource.RLIMIT_AS)[0] <= soft
assert resource.getrlimit(resource.RLIMIT_AS)[0] == soft  # lifted back to what it was
cap_address_space(64 * gib)  # the sweep worker's own cap follows its size, tighter or not
assert resource.getrlimit(resource.RLIMIT_AS)[0] > soft + 32 * gib
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_plugin_files_travel_by_absolute_path_and_modules_by_name(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert absolute_plugins(("mine.py", "some.module", "missing.py")) == (str(tmp_path / "mine.py"), "some.module",
                                                                           "missing.py")


# -- every option declared once -------------------------------------------------------------------------

def test_the_command_line_options_and_the_spec_keys_follow_from_one_declaration():
    params = {p.name: p for p in sweep_command.params}
    declared = cli_names(Grid, RunSettings)
    assert GRID_KEYS == spec_keys(Grid) and set(spec_keys(RunSettings)) <= set(RUN_KEYS)
    assert set(params) == set(declared) | set(EXECUTOR_KEYS) | {"out", "resume", "preset", "config", "dry_run"}
    assert set(declared) <= set(GRID_KEYS) | set(RUN_KEYS)
    for name in declared:
        assert params[name].default is None  # an option not given leaves the field's default
    assert params["hf_config"].opts == ["--hf-config", "--hf-model"] and params["causal"].secondary_opts == ["--bidirectional"]
    assert params["variant"].multiple and not params["lengths"].multiple


@pytest.mark.parametrize("argv, message", [
    (["--retries", "-1"], "--retries: expected an integer >= 0, got -1"),
    (["--time-limit", "0"], "--time-limit: expected a positive number, got 0.0"),
    (["--lengths", "4Q"], "--lengths: malformed length '4Q'; expected e.g. 4096, 4K or 1M"),
])
def test_a_bad_option_value_is_refused_by_its_declared_parser_with_its_flag_named(argv, message, capsys, tmp_path):
    assert main(["sweep", "--variant", "full", *argv, "--out", str(tmp_path / "x.jsonl")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "x.jsonl").exists()


def test_scope_hooks_have_defaults_a_new_scope_may_keep():
    scope = Scope()
    assert scope.prepare(None) is None and scope.check(None) is None and scope.positions_from_config is False
    with pytest.raises(NotImplementedError):
        scope.build(None)
