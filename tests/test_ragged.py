"""Ragged decoding (--ragged): one batched step over sequences of different contexts equals, row by row, each
sequence's own step on its own state; the variants without it refuse; the cells count each sequence's own work."""
import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention.token_inputs import draw_inputs
from harness.cli import main
from harness.cost.cells import attention_bytes, attention_flops
from harness.cost.scopes.op import build_op
from harness.cost.spec import build_spec, expand

H, HKV, D = 4, 2, 8
RAGGED = ["full", "sliding_window:window=6", "linear", "retention", "gla", "gated_deltanet", "mamba2"]


@torch.no_grad()
def one_sequence(module, n):
    """A one-sequence state holding a random prompt of ``n`` tokens."""
    state = module.start_state(n + 4)
    q, k, v = (torch.randn(1, h, n, D, dtype=torch.float64) for h in (H, HKV, HKV))
    module.run_step(q, k, v, state, **draw_inputs(module.token_inputs, 1, HKV, n, D, dtype=torch.float64))
    return state


@torch.no_grad()
def check_rows(spec, contexts, step_tokens):
    """The ragged step against each sequence's own, twice (the second after the harness's rewind)."""
    name, params = attn.parse_spec(spec)
    module = attn.build_attention(name, **params).double()
    states = [one_sequence(module, n) for n in contexts]
    ragged = module.ragged_state(states, step_tokens)
    B, T = len(contexts), step_tokens
    q, k, v = (torch.randn(B, h, T, D, dtype=torch.float64) for h in (H, HKV, HKV))
    inputs = draw_inputs(module.token_inputs, B, HKV, T, D, dtype=torch.float64)
    want = [module.run_step(q[b:b + 1], k[b:b + 1], v[b:b + 1], copy.deepcopy(s), **{n: x[b:b + 1] for n, x in inputs.items()})
            for b, s in enumerate(states)]
    before = ragged.length
    for _ in range(2):
        got = module.run_step(q, k, v, ragged, **inputs)
        torch.testing.assert_close(got, torch.cat(want))
        ragged.truncate(before)
    assert ragged.length == before


@pytest.mark.parametrize("spec", RAGGED)
@settings(max_examples=6, deadline=None)
@given(contexts=st.lists(st.integers(1, 20), min_size=1, max_size=4))
def test_a_ragged_step_decodes_each_sequence_as_its_own_state_would(spec, contexts):
    check_rows(spec, contexts, 1)


@pytest.mark.parametrize("spec", [s for s in RAGGED if not s.startswith("sliding_window")])
def test_several_tokens_a_step_are_exact_too(spec):
    check_rows(spec, [3, 17, 9], 3)


def test_a_padded_cache_counts_what_its_sequences_hold():
    m = attn.build_attention("full").double()
    ragged = m.ragged_state([one_sequence(m, n) for n in (5, 11)])
    assert ragged.nbytes() == 2 * (5 + 11) * HKV * D * 8 and ragged.length == 11


@pytest.mark.parametrize("spec, steps, why", [
    ("block_sparse:block_size=4", 1, "does not decode ragged batches"),
    ("moba", 1, "does not decode ragged batches"),
    ("full:alibi=true", 1, "plain full attention"),
    ("sliding_window:window=6,sinks=2", 1, "plain window"),
    ("sliding_window:window=6", 2, "one token a step"),
])
def test_the_others_refuse_clearly(spec, steps, why):
    name, params = attn.parse_spec(spec)
    m = attn.build_attention(name, **params).double()
    with pytest.raises(attn.UnsupportedBackend, match=why):
        m.ragged_state([one_sequence(m, n) for n in (8, 12)], steps)


def cells_of(**grid):
    return expand(build_spec([("command line", dict(lengths=[64], mode=["decode"], **grid))]))


def test_contexts_are_drawn_in_range_the_same_every_time_and_counted_each_on_its_own():
    (cell,) = cells_of(variant=["full"], batch=[16], ragged=[0.5])
    contexts = cell.contexts()
    assert contexts == cell.contexts() and len(contexts) == 16 and len(set(contexts)) > 1
    assert all(32 <= n <= 96 for n in contexts) and "ragged=0.5" in cell.label
    full = attn.build_attention("full")
    assert attention_flops(full, cell) == sum(full.mode_flops("decode", 1, 8, n, 64) for n in contexts)
    assert attention_bytes(full, cell) == sum(full.mode_bytes("decode", 1, 8, n, 64) for n in contexts)
    (even,) = cells_of(variant=["full"], batch=[16])
    assert even.contexts() == [64] * 16 and even.ragged is None and even.key() != cell.key()


@pytest.mark.parametrize("spec", ["full", "sliding_window:window=16", "gated_deltanet"])
def test_a_ragged_cell_decodes_its_batch_and_reports_the_contexts(spec):
    (cell,) = cells_of(variant=[spec], batch=[3], ragged=[0.5], heads=[4], kv_heads=[2], head_dim=[16])
    torch.manual_seed(0)
    measured = build_op(cell)
    columns = measured.columns()
    assert columns["contexts"] == cell.contexts() and columns["state_bytes"] == measured.state.nbytes()
    out = measured.fn()
    assert out.shape == (3, 4, 1, 16) and torch.isfinite(out).all()
    assert measured.state.length == max(cell.contexts())  # rewound after the timed step


@pytest.mark.parametrize("argv, expected", [
    (["--ragged", "0.5"], "--ragged shape decoding steps: add --mode decode"),
    (["--mode", "decode", "--ragged", "0.5", "--scope", "model"], "run in --scope op only"),
    (["--mode", "decode", "--ragged", "1"], "expected fractions in [0, 1)"),
    (["--mode", "decode", "--ragged", "0.5", "--budget", "1GiB"], "ragged batches under a budget are not built"),
])
def test_bad_ragged_options_exit_2_with_one_line(argv, expected, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = main(["sweep", "--variant", "full", *argv, "--out", str(out), "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and expected in err[0], err
    assert not out.exists()
