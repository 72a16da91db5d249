"""The cost sweep: grid expansion, bad input, failure isolation, resume after a kill, row schema."""
from __future__ import annotations

import contextlib
import io
import itertools
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attn.registry import ATTENTION
from harness.cli import main
from harness.cost import KEY_FIELDS, MODES, SCOPES, Cell
from harness.cost.options import parse_lengths
from harness.cost.presets import PRESETS, describe_presets
from harness.cost.spec import build_spec, expand, load_spec
from harness.cost.summary import loglog_slope, summary_tables
from harness.cost.sweep import make_row, skip_reason
from harness.environment import environment
from harness.results import COST_FIELDS, STATUSES, cell_key, read_rows

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "plugins" / "misbehaving.py"
# Tiny cells, short timing: these tests check behaviour, not speed.
# --retries 0: these sweeps test what is recorded, not the noise retries (the suite's other worker makes every cell "noisy")
FAST = ["--heads", "2", "--head-dim", "8", "--min-run-time", "0.02", "--max-run-time", "0.1", "--retries", "0"]


def cli_spec(**options):
    return build_spec([("command line", options)])


# -- the grid ------------------------------------------------------------------------------------

@given(
    lengths=st.lists(st.sampled_from([16, 32, 48, 64]), min_size=1, max_size=4),
    modes=st.lists(st.sampled_from(MODES), min_size=1, max_size=3, unique=True),
    scopes=st.lists(st.sampled_from([s for s in SCOPES if s != "hf"]), min_size=1, max_size=2, unique=True),  # hf: test_sweep_hf
    batch=st.lists(st.sampled_from([1, 2]), min_size=1, max_size=2, unique=True),
    heads=st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=2, unique=True),
    positions=st.lists(st.sampled_from(["none", "rope"]), min_size=1, max_size=2, unique=True),
)
def test_grid_expands_to_the_product_once_each(lengths, modes, scopes, batch, heads, positions):
    variants = ["full", "sliding_window:window=8"]
    spec = cli_spec(variant=variants, lengths=lengths, mode=modes, scope=scopes, batch=batch, heads=heads, position=positions)
    cells = expand(spec)
    got = [(c.variant_spec, c.position, c.scope, c.mode, c.batch_size, c.num_heads, c.seq_len) for c in cells]
    expected = {
        (v, "none" if s == "op" else p, s, m, b, h, L)  # op scope is the attention alone: no positions
        for v, p, s, m, b, h, L in itertools.product(variants, positions, scopes, modes, batch, heads, lengths)
    }
    assert len(got) == len(set(got)) == len(expected)
    assert set(got) == expected
    by_config: dict[str, list[int]] = {}
    for c in cells:
        by_config.setdefault(c.config_key(), []).append(c.seq_len)
    assert all(seq == sorted(seq) for seq in by_config.values())  # a failure at L can skip the longer ones


def test_lengths_accept_lists_suffixes_and_doubling_ranges():
    assert parse_lengths("1K..8K", "x") == [1024, 2048, 4096, 8192]
    assert parse_lengths("512,1K,512", "x") == [512, 1024]
    assert parse_lengths([2048, "1M"], "x") == [2048, 2**20]
    assert parse_lengths("3..20", "x") == [3, 6, 12]


def test_a_spec_and_its_defaults_are_the_same_cell():
    default = attn_default("sliding_window", "window")
    a = expand(cli_spec(variant=["sliding_window"], lengths=[64]))
    b = expand(cli_spec(variant=[f"sliding_window:window={default}"], lengths=[64]))
    assert [c.key() for c in a] == [c.key() for c in b]
    c = expand(cli_spec(variant=[f"sliding_window:window={default},backend=blocked"], lengths=[64]))
    assert c[0].backend_requested == "blocked" and c[0].key() != a[0].key()


def attn_default(name, field):
    import attn

    return next(s for s in attn.list_attention() if s["name"] == name)["params"][field]


def test_later_sources_override_earlier_ones_everywhere():
    spec = load_spec("quick", cli={"lengths": [64], "variant": ["full"]})
    cells = expand(spec)
    assert {c.seq_len for c in cells} == {64}
    grids = PRESETS["quick"].settings["grid"]
    quick_modes = {m for g in grids for m in ([g["mode"]] if isinstance(g["mode"], str) else g["mode"])}
    assert {c.mode for c in cells} == quick_modes  # the preset's sub-grids survive; only lengths and variants changed
    assert {c.variant for c in cells} == {"full"}


