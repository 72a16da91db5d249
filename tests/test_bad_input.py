"""Bad input (issue 14): one clear line on stderr and exit status 2, never a traceback, never a touched file.

The CLI cases run ``attn-bench`` as a real process in a scratch directory; each first reproduced the bug.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import attn
from attn.registry import ATTENTION, POSITIONS, Registry, parse_spec, shorten
from harness.accuracy.train import TrainConfig, load_checkpoint, train

HERE = Path(__file__).resolve().parent
PLUGINS = HERE / "plugins"
EXE = str(Path(sys.executable).with_name("attn-bench"))
LONG = "x" * 100_000
TINY_SWEEP = ["--lengths", "64", "--heads", "1", "--head-dim", "16", "--out", "o.jsonl"]


def cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}
    return subprocess.run([EXE, *argv], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def refused(r: subprocess.CompletedProcess) -> str:
    """The single error line of a run refused as bad input."""
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("attn-bench: error:")]
    assert len(errors) == 1, r.stderr[-2000:]
    return errors[0]


# -- 6: a class that is not an attn.Attention --------------------------------------------------------

@dataclass(frozen=True)
class _Cfg:
    x: int = 1


def test_registering_a_non_attention_class_is_refused_saying_what_to_subclass():
    class Plain:
        pass

    with pytest.raises(TypeError, match=r"not a subclass of attn\.Attention.*class Plain\(attn\.Attention\)"):
        attn.register_attention("test_plain", config=_Cfg)(Plain)
    with pytest.raises(TypeError, match=r"attn\.Attention"):
        attn.register_attention("test_func", config=_Cfg)(lambda config, backend: None)
    with pytest.raises(TypeError, match=r"attn\.Position"):
        attn.register_position("test_plain_pos", config=_Cfg)(Plain)
    assert "test_plain" not in ATTENTION.names() and "test_func" not in ATTENTION.names()
    assert "test_plain_pos" not in POSITIONS.names()
    reg = Registry("toy")  # a registry without a base class takes anything, as before
    assert reg.register("toy", config=_Cfg)(Plain) is Plain


def test_list_reports_a_non_attention_plugin_as_failed(tmp_path):
    r = cli("list", "--plugin", str(PLUGINS / "not_attention.py"), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr  # the listing lacks what was asked for
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert "not_attention.py failed to load" in lines[0] and "subclass of attn.Attention" in lines[0]
    assert "Attention variants" in r.stdout and "test_not_attention" not in r.stdout


@pytest.mark.parametrize("command", ["sweep", "accuracy"])
def test_sweep_and_accuracy_refuse_the_variant_of_a_non_attention_plugin(tmp_path, command):
    plugin = str(PLUGINS / "not_attention.py")
    if command == "sweep":
        argv = ["sweep", "--plugin", plugin, "--variant", "test_not_attention", *TINY_SWEEP]
    else:
        argv = ["accuracy", "--task", "mqar", "--plugin", plugin, "--variant", "test_not_attention", "--steps", "1",
                "--out", "a.jsonl"]
    r = cli(*argv, cwd=tmp_path)
    line = refused(r)
    assert "unknown attention variant 'test_not_attention'" in line and "subclass of attn.Attention" in line
    assert snapshot(tmp_path) == {}


# -- 10: plugins that exit, and each failure reported once ----------------------------------------

def test_list_survives_a_plugin_calling_sys_exit(tmp_path):
    r = cli("list", "--plugin", str(PLUGINS / "exits.py"), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "Attention variants" in r.stdout and "sliding_window" in r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "exits.py failed to load" in lines[0] and "sys.exit(0)" in lines[0], r.stderr


def test_each_broken_plugin_is_reported_exactly_once(tmp_path):
    boom = tmp_path / "boom.py"
    boom.write_text("raise RuntimeError('kaboom\\nsecond line')\n")
    exits = str(PLUGINS / "exits.py")
    r = cli("list", "--plugin", str(boom), "--plugin", exits, "--plugin", str(boom), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert sum("boom.py" in ln and "RuntimeError: kaboom" in ln for ln in lines) == 1
    assert sum("exits.py" in ln for ln in lines) == 1
    r = cli("list", "--json", "--plugin", str(boom), cwd=tmp_path)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and json.loads(r.stdout)["attention"]


def test_an_unknown_variant_hints_at_a_missing_plugin(tmp_path):
    line = refused(cli("sweep", "--variant", "attn_sinks", *TINY_SWEEP, cwd=tmp_path))
    assert "unknown attention variant 'attn_sinks'" in line and "--plugin" in line


def test_broken_entry_point_is_reported_exactly_once(tmp_path):
    (tmp_path / "ep_broken.py").write_text("import sys\nsys.exit(3)\n")
    dist = tmp_path / "ep_broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[attn.variants]\nep_broken = ep_broken\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([EXE, "list"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "Attention variants" in r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "plugin ep_broken failed to load" in lines[0] and "sys.exit(3)" in lines[0], r.stderr


def test_plugin_errors_survive_system_exit_but_not_keyboard_interrupt(tmp_path):
    code = tmp_path / "exit_code.py"
    code.write_text("raise SystemExit('bye')\n")
    assert not attn.load_plugin(str(code))
    assert "SystemExit" in attn.plugin_errors()[str(code)] and "bye" in attn.plugin_errors()[str(code)]
    interrupt = tmp_path / "interrupt.py"
    interrupt.write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        attn.load_plugin(str(interrupt))
    assert attn.build_attention("full") is not None


# -- 13a: rows without a newer optional key column still match --------------------------------------

def cost_rows(optional: bool) -> list[dict]:
    out = []
    for variant, params, backend in [("full", {}, "sdpa"), ("sliding_window", {"window": 64}, "blocked")]:
        for L in (256, 512):
            row = {"run_id": "r", "variant": variant, "variant_params": params, "backend": backend,
                   "position": "none", "position_params": {}, "scope": "op", "mode": "forward", "device": "cpu",
                   "device_name": "box", "dtype": "float32", "batch_size": 1, "num_heads": 2, "head_dim": 16,
                   "seq_len": L, "status": "ok", "error": None, "latency_ms": 1e-3 * L, "latency_iqr_ms": 1e-5 * L,
                   "peak_mem_bytes": 1000 * L}
            if optional:
                row |= {"backend_requested": "auto", "causal": True, "layers": None}
            out.append(row)
    return out


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("old", ["base", "new", "both"])
def test_compare_matches_rows_lacking_optional_key_columns(tmp_path, old):
    base = write_rows(tmp_path / "base.jsonl", cost_rows(optional=old not in ("base", "both")))
    new = write_rows(tmp_path / "new.jsonl", cost_rows(optional=old not in ("new", "both")))
    r = cli("compare", base, new, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "4 matched cell(s) (0 only in BASE, 0 only in NEW)" in r.stdout


def test_compare_still_tells_different_cells_apart(tmp_path):
    base = write_rows(tmp_path / "base.jsonl", cost_rows(optional=False))
    new = write_rows(tmp_path / "new.jsonl", [r | {"causal": False, "backend_requested": "auto"}
                                             for r in cost_rows(optional=True)])
    line = refused(cli("compare", base, new, cwd=tmp_path))
    assert "no cells in common" in line and "causal" in line


# -- 13b: echoed values are cut -------------------------------------------------------------------

def test_shorten_cuts_long_values_and_keeps_short_ones():
    assert shorten("window") == "'window'"
    cut = shorten(LONG)
    assert len(cut) < 120 and cut.startswith("'xxx") and "100,000 characters" in cut
    assert len(shorten(list(range(100_000)))) < 90


@pytest.mark.parametrize("spec", [f"full:{LONG}=1", LONG, f"sliding_window:window={LONG}", f":{LONG}",
                                  f"full:{LONG}", f"full:a=1,a={LONG}"])
def test_registry_messages_cut_a_huge_echoed_value(spec, monkeypatch):
    monkeypatch.setattr(ATTENTION, "plugin_errors", {})  # another test's failed plugins (with tmp paths) are not this one's
    with pytest.raises(ValueError) as e:
        name, params = parse_spec(spec)
        ATTENTION.make_config(name, params)
    assert len(str(e.value)) < 600, len(str(e.value))


def test_sweep_and_accuracy_echo_a_huge_name_shortened(tmp_path):
    for argv in (["sweep", "--variant", f"full:{LONG}=1", *TINY_SWEEP],  # was a 100,083-character line
                 ["sweep", "--variant", LONG, *TINY_SWEEP],
                 ["accuracy", "--task", "mqar", "--variant", f"full:{LONG}=1", "--steps", "1", "--out", "a.jsonl"]):
        line = refused(cli(*argv, cwd=tmp_path))
        assert len(line) < 600 and "xxxx..." in line, len(line)
        assert snapshot(tmp_path) == {}


# -- 13c: a number that is not a number is named ----------------------------------------------------

def test_compare_names_file_line_and_field_of_a_non_numeric_latency(tmp_path):
    base = write_rows(tmp_path / "base.jsonl", cost_rows(optional=True))
    bad = cost_rows(optional=True)
    bad[2]["latency_ms"] = "fast"
    new = write_rows(tmp_path / "new.jsonl", bad)
    before = snapshot(tmp_path)
    line = refused(cli("compare", base, new, cwd=tmp_path))
    assert "new.jsonl line 3: latency_ms is 'fast', not a number" in line
    all_bad = write_rows(tmp_path / "all_bad.jsonl", [r | {"latency_ms": "fast"} for r in cost_rows(optional=True)])
    line = refused(cli("compare", all_bad, base, cwd=tmp_path))
    assert "all_bad.jsonl line 1: latency_ms" in line and "no ok cost rows" not in line
    assert {k: v for k, v in snapshot(tmp_path).items() if k != "all_bad.jsonl"} == before


BAD_ROWS = [
    ("latency_ms", "12.5", "latency_ms is '12.5', not a number"),  # a number written as text is not read as one
    ("status", "great", "status is 'great', not one of ok, oom"),
    ("status", 1, "status is 1, not one of ok, oom"),
    ("variant", None, "variant is null, not a name"),
    ("mode", None, "mode is null, not a name"),
    ("device", None, "device is null, not a name"),
    ("variant_params", "window=64", "variant_params is 'window=64', not an object of parameters"),
    ("seq_len", True, "seq_len is true, not a number"),
]


@pytest.mark.parametrize("command, field, value, said", [
    *(("compare", *bad) for bad in BAD_ROWS), ("plot", *BAD_ROWS[0]), ("plot", *BAD_ROWS[3]), ("report", *BAD_ROWS[1]),
    ("report", *BAD_ROWS[6]),
])
def test_readers_refuse_a_bad_row_by_file_and_line(tmp_path, monkeypatch, capsys, command, field, value, said):
    """In process (the one-line contract is harness.cli.main's; the subprocess tests above cover the entry point)."""
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    base = write_rows(tmp_path / "base.jsonl", cost_rows(optional=True))
    bad = cost_rows(optional=True)
    bad[1][field] = value
    new = write_rows(tmp_path / "new.jsonl", bad)
    before = snapshot(tmp_path)
    argv = {"compare": ["compare", base, new], "plot": ["plot", new, "--out", "figs"],
            "report": ["report", new, "--out", "r.html"]}[command]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert [ln for ln in err.splitlines() if ln.startswith("attn-bench: error:")] == [
        ln for ln in err.splitlines() if f"new.jsonl line 2: {said}" in ln], err
    assert f"new.jsonl line 2: {said}" in err
    assert snapshot(tmp_path) == before


# -- 7: a corrupt checkpoint is moved aside and the run retrains --------------------------------------

def _model_and_batches() -> tuple[torch.nn.Module, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 8, (2, 6), generator=g)
    return model, lambda step: (data, data)


def _real_checkpoint(path: Path) -> bytes:
    model, batches = _model_and_batches()
    train(model, batches, TrainConfig(steps=2, batch_size=2, ckpt_every=1), path, identity="run", progress=False)
    return path.read_bytes()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "not_a_checkpoint"])
