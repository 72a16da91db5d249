"""`attn-bench check` and the shared checker (attn.checks): one definition of "correct" for built-ins and plugins."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attn
from attn.checks import check_variant

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", "check", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("name", ["full", "sliding_window", "block_sparse", "linear"])
def test_every_builtin_passes_the_shared_checker(name):
    findings = check_variant(name, {"window": 40} if name == "sliding_window" else {})
    assert not [f for f in findings if f.status == "mismatch"], [f for f in findings if f.status == "mismatch"]
    for b in attn.build_attention(name).backends:  # every CPU backend really ran: nothing passed by being skipped
        if b.name != "reference" and "cpu" in b.devices:
            assert any(f.backend == b.name and f.status == "ok" for f in findings), b.name
    assert any(f.backend == "decode state" and f.status == "ok" for f in findings)


def test_check_passes_the_examples():
    for example in ("sink_attention.py", "softcap_attention.py"):
        r = cli("--plugin", str(ROOT / "examples" / example))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "every backend that can run here equals its reference" in r.stdout


def test_check_names_a_fast_backend_that_is_off_by_a_little():
    r = cli("--plugin", str(PLUGINS / "off_by_one.py"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "MISMATCH forward float32 causal" in r.stdout and "output off by" in r.stdout and "tolerance" in r.stdout
    assert "mismatch(es)" in r.stderr


@pytest.mark.parametrize("argv, why", [
    (["--variant", "nope"], "unknown attention variant 'nope'"),
    (["--variant", "sliding_window:window=0"], "window must be >= 1"),
    (["--plugin", str(PLUGINS / "not_attention.py")], "failed to load"),
])
def test_bad_input_is_one_line_and_exit_2(argv, why):
    r = cli(*argv)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and why in r.stderr


def test_the_sink_example_decodes_in_bounded_memory():
    attn.load_plugin(str(ROOT / "examples" / "sink_attention.py"))
    m = attn.build_attention("sink_attention", window=8, sinks=2)
    state = m.new_state()
    q = torch.randn(1, 2, 1, 16)
    sizes = []
    for _ in range(100):
        m.step(q, q, q, state)
        sizes.append(state.k.shape[2])
    assert max(sizes) == 2 + 8 - 1 and sizes[-1] == sizes[20]  # sinks + window - 1, whatever the length
    assert state.nbytes() == 2 * 1 * 2 * 9 * 16 * 4


def test_the_plugin_guide_quotes_the_tested_example():
    """Every line of the guide's python excerpts is a line of examples/sink_attention.py, which the
    tests above check and decode: the guide cannot drift from working code."""
    import re

    guide = (ROOT / "docs" / "plugins.md").read_text()
    example = {line.strip() for line in (ROOT / "examples" / "sink_attention.py").read_text().splitlines()}
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    assert len(blocks) >= 4
    for block in blocks:
        for line in block.splitlines():
            assert not line.strip() or line.strip() in example, line
    assert "attn-bench check --plugin examples/sink_attention.py" in guide
    assert "(docs/plugins.md)" in (ROOT / "README.md").read_text()


def test_the_sink_example_counts_its_visible_pairs_in_closed_form():
    import sys

    attn.load_plugin(str(ROOT / "examples" / "sink_attention.py"))
    mod = sys.modules[type(attn.build_attention("sink_attention")).__module__]
    for w, s in ((5, 2), (1, 0), (300, 4), (3, 10)):
        m = attn.build_attention("sink_attention", window=w, sinks=s)
        for lq, lk in ((37, 37), (1, 50), (7, 20)):
            for causal in (True, False):
                pos = torch.arange(lk)
                dense = int(mod.sink_mask(pos[lk - lq:], pos, w, s, causal).sum())
                assert m.pairs(lq, lk, causal) == dense, (w, s, lq, lk, causal)
