"""The kernel engineer's loop (docs/kernels.md): ``sweep --base REF`` against a ref, the correctness gate, the
speed-up table and its exit status, the reproducer on every row and ``attn-bench repro``, ``--profile``."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.cost.cells import Cell
from harness.cost.gate import GateOptions, check_decode_step, check_forward
from harness.cost.profile import profile_calls
from harness.cost.repro import repro_command
from harness.cost.spec import expand, load_spec
from harness.cost.versus import pairs, speedup_table, speedups

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''"""Two plain attentions whose fast backends a test breaks on the working tree: one wrong, one slow."""
import math
import time
from dataclasses import dataclass

import torch

import attn
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.attention.masks import causal_mask


@dataclass(frozen=True)
class PlantedConfig:
    pass


def attend(q, k, v, causal, drop_last=False):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    if drop_last:  # the planted bug: the last key is never attended
        s[..., -1] = float("-inf")
    return torch.softmax(s, dim=-1) @ v


@attn.register_attention("planted", config=PlantedConfig)
class Planted(Attention):
    backends = (Backend("reference", {"cpu": ALL_MODES}), Backend("fast", {"cpu": ALL_MODES}))

    def backend_reference(self, q, k, v, causal):
        return attend(q, k, v, causal)

    def backend_fast(self, q, k, v, causal):
        return attend(q, k, v, causal)  # WRONG ON HEAD


@attn.register_attention("slowed", config=PlantedConfig)
class Slowed(Planted):
    def backend_fast(self, q, k, v, causal):
        return attend(q, k, v, causal)  # SLOW ON HEAD
'''
HEAD = PLUGIN.replace("attend(q, k, v, causal)  # WRONG ON HEAD", "attend(q, k, v, causal, drop_last=True)").replace(
    "        return attend(q, k, v, causal)  # SLOW ON HEAD", "        time.sleep(0.01)\n        return attend(q, k, v, causal)")

FAST = "--min-run-time 0.05 --max-run-time 0.2 --retries 0 --lengths 64 --heads 2 --head-dim 16 --threads 1".split()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def plugin_repo(root: Path) -> Path:
    """A git repository holding the plugin, committed and tagged ``good``: the base the tests compare with."""
    repo = root / "kernels"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "planted.py").write_text(PLUGIN)
    git(repo, "add", "planted.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "good kernel")
    git(repo, "tag", "good")
    return repo


def sweep(repo: Path, out: Path, *more: str) -> subprocess.CompletedProcess:
    argv = ["sweep", "--plugin", str(repo / "planted.py"), *FAST, "--out", str(out), *more]
    return subprocess.run([sys.executable, "-m", "harness.cli", *argv], cwd=repo, capture_output=True, text=True,
                          timeout=600)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """One ``--base good`` sweep of both variants, their head side broken: (the run, its results file, the repo)."""
    root = tmp_path_factory.mktemp("loop")
    repo = plugin_repo(root)
    (repo / "planted.py").write_text(HEAD)
    out = root / "compared.jsonl"
    return sweep(repo, out, "--variant", "planted:backend=fast", "--variant", "slowed:backend=fast", "--base", "good"), \
        out, repo


def sides(out: Path, variant: str) -> dict[str, dict]:
    return {r["side"]: r for r in rows(out) if r["variant"] == variant}


def test_a_wrong_kernel_on_the_head_is_refused_untimed_and_its_base_row_reproduces(compared, tmp_path):
    done, out, repo = compared
    assert done.returncode == 1, done.stderr
    head, base = sides(out, "planted")["head"], sides(out, "planted")["base"]
    assert head["status"] == "mismatch" and head["check"] == "mismatch" and "output off by" in head["check_detail"]
    assert head["latency_ms"] is None and not head.get("sample_ms")  # never timed
    assert base["status"] == "ok" and base["check"] == "ok" and base["latency_ms"] > 0
    assert base["code_commit"] == git(repo, "rev-parse", "good") and base["ref"] == "good"
    assert "planted:backend=fast forward L=64: head refused by the gate" in done.stderr
    assert git(repo, "worktree", "list").count("\n") == 0  # the base's worktree is gone
    # the base row's reproducer measures the good kernel at its commit, wherever the working tree stands
    assert f"--at {base['code_commit']}" in base["repro"]
    line = 1 + [(r["variant"], r["side"]) for r in rows(out)].index(("planted", "base"))
    again = subprocess.run([sys.executable, "-m", "harness.cli", "repro", f"{out}:{line}"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "recorded:" in again.stdout and "now / recorded:" in again.stdout


def test_a_slower_head_fails_the_comparison(compared):
    done, out, _ = compared
    assert done.returncode == 1, done.stderr
    assert "slowed:backend=fast forward L=64: head is" in done.stderr and "the base's time" in done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith("slowed:backend=fast forward L=64")]
    assert len(table) == 1 and table[0].rstrip().endswith("ok")
    head = sides(out, "slowed")["head"]
    assert head["status"] == "ok" and head["base_check"] == "ok"  # right but slow: gated, timed, and failed


def test_an_unknown_ref_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "none.jsonl"
    done = sweep(plugin_repo(tmp_path), out, "--variant", "planted:backend=fast", "--base", "no-such-ref")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no-such-ref" in done.stderr
    assert not out.exists()


# -- the gate, in this process ------------------------------------------------------------------------------------

def op_cell(variant: str, params: dict, backend: str, mode: str = "forward", length: int = 300, **more) -> Cell:
    return Cell(variant, params, backend, "none", {}, "op", mode, "cpu", more.pop("dtype", "float32"), 1, 4, 16, length,
                **more)


def inputs(cell: Cell) -> tuple:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, h, cell.seq_len, 16, generator=g) for h in (4, cell.kv_heads, cell.kv_heads))


@pytest.mark.parametrize("variant,params,backend,mode", [
    ("sliding_window", {"window": 40}, "blocked", "forward"),
    ("sliding_window", {"window": 40}, "blocked", "train"),
    ("linear", {}, "chunked", "train"),
    ("block_sparse", {"block_size": 16, "local_blocks": 2, "global_blocks": 1}, "gathered", "forward"),
])
def test_the_gate_passes_a_right_backend_and_refuses_it_off_by_one(variant, params, backend, mode, monkeypatch):
    import attn

    cell = op_cell(variant, params, backend, mode, num_kv_heads=2)
    q, k, v = inputs(cell)
    assert check_forward(cell, q, k, v, {}, None, GateOptions(tokens=200))["check"] == "ok"
    cls = attn.registry.ATTENTION.get(variant).cls
    right = getattr(cls, f"backend_{backend}")
    # the planted bug: the fast backend never sees the last key of what it is given
    monkeypatch.setattr(cls, f"backend_{backend}",
                        lambda self, q, k, v, causal, **kw: torch.cat(
                            [right(self, q[:, :, :-1], k[:, :, :-1], v[:, :, :-1], causal, **kw),
                             right(self, q, k, v, causal, **kw)[:, :, -1:] * 0], dim=2))
    refused = check_forward(cell, q, k, v, {}, None, GateOptions(tokens=200))
    assert refused["check"] == "mismatch" and refused["check_tokens"] == 200


@pytest.mark.parametrize("variant,backend,mode", [
    ("gla", "chunked", "train"),  # token inputs (gates) cut with the keys, their gradients compared
    ("nsa", "gathered", "forward"), ("moba", "gathered", "decode"), ("quest", "gathered", "decode"),
    ("full", "sdpa", "decode"), ("mamba2", "chunked", "decode"),
])
def test_the_gate_passes_each_kind_of_built_in_on_the_cells_own_path(variant, backend, mode):
    """No false refusals: token inputs, selection, a dense-prefill decode, a KV cache, a recurrent state, with GQA."""
    from harness.cost.cells import build

    cell = op_cell(variant, {}, backend, mode, num_kv_heads=2)
    torch.manual_seed(0)
    checked = build(cell).gate(GateOptions(tokens=200))
    assert checked["check"] == "ok", checked["check_detail"]


def test_the_gate_compares_the_head_with_the_base_output(tmp_path):
    cell = op_cell("sliding_window", {"window": 40}, "blocked")
    q, k, v = inputs(cell)
    base = tmp_path / "base.pt"
    assert check_forward(cell, q, k, v, {}, None, GateOptions(save=str(base)))["base_check"] is None
    same = check_forward(cell, q, k, v, {}, None, GateOptions(against=str(base)))
    assert same["base_check"] == "ok" and same["base_err"] == 0.0
    torch.save(torch.load(base) * 1.01, base)  # a base that computed something else
    assert check_forward(cell, q, k, v, {}, None, GateOptions(against=str(base)))["base_check"] == "mismatch"
    assert check_forward(cell, q, k, v, {}, None, GateOptions(against=str(tmp_path / "x.pt")))["base_check"] == "absent"


def test_the_decode_gate_steps_the_variants_own_state(monkeypatch):
    from attn.attention.linear import LinearAttention

    cell = op_cell("linear", {}, "auto", "decode", length=100, queries=3)
    assert check_decode_step(cell, GateOptions(tokens=50))["check"] == "ok"
    step = LinearAttention.run_step
    monkeypatch.setattr(LinearAttention, "run_step", lambda self, q, k, v, state, **kw: step(self, q, k, v, state, **kw)
                        * (1.0 + 1e-2 * (q.shape[2] == 3)))  # 1 percent: 5x the fp32 floor
    assert check_decode_step(cell, GateOptions(tokens=50))["check"] == "mismatch"


# -- the reproducer ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    "--variant linear:backend=chunked --lengths 4K --kv-heads 2 --docs 2 --dtype bfloat16 --threads 1",
    "--variant sliding_window:window=64 --mode train --lengths 300 --bidirectional --seed 3",
    "--variant full --mode decode --lengths 1K --queries-per-step 4 --budget 8MiB",
    "--variant full --mode decode --lengths 1K --batch 4 --ragged 0.5",
    "--variant full --scope model --position rope:rope_theta=500000 --layers 3 --lengths 512",
    "--pattern gemma3 --scope model --layers 6 --lengths 512",
    "--variant full --scope hf --hf-config llama --press snapkv:compression_ratio=0.5 --lengths 512 --mode forward",
])
def test_the_repro_command_names_exactly_its_cell(argv):
    cells = cells_of(shlex.split(argv))
    for cell in cells:
        run = load_run(shlex.split(argv))
        command = repro_command(cell, run, "0123abc", threads=1)
        assert command.startswith("attn-bench sweep ") and "--at 0123abc" in command
        assert command.count("--variant") + command.count("--pattern") == 1
        again = cells_of(shlex.split(command)[2:])
        assert [c.key() for c in again] == [cell.key()]
    assert "--at" not in repro_command(cells[0], load_run(shlex.split(argv)), "0123abc-dirty")


def _opts(argv: list[str]) -> dict:
    from harness.cost.command import sweep_command

    ctx = sweep_command.make_context("sweep", list(argv))
    return {k: v for k, v in ctx.params.items() if k not in ("out", "resume", "preset", "config", "dry_run")}


def cells_of(argv: list[str]) -> list[Cell]:
    return expand(load_spec(None, None, _opts(argv)))


def load_run(argv: list[str]):
    return load_spec(None, None, _opts(argv)).run


def test_repro_refuses_a_row_without_a_command_in_one_line(tmp_path, capsys):
    from harness.cli import main

    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"variant": "full", "status": "ok", "mode": "forward", "device": "cpu"}) + "\n")
    for target in (f"{old}:1", f"{old}:2", f"{tmp_path}/none.jsonl:1", str(old)):
        assert main(["repro", target]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("attn-bench: error:"), (target, err)


# -- the table and its verdict ----------------------------------------------------------------------------------

def side_row(side: str, samples: list[float], status: str = "ok", length: int = 1024) -> dict:
    return {"variant": "linear", "variant_spec": "linear", "mode": "forward", "seq_len": length, "side": side,
            "status": status, "sample_ms": samples if status == "ok" else None,
            "latency_ms": float(torch.tensor(samples).median()) if status == "ok" else None, "check": "ok"}


def test_speedups_have_intervals_from_the_samples_and_a_geometric_mean():
    g = torch.Generator().manual_seed(0)
    noise = lambda n: (1 + 0.02 * torch.randn(n, generator=g)).tolist()  # noqa: E731
    rows_ = [side_row("base", [2 * x for x in noise(8)]), side_row("head", noise(8)),
             side_row("base", [8 * x for x in noise(8)], length=4096), side_row("head", noise(8), length=4096)]
    cells, means = speedups(pairs(rows_))
    assert [round(c["speedup"]) for c in cells] == [2, 8]
    assert all(c["low"] < c["speedup"] < c["high"] for c in cells)
    assert means["linear"]["geomean"] == pytest.approx(4, rel=0.05) and means["linear"]["cells"] == 2
    assert means["linear"]["low"] < means["linear"]["geomean"] < means["linear"]["high"]
    assert speedup_table(rows_, 0.1)[1] == []  # faster: passes


def test_the_verdict_fails_a_slower_head_only_beyond_its_interval_and_a_refused_one():
    even = [1.0, 1.3, 0.8, 1.1, 0.9]
    assert speedup_table([side_row("base", even), side_row("head", [x * 1.05 for x in even])], 0.1)[1] == []
    slow = speedup_table([side_row("base", [1.0, 1.01, 0.99]), side_row("head", [1.5, 1.52, 1.49])], 0.1)[1]
    assert len(slow) == 1 and "slower" not in slow[0] and "the base's time" in slow[0]
    noisy = speedup_table([side_row("base", [1.0, 2.0, 0.5, 1.5]), side_row("head", [1.3, 0.6, 2.4, 1.2])], 0.1)[1]
    assert noisy == []  # 1.3x slower at the median, but the interval reaches past 1/(1.1)
    refused = speedup_table([side_row("base", even), side_row("head", [], status="mismatch")], 0.1)[1]
    assert len(refused) == 1 and "refused" in refused[0]


# -- the profile ------------------------------------------------------------------------------------------------

def test_profile_writes_a_chrome_trace_and_the_top_operators(tmp_path):
    a = torch.randn(64, 64)
    columns = profile_calls(lambda: (a @ a).softmax(-1), tmp_path / "t" / "cell.json", "cpu", 0.01)
    trace = json.loads((tmp_path / "t" / "cell.json").read_text())
    assert trace["traceEvents"] and columns["profile_calls"] == 50
    ops = [t["op"] for t in columns["profile_top"]]
    assert "aten::mm" in ops and "aten::_softmax" in ops
    assert sum(t["share"] for t in columns["profile_top"]) <= 1 + 1e-9
    assert "aten::mm" in (tmp_path / "t" / "cell.txt").read_text()