def test_toml_file_with_subgrids(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('variant = ["full"]\nlengths = "16..64"\n'
                 '[[grid]]\nmode = "forward"\n[[grid]]\nmode = ["train"]\nlengths = [16]\n')
    cells = expand(load_spec(config=f))
    assert sorted((c.mode, c.seq_len) for c in cells) == [("forward", 16), ("forward", 32), ("forward", 64), ("train", 16)]
    cells = expand(load_spec(config=f, cli={"lengths": [128]}))  # the command line wins inside sub-grids too
    assert sorted((c.mode, c.seq_len) for c in cells) == [("forward", 128), ("train", 128)]


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_are_valid_against_the_registry(name):
    cells = expand(load_spec(name), check_device_available=False)
    assert cells and describe_presets()[name]


def test_skip_reason_only_for_longer_lengths_of_the_failed_configuration():
    cell = expand(cli_spec(variant=["full"], lengths=[64]))[0]
    other = expand(cli_spec(variant=["linear"], lengths=[64]))[0]
    failures = {cell.config_key(): ("oom", 32)}
    assert "oom at seq_len 32" in skip_reason(cell, failures)
    assert skip_reason(other, failures) is None
    assert skip_reason(cell, {cell.config_key(): ("timeout", 64)}) is None
    assert load_spec(cli={"variant": ["full"], "skip_after_failure": False}).run.skip_after_failure is False


# -- bad input -----------------------------------------------------------------------------------

BAD_INPUT = [
    (["--variant", "nope"], "unknown attention variant 'nope'"),
    (["--variant", "sliding_window:windw=3"], "unknown parameter 'windw'"),
    (["--variant", "sliding_window:window=abc"], "window must be an int"),
    (["--variant", "sliding_window:window=0"], "window must be >= 1"),
    (["--variant", "sliding_window:window"], "malformed parameter"),
    (["--variant", "full:backend=nope"], "unknown backend 'nope'"),
    (["--variant", "full", "--scope", "model", "--position", "nope"], "unknown position method 'nope'"),
    (["--variant", "full", "--scope", "model", "--position", "rope:factor=2"], "unknown parameter 'factor'"),
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--variant", "full", "--mode", "fwd"], "unknown mode 'fwd'"),
    (["--variant", "full", "--scope", "all"], "unknown scope 'all'"),
    (["--variant", "full", "--dtype", "float8"], "unknown dtype 'float8'"),
    (["--variant", "full", "--lengths", "1k2"], "malformed length '1k2'"),
    (["--variant", "full", "--lengths", "0"], "lengths must be between 1 and"),
    (["--variant", "full", "--lengths", "8K..1K"], "empty range"),
    (["--variant", "full", "--batch", "0"], "expected positive integers"),
    (["--variant", "full", "--mode", "decode", "--bidirectional"], "decode needs causal"),
    (["--variant", "full", "--device", "tpu"], "unknown device 'tpu'"),
    (["--variant", "full", "--time-limit", "abc"], "'--time-limit'"),
    (["--variant", "full", "--time-limit", "-1"], "--time-limit: expected a positive number"),
    (["--lengths", "1024"], "nothing to sweep"),
]
BAD_TOML = [
    ('variant = ["full"]\nlenghts = [1024]\n', "unknown key 'lenghts' (did you mean 'lengths'?)"),
    ('variant = ["full"]\nlengths = [1024\n', "invalid TOML"),
    ('variant = ["full"]\n[[grid]]\ndevice = "cpu"\n', "'device' can only be set at the top level"),
    ('variant = ["full"]\n[[grid]]\nmodes = ["forward"]\n', "unknown key 'modes' (did you mean 'mode'?)"),
    ('variant = ["full"]\nmode = 3\n', "expected text"),
    ('preset = "quik"\n', "unknown preset 'quik'"),
]


@pytest.fixture
def existing(tmp_path):
    """A results file with one row: bad input must leave it byte-identical."""
    out = tmp_path / "existing.jsonl"
    out.write_text('{"variant": "full", "status": "ok"}\n')
    return out


def run_main(argv, capsys):
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.err


def assert_one_line_error(rc, err, expected):
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attn-bench: error:"), err
    assert expected in lines[0]


@pytest.mark.parametrize("argv, expected", BAD_INPUT, ids=[e for _, e in BAD_INPUT])
def test_bad_input_exits_2_with_one_line_and_leaves_the_results_file_alone(argv, expected, existing, capsys):
    before, mtime = existing.read_bytes(), existing.stat().st_mtime_ns
    rc, err = run_main(["sweep", *argv, "--out", str(existing), "--resume"], capsys)
    assert_one_line_error(rc, err, expected)
    assert existing.read_bytes() == before and existing.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("text, expected", BAD_TOML, ids=[e for _, e in BAD_TOML])
def test_bad_sweep_file_exits_2(text, expected, existing, tmp_path, capsys):
    f = tmp_path / "sweep.toml"
    f.write_text(text)
    before = existing.read_bytes()
    rc, err = run_main(["sweep", "--config", str(f), "--out", str(existing), "--resume"], capsys)
    assert_one_line_error(rc, err, expected)
    assert existing.read_bytes() == before


def test_existing_results_need_resume(existing, capsys):
    before = existing.read_bytes()
    rc, err = run_main(["sweep", "--variant", "full", "--out", str(existing)], capsys)
    assert_one_line_error(rc, err, "pass --resume")
    assert existing.read_bytes() == before
    rc, err = run_main(["sweep", "--variant", "full", "--resume"], capsys)
    assert_one_line_error(rc, err, "--resume needs --out")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_requested_without_a_gpu_is_refused(capsys):
    rc, err = run_main(["sweep", "--preset", "gpu"], capsys)
    assert_one_line_error(rc, err, "no CUDA device")


def test_bad_input_through_the_real_command(existing):
    before = existing.read_bytes()
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "sweep", "--variant", "nope", "--out", str(existing), "--resume"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "unknown attention variant 'nope'" in p.stderr
    assert "Traceback" not in p.stderr
    assert existing.read_bytes() == before


# -- failures are rows, the sweep goes on ----------------------------------------------------------

FAILING_SWEEP = f"""
plugin = [{str(PLUGIN)!r}]
heads = 2
head_dim = 8
lengths = [32, 64]
min_run_time = 0.02
max_run_time = 0.1
time_limit = 8  # the hang's cost; tiny cells take a few seconds with their peaks and bandwidths
mem_limit = 1
retries = 0  # what each failure records, not the noise retries

[[grid]]
variant = ["full", "test_ballast:mib=64", "test_raises", "test_hog", "test_hang", "full:backend=xformers"]

[[grid]]
variant = ["test_segfault"]
lengths = [32]
"""
EXPECTED_STATUS = {
    ("full", 32): "ok", ("full", 64): "ok",
    ("test_ballast:mib=64", 32): "ok", ("test_ballast:mib=64", 64): "ok",
    ("test_raises", 32): "error", ("test_raises", 64): "error",  # an exception does not skip longer lengths
    ("test_hog", 32): "oom", ("test_hog", 64): "skipped",
    ("test_hang", 32): "timeout", ("test_hang", 64): "skipped",
    ("full:backend=xformers", 32): "unsupported", ("full:backend=xformers", 64): "unsupported",
    ("test_segfault", 32): "error",
}


@contextlib.contextmanager
def registry_restored():
    """Plugins loaded in this process (here, variants that hang or crash) must not leak into other tests."""
    names, errors, modules = set(ATTENTION.names()), dict(ATTENTION.plugin_errors), set(sys.modules)
    try:
        yield
    finally:
        for name in set(ATTENTION.names()) - names:
            ATTENTION.unregister(name)
        ATTENTION.plugin_errors.clear()
        ATTENTION.plugin_errors.update(errors)
        for m in set(sys.modules) - modules:
            if m.startswith("attn_plugin_"):
                del sys.modules[m]


@pytest.fixture(scope="module")
def failing_sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("failing")
    (d / "sweep.toml").write_text(FAILING_SWEEP)
    out, stdout = d / "rows.jsonl", io.StringIO()
    with registry_restored(), contextlib.redirect_stdout(stdout):
        rc = main(["sweep", "--config", str(d / "sweep.toml"), "--out", str(out)])
    assert rc == 1  # every cell of test_raises (and test_segfault) ended in `error`
    assert "test_hang" not in ATTENTION.names()
    return read_rows(out), stdout.getvalue()


def test_each_failure_is_recorded_with_its_status_while_the_rest_complete(failing_sweep):
    rows, _ = failing_sweep
    got = {(r["variant_spec"], r["seq_len"]): r["status"] for r in rows}
    assert got == EXPECTED_STATUS
    errors = {(r["variant_spec"], r["seq_len"]): r["error"] for r in rows}
    assert "deliberate failure" in errors[("test_raises", 32)]
    assert "allocate" in errors[("test_hog", 32)]
    assert "time limit" in errors[("test_hang", 32)]
    assert "oom at seq_len 32" in errors[("test_hog", 64)] and "timeout at seq_len 32" in errors[("test_hang", 64)]
    assert "SIGSEGV" in errors[("test_segfault", 32)] and "misbehaving.py" in errors[("test_segfault", 32)]  # where
    assert "CUDA" in errors[("full:backend=xformers", 32)]


def test_rows_match_the_schema(failing_sweep):
    rows, _ = failing_sweep
    env_keys = set(environment())
    assert len({r["run_id"] for r in rows}) == 1
    for r in rows:
        assert set(COST_FIELDS) <= set(r) and env_keys <= set(r)
        assert r["status"] in STATUSES
        assert r["device_name"] and r["torch_version"] == torch.__version__
        if r["status"] != "ok":
            assert r["error"] and r["latency_ms"] is None and r["peak_mem_bytes"] is None
            continue
        B, H, D, L = r["batch_size"], r["num_heads"], r["head_dim"], r["seq_len"]
        seconds = r["latency_ms"] / 1e3
        assert seconds > 0 and (r["latency_iqr_ms"] is None or r["latency_iqr_ms"] >= 0)
        assert r["repeats"] >= 1 and r["warmup_s"] > 0 and r["compile_s"] >= 0
        assert r["tokens_per_s"] == pytest.approx(B * L / seconds)
        # causal softmax attention: QK^T and PV over the L(L+1)/2 visible pairs, 2 FLOPs per multiply-add
        assert r["flops"] == 4 * B * H * D * L * (L + 1) // 2
        assert r["achieved_flops_per_s"] == pytest.approx(r["flops"] / seconds)
        assert r["peak_flops_per_s"] > 0
        assert r["peak_fraction"] == pytest.approx(r["achieved_flops_per_s"] / r["peak_flops_per_s"])
        # forward: q, k, v read and the output written once, fp32
        assert r["bytes"] == 4 * B * L * D * 4 * H and r["arithmetic_intensity"] == pytest.approx(r["flops"] / r["bytes"])
        assert r["bandwidth_peak_bytes_per_s"] == max(r["bandwidth_before_bytes_per_s"], r["bandwidth_after_bytes_per_s"])
        assert r["bandwidth_fraction"] == pytest.approx(r["bytes"] / seconds / r["bandwidth_peak_bytes_per_s"])
        assert r["roofline_fraction"] == max(r["peak_fraction"], r["bandwidth_fraction"])
        assert r["peak_mem_bytes"] > 0
    full = [r for r in rows if r["variant_spec"] == "full"]
    assert all(r["backend"] == "sdpa" for r in full)  # auto never picks the dense reference when SDPA can run


def test_peak_memory_sees_a_known_allocation(failing_sweep):
    rows, _ = failing_sweep
    peak = {(r["variant_spec"], r["seq_len"]): r["peak_mem_bytes"] for r in rows}
    for L in (32, 64):
        extra = peak[("test_ballast:mib=64", L)] - peak[("full", L)]
        assert 60 * 2**20 <= extra <= 68 * 2**20, extra / 2**20


def test_summary_marks_every_failure(failing_sweep):
    _, stdout = failing_sweep
    for mark in ("OOM", "T/O", "skip", "n/a", "ERR"):
        assert mark in stdout
    assert "median latency" in stdout and "peak memory" in stdout


def test_summary_names_each_reason_once_with_its_cell(failing_sweep):
    _, stdout = failing_sweep
    reasons = stdout[stdout.index("why cells did not finish"):]
    assert reasons.count("deliberate failure from test_raises") == 1  # two cells, one reason
    assert "error x2 at test_raises forward L=32: RuntimeError: deliberate failure" in reasons
    assert "timeout x1 at test_hang" in reasons and "SIGSEGV" in reasons and "unsupported x2 at full:backend=xformers" in reasons
    assert "skipped" not in reasons  # a skip's reason is the failure listed above it


def test_exit_status_rule():
    from harness.cost.summary import failed_variants

    row = lambda v, status: {"variant_spec": v, "status": status, "seq_len": 32}
    rows = [row("a", "ok"), row("a", "error"), row("b", "error"), row("b", "oom"), row("c", "unsupported"),
            row("d", "oom"), row("d", "skipped")]
    assert failed_variants(rows) == ["b"]  # no ok cell and an error; limits (oom, unsupported) are results


# -- resume after a kill -------------------------------------------------------------------------

def _workers_of(pid):
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "harness.cost.worker" in cmd and "--parent" in cmd and cmd[cmd.index("--parent") + 1] == str(pid):
            found.append(p)
    return found


def test_resume_after_a_killed_sweep_measures_every_cell_exactly_once(tmp_path):
    out = tmp_path / "resume.jsonl"
    variants, lengths, batch = ["full", "linear"], [16, 32, 64], [1, 2]
    argv = ["sweep", "--variant", variants[0], "--variant", variants[1], "--lengths", "16,32,64", "--batch", "1,2",
            *FAST, "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *argv], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    try:
        while len(read_rows(out)) < 3:
            assert proc.poll() is None, "the sweep ended before it could be killed"
            assert time.monotonic() < deadline, "the sweep wrote no rows"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    data = out.read_bytes()
    before = data[: data.rfind(b"\n") + 1]  # a row torn by the kill is cut when the file is resumed
    n_before = len(read_rows(out))
    assert 3 <= n_before < 12
    for _ in range(100):  # the worker dies with its sweep (no orphan keeps computing)
        if not _workers_of(proc.pid):
            break
        time.sleep(0.05)
    assert not _workers_of(proc.pid)

    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*argv, "--resume"]) == 0
    assert out.read_bytes().startswith(before)  # rows already measured are never rewritten
    rows = read_rows(out)
    keys = [cell_key(r, KEY_FIELDS) for r in rows]
    assert len(keys) == len(set(keys)) == 12
    assert {(r["variant"], r["seq_len"], r["batch_size"]) for r in rows} == set(itertools.product(variants, lengths, batch))
    assert all(r["status"] == "ok" for r in rows)
    assert len({r["run_id"] for r in rows}) == 2

    with contextlib.redirect_stdout(io.StringIO()):  # resuming a finished sweep measures nothing
        assert main([*argv, "--resume"]) == 0
    assert len(read_rows(out)) == 12