def test_corrupt_checkpoint_is_moved_aside_and_training_restarts(tmp_path, damage):
    ckpt = tmp_path / "mqar-abc.pt"
    good = _real_checkpoint(ckpt)
    if damage == "truncated":
        ckpt.write_bytes(good[: len(good) // 2])
    elif damage == "garbage":
        ckpt.write_bytes(bytes(range(256)) * 8)
    elif damage == "empty":
        ckpt.write_bytes(b"")
    else:
        torch.save(torch.ones(3), ckpt)
    damaged = ckpt.read_bytes()
    said: list[str] = []
    assert load_checkpoint(ckpt, "run", warn=said.append) is None
    assert len(said) == 1 and str(ckpt) in said[0] and "training from scratch" in said[0]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("mqar-abc.pt.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged and not ckpt.exists()
    # the next run trains from scratch and leaves a good checkpoint
    ckpt.write_bytes(damaged)
    model, batches = _model_and_batches()
    result = train(model, batches, TrainConfig(steps=2, batch_size=2, ckpt_every=1), ckpt, identity="run",
                   progress=False)
    assert result.resumed_from == 0 and len(result.losses) == 2
    assert load_checkpoint(ckpt, "run")["step"] == 2


def test_checkpoint_of_another_run_is_still_refused(tmp_path):
    ckpt = tmp_path / "c.pt"
    _real_checkpoint(ckpt)
    with pytest.raises(ValueError, match="belongs to another run"):
        load_checkpoint(ckpt, "other")
    assert ckpt.exists()


def test_accuracy_rerun_over_a_corrupt_checkpoint_retrains_once(tmp_path):
    args = ["accuracy", "--task", "mqar", "--variant", "full", "--train-len", "32", "--eval-lens", "32", "--steps", "2",
            "--batch-size", "2", "--model", "tiny", "--eval-examples", "4", "--num-pairs", "2", "--vocab-size", "16",
            "--ckpt-dir", "ck", "--no-progress", "--threads", "1"]
    assert cli(*args, "--out", "a.jsonl", cwd=tmp_path).returncode == 0
    (ckpt,) = (tmp_path / "ck").glob("*.pt")
    ckpt.write_bytes(ckpt.read_bytes()[:100])  # a kill mid-copy, a full disk...
    r = cli(*args, "--out", "b.jsonl", cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "checkpoint" in ln]
    assert len(said) == 1 and ckpt.name in said[0] and "training from scratch" in said[0], r.stderr
    rows = [json.loads(ln) for ln in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert rows and all(r.get("status", "ok") == "ok" for r in rows), {r.get("status") for r in rows}
    assert len(list((tmp_path / "ck").glob("*.corrupt-*"))) == 1
    state = torch.load(ckpt, weights_only=True)  # retrained and saved again: the next rerun resumes from it
    assert state["step"] == 2


# -- optional parts fail alone: a broken install (an import raising anything) costs only its feature -----------

BROKEN = ("kvpress", "transformers", "fla", "xformers", "ray", "submitit", "gguf")


def broken_site(root: Path, packages: tuple[str, ...] = BROKEN) -> dict[str, str]:
    """An environment whose ``packages`` are found first and raise RuntimeError on import, as a compiled extension
    built for another torch does; returns the env for a subprocess."""
    site = root / "broken-site"
    for name in packages:
        (site / name).mkdir(parents=True, exist_ok=True)
        (site / name / "__init__.py").write_text(f"raise RuntimeError('broken {name} extension\\nsecond line')\n")
    return {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200",
            "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_try_import_gives_the_module_or_one_line_saying_why(tmp_path, monkeypatch):
    from attn.optional import Unavailable, require, try_import, unavailable

    (tmp_path / "attn_test_broken_ext.py").write_text("raise RuntimeError('ABI mismatch\\nmore')\n")
    (tmp_path / "attn_test_fine_ext.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert try_import("attn_test_fine_ext").X == 1 and unavailable("attn_test_fine_ext") is None
    assert try_import("attn_test_broken_ext", "pip install it") == (
        "attn_test_broken_ext does not import: RuntimeError: ABI mismatch (pip install it)")
    assert try_import("attn_test_absent_ext.sub") == "attn_test_absent_ext is not installed"
    with pytest.raises(Unavailable, match="^attn_test_broken_ext does not import: RuntimeError: ABI mismatch$") as e:
        require("attn_test_broken_ext")
    assert isinstance(e.value, ImportError)  # what callers of a missing package already catch


def test_list_survives_broken_optional_installs_and_says_what_is_unavailable(tmp_path):
    r = subprocess.run([EXE, "list"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=broken_site(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "Attention variants" in r.stdout and "Accuracy tasks" in r.stdout
    presses = r.stdout.split("KV presses")[1].splitlines()
    assert presses[1].startswith("  unavailable: kvpress does not import: RuntimeError: broken kvpress extension ("), presses
    assert "[unavailable: fla.ops.linear_attn does not import: RuntimeError: broken fla extension" in r.stdout


@pytest.mark.parametrize("command", ["sweep", "accuracy"])
def test_sweep_and_accuracy_of_plain_variants_survive_broken_optional_installs(tmp_path, command):
    argv = ([*TINY_SWEEP] if command == "sweep" else
            ["--task", "mqar", "--steps", "1", "--batch-size", "2", "--no-progress", "--out", "o.jsonl"])
    r = subprocess.run([EXE, command, "--variant", "full", *argv], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, env=broken_site(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert rows and all(row.get("status", "ok") == "ok" for row in rows), rows


def _hf_sweep(*extra: str) -> list[str]:
    return ["sweep", "--scope", "hf", "--variant", "full", "--lengths", "32", *extra, "--out", "o.jsonl"]


@pytest.mark.parametrize("package, argv, expected", [
    ("ray", ["sweep", "--executor", "ray", "--variant", "full", *TINY_SWEEP],
     "--executor ray needs ray: ray does not import: RuntimeError: broken ray extension"),
    ("submitit", ["accuracy", "--task", "mqar", "--executor", "slurm", "--slurm-cluster", "local", "--out", "o.jsonl"],
     "--executor slurm needs submitit: submitit does not import: RuntimeError: broken submitit extension"),
    ("kvpress", _hf_sweep("--press", "snapkv"), "needs kvpress: kvpress does not import: RuntimeError: broken kvpress"),
    ("transformers", _hf_sweep(), "scope hf needs transformers"),
    ("gguf", _hf_sweep("--hf-config", "smollm2-135m"),
     "checkpoint 'smollm2-135m' is a GGUF file, which needs gguf: gguf does not import: RuntimeError: broken gguf"),
])
def test_the_feature_of_a_broken_optional_install_is_refused_in_one_line(tmp_path, package, argv, expected):
    if package == "gguf":
        from attn.checkpoints import CHECKPOINTS

        if CHECKPOINTS["smollm2-135m"].missing():
            pytest.skip("the SmolLM2 checkpoint is not installed")
    run = tmp_path / "run"
    run.mkdir()
    r = subprocess.run([EXE, *argv], cwd=run, capture_output=True, text=True, timeout=300,
                       env=broken_site(tmp_path, (package,)))
    assert expected in refused(r)
    assert snapshot(run) == {}


# -- command lines strict: huge numbers and re-registered names are one line and exit 2 --------------------------

HUGE = "99999999999999999999"


@pytest.mark.parametrize("argv, expected", [
    (["sweep", "--scope", "model", "--pattern", f"full*{HUGE}", *TINY_SWEEP], "a unit of at most 1024 layers"),
    (["accuracy", "--task", "mqar", "--pattern", f"full*{HUGE}", "--steps", "1", "--out", "o.jsonl"],
     "a unit of at most 1024 layers"),
    (["sweep", "--variant", f"sliding_window:window={HUGE}", *TINY_SWEEP],
     f"sliding_window.window must be an int of at most 64 bits, got '{HUGE}'"),
    (["accuracy", "--task", "mqar", "--variant", f"sliding_window:window={HUGE}", "--steps", "1", "--out", "o.jsonl"],
     f"sliding_window.window must be an int of at most 64 bits, got '{HUGE}'"),
    (["sweep", "--variant", "full:softcap=1e400", *TINY_SWEEP], "full.softcap must be a float, got '1e400', which overflows"),
    (["sweep", "--variant", "full", "--lengths", HUGE + "000", "--out", "o.jsonl"], "lengths must be between 1 and"),
    (["sweep", "--variant", "full", "--lengths", "1K", "--heads", HUGE, "--out", "o.jsonl"], "positive integers up to"),
    (["sweep", "--variant", "full", "--lengths", "1K", "--batch", HUGE, "--out", "o.jsonl"], "positive integers up to"),
])
def test_huge_numbers_in_patterns_and_params_are_one_line(tmp_path, argv, expected):
    assert expected in refused(cli(*argv, cwd=tmp_path))
    assert snapshot(tmp_path) == {}


def test_spec_numbers_in_range_still_parse():
    from attn.patterns import parse_pattern
    from attn.specs import coerce

    assert coerce(str(2**63 - 1), int, "x") == 2**63 - 1 and coerce("-inf", float, "x") == float("-inf")
    assert coerce("1e300", float, "x") == 1e300 and len(parse_pattern("full*1024").unit) == 1024
    with pytest.raises(ValueError, match="at most 64 bits"):
        coerce(str(2**63), int, "x")


@pytest.mark.parametrize("command", ["list", "sweep", "accuracy"])
def test_a_plugin_re_registering_a_built_in_name_is_refused_by_every_command(tmp_path, command):
    plugin = tmp_path / "shadow.py"
    plugin.write_text("from dataclasses import dataclass\nimport attn\n\n@dataclass(frozen=True)\nclass C:\n    pass\n\n"
                      "@attn.register_attention('full', config=C)\nclass Shadow(attn.Attention):\n    pass\n")
    argv = {"list": ["list"], "sweep": ["sweep", "--variant", "full", *TINY_SWEEP],
            "accuracy": ["accuracy", "--task", "mqar", "--variant", "full", "--steps", "1", "--out", "o.jsonl"]}[command]
    before = snapshot(tmp_path)
    line = refused(cli(*argv, "--plugin", str(plugin), cwd=tmp_path))
    # the path as given (a long one shortened, as every echoed value is), then the clash
    assert f"--plugin {str(plugin)[:40]}" in line and "attention variant 'full' is already registered" in line, line
    assert snapshot(tmp_path) == before  # nothing written