def test_plugin_that_fails_to_load_is_named(tmp_path, capsys):
    bad = tmp_path / "broken.py"
    bad.write_text("raise ImportError('no such kernel')\n")
    with registry_restored():
        rc, err = run_main(["sweep", "--plugin", str(bad), "--variant", "my_variant", "--out", str(tmp_path / "x.jsonl")],
                           capsys)
    assert rc == 2
    assert "failed to load" in err and "no such kernel" in err
    assert "unknown attention variant 'my_variant'" in err.strip().splitlines()[-1]
    assert not (tmp_path / "x.jsonl").exists()


def test_cells_roundtrip_through_rows():
    cells = expand(cli_spec(variant=["sliding_window:window=8"], lengths=[16], mode=["decode"], scope=["model"],
                            position=["rope"]))
    for c in cells:
        assert Cell.from_row(c.as_row()) == c
        assert cell_key(c.as_row(), KEY_FIELDS) == c.key()



def test_summary_fits_the_cost_exponent_and_keeps_every_configuration():
    cells = expand(cli_spec(variant=["full", "linear"], lengths="1K..8K", scope=["op", "model"]))
    rows = []
    for c in cells:
        power = 2 if c.variant == "full" else 1  # synthetic: quadratic and linear costs
        failed = c.scope == "model" and c.variant == "full" and c.seq_len == 8192
        result = {"status": "oom", "error": "x"} if failed else {"status": "ok", "latency_ms": 3e-6 * c.seq_len**power,
                                                                  "peak_mem_bytes": 2**20 * c.seq_len // 1024}
        rows.append(make_row(c, result, {}, "run", {}))
    text = summary_tables(rows)
    latency = text.split("peak memory")[0]
    assert latency.count(" model ") == 2 and latency.count(" op ") == 2  # op rows survive their layers=None
    assert latency.count(" 2.00") == 2 and latency.count(" 1.00") == 2
    memory = text.split("peak memory")[1]
    assert "OOM" in memory
    assert [line.split()[-1] for line in memory.splitlines() if line.startswith("linear")] == ["8"]  # 8K tokens: 8 MiB
    assert loglog_slope([1, 2, 4], [5, 20, 80]) == pytest.approx(2.0)


def test_the_summary_says_how_many_cells_are_noisy():
    from harness.cost.summary import summary_tables

    row = {"variant": "full", "variant_spec": "full", "status": "ok", "seq_len": 512, "latency_ms": 1.0,
           "peak_mem_bytes": 2**20, "mode": "forward"}
    assert "noisy" not in summary_tables([row, {**row, "seq_len": 1024, "noisy": False}])
    assert "1 ok cells are noisy" in summary_tables([row, {**row, "seq_len": 1024, "noisy": True}])


def test_threads_reach_the_worker_and_the_rows(tmp_path):
    out = tmp_path / "t.jsonl"
    rc = main(["sweep", "--variant", "full", "--lengths", "64", "--heads", "2", "--head-dim", "8", "--threads", "1",
               "--min-run-time", "0.02", "--max-run-time", "0.05", "--out", str(out)])
    assert rc == 0
    assert [r["num_threads"] for r in read_rows(out)] == [1]
    assert main(["sweep", "--variant", "full", "--lengths", "64", "--threads", "0", "--out", str(tmp_path / "u.jsonl")]) == 2
    assert not (tmp_path / "u.jsonl").exists()


# -- CUDA chains: a peak per chain, an error ends the chain ---------------------------------------

class _FakeWorker:
    """Answers every cell ``ok`` with the peaks it was asked to time (so no process and no GPU are needed)."""

    startup_s, starts = 0.0, 1

    def __init__(self):
        self.asked: list[tuple[str, ...]] = []

    def run_cell(self, row, timing, seed, time_limit_s, peaks, options=None):
        self.asked.append(peaks)
        peak = 4e14 + len(self.asked)  # a new value each time: which cell timed it shows
        return {"status": "ok", "latency_ms": 1.0, "achieved_flops_per_s": 1e14, "peak_dtype": row["dtype"],
                "peak_before_flops_per_s": peak if "before" in peaks else None,
                "peak_after_flops_per_s": peak if "after" in peaks else None}

    def close(self):
        pass


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_matmul_peak_is_timed_once_per_chain_on_cuda_and_around_every_cell_on_cpu(device):
    from harness.cost.spec import RunSettings
    from harness.cost.sweep import CellMeasurer

    cells = expand(cli_spec(variant=["full", "linear"], lengths=[64, 128], device=device), check_device_available=False)
    measurer = CellMeasurer(RunSettings(device=device, retries=0), "r")
    measurer.worker = fake = _FakeWorker()
    results = [measurer.run(c)["result"] for c in cells]  # full 64, 128, then linear 64, 128: two chains
    if device == "cpu":
        assert fake.asked == [("before", "after")] * 4
        assert {r["peak_timing"] for r in results} == {"cell"}
        return
    assert fake.asked == [("before",), (), ("before",), ()]
    assert [r["peak_flops_per_s"] for r in results] == [4e14 + 1, 4e14 + 1, 4e14 + 3, 4e14 + 3]
    assert {r["peak_timing"] for r in results} == {"chain"}
    assert results[1]["peak_fraction"] == pytest.approx(1e14 / (4e14 + 1))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_on_cuda_an_error_skips_the_rest_of_its_chain_with_the_reason(device):
    from harness.cost.sweep import make_chains

    cells = expand(cli_spec(variant=["full"], lengths=[64, 128, 256], device=device), check_device_available=False)
    (chain,) = make_chains(cells, {}, skip=True)
    cell, payload = chain.next()
    assert payload is None
    chain.finish(cell, {"result": {"status": "error", "error": "CUDA error: an illegal memory access"},
                        "env": {"device_name": "x"}, "run_id": "r", "extra": {}})
    rest = [chain.next() for _ in range(2)]
    if device == "cpu":  # a CPU worker keeps its compiles after an error: the next length is worth trying
        assert [p for _, p in rest] == [None, None]
        return
    assert [p["result"]["status"] for _, p in rest] == ["skipped", "skipped"]
    assert all("error at seq_len 64" in p["result"]["error"] and "CUDA" in p["result"]["error"] for _, p in rest)


def test_the_cuda_host_watchdog_has_a_floor_of_half_the_machine_and_says_which_rule_set_it(monkeypatch):
    import psutil

    from harness.memory import cell_memory_limits

    class Mem:
        total, available = 128 * 2**30, 10 * 2**30  # a VM that hands out memory on demand: little free at the start

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Mem)
    assert cell_memory_limits("cuda", None) == (None, 64 * 2**30, "total")
    assert cell_memory_limits("cpu", None) == (8 * 2**30, None, "available")  # a CPU cell's own limit: no floor
    Mem.available = 120 * 2**30
    assert cell_memory_limits("cuda", None) == (None, 96 * 2**30, "available")
