"""Serving-shaped decoding in the cost harness: several new tokens a step (--queries-per-step) and the largest batch a
memory budget holds (--budget), their cells, counts and refusals."""
import pytest
import torch

import attn
from harness.cli import main
from harness.cost.capacity import batched_state, capacity_batch
from harness.cost.cells import attention_bytes, attention_flops
from harness.cost.scopes.op import build_op
from harness.cost.spec import build_spec, expand


def cells_of(**grid):
    return expand(build_spec([("command line", dict(lengths=[64], **grid))]))


def test_queries_and_budgets_shape_decode_cells_only():
    cells = cells_of(variant=["full"], mode=["forward", "decode"], queries=[1, 4])
    assert sorted((c.mode, c.queries or 1) for c in cells) == [("decode", 1), ("decode", 4), ("forward", 1)]
    cells = cells_of(variant=["full"], mode=["decode"], budget=[2**20, 2**22])
    assert sorted(c.budget_bytes for c in cells) == [2**20, 2**22] and {c.batch_size for c in cells} == {1}
    assert len({c.key() for c in cells}) == 2 and "budget=1MiB" in min(cells, key=lambda c: c.budget_bytes).label


def test_a_step_of_t_tokens_counts_each_token_against_its_own_context_and_reads_the_state_once():
    full = attn.build_attention("full")
    (one,) = cells_of(variant=["full"], mode=["decode"])
    (four,) = cells_of(variant=["full"], mode=["decode"], queries=[4])
    B, H, D, L = 1, 8, 64, 64
    assert attention_flops(full, four) == full.flops(B, H, 4, L + 4, D)  # the 4 queries' causal rows over L + 4 keys
    new = 4 * B * D * 4 * H  # q, k, v, o of one token, fp32
    assert attention_bytes(full, one) == new + 4 * 2 * B * H * D * (L + 1)
    assert attention_bytes(full, four) == 4 * new + 4 * 2 * B * H * D * (L + 4)  # L cached read, 4 written
    lin = attn.build_attention("linear")
    (lin4,) = cells_of(variant=["linear"], mode=["decode"], queries=[4])
    (lin1,) = cells_of(variant=["linear"], mode=["decode"])
    assert attention_flops(lin, lin4) == 4 * attention_flops(lin, lin1)
    assert attention_bytes(lin, lin4) == attention_bytes(lin, lin1) + 3 * new  # the state once, whatever T


@pytest.mark.parametrize("spec", ["full", "sliding_window:window=16", "linear", "gated_deltanet", "quest:page_size=8"])
def test_a_budget_cell_decodes_the_batch_whose_state_fits(spec):
    name, params = attn.parse_spec(spec)
    (cell,) = cells_of(variant=[spec], mode=["decode"], queries=[2], budget=[3 * 2**20])
    torch.manual_seed(0)
    measured = build_op(cell)
    columns = measured.columns()
    one, batch = columns["state_bytes_per_sequence"], columns["capacity_batch"]
    assert batch == 3 * 2**20 // one >= 1 and columns["state_bytes"] <= 3 * 2**20
    assert measured.tokens == 2 * batch
    out = measured.fn()
    assert out.shape == (batch, 8, 2, 64) and torch.isfinite(out).all()
    module = attn.build_attention(name, **params)
    counted = type(cell)(**{**cell.as_row(), "batch_size": batch})
    assert measured.flops == attention_flops(module, counted) and measured.bytes == attention_bytes(module, counted)


@pytest.mark.parametrize("spec, length", [("block_sparse", 1), ("block_sparse:block_size=1,local_blocks=1,global_blocks=0", 9),
                                          ("full", 5), ("linear", 5)])
def test_a_batch_decodes_from_one_prompt_repeated_even_where_a_state_holds_one_position(spec, length):
    """Even batches prefill one prompt and repeat its state: a 1-D tensor of positions (block_sparse's band keeps
    (kept,) of them, one at L=1) is shared, not taken for a batch of one."""
    (cell,) = expand(build_spec([("command line", dict(lengths=[length], variant=[spec], mode=["decode"], batch=[3],
                                                       heads=[4], kv_heads=[2], head_dim=[16]))]))
    torch.manual_seed(0)
    measured = build_op(cell)
    out = measured.fn()
    assert out.shape == (3, 4, 1, 16) and torch.isfinite(out).all()


def test_a_repeated_state_decodes_each_sequence_as_the_one_it_repeats():
    m = attn.build_attention("sliding_window", window=8)
    state = m.start_state(40)
    q, k, v = (torch.randn(1, 2, 30, 4, dtype=torch.float64) for _ in range(3))
    m.run_step(q, k, v, state)
    many = batched_state(state, 3)
    step = [torch.randn(1, 2, 1, 4, dtype=torch.float64) for _ in range(3)]
    want = m.run_step(*step, state)
    got = m.run_step(*(t.expand(3, -1, -1, -1) for t in step), many)
    torch.testing.assert_close(got, want.expand(3, -1, -1, -1))
    assert many.nbytes() == 3 * state.nbytes()


def test_capacity_is_the_whole_number_of_states_that_fit():
    assert capacity_batch(2**30, 2**20 * 3) == 341 and capacity_batch(2**20, 2**21) == 0
    with pytest.raises(ValueError, match="nothing to size"):
        capacity_batch(2**30, 0)


@pytest.mark.parametrize("argv, expected", [
    (["--queries-per-step", "4"], "--queries-per-step shape decoding steps: add --mode decode"),
    (["--mode", "decode", "--budget", "1GiB", "--scope", "model"], "run in --scope op only"),
    (["--mode", "decode", "--budget", "1GiB", "--batch", "8"], "--budget finds each cell's batch"),
    (["--mode", "decode", "--budget", "lots"], "expected sizes such as 1GiB"),
])
def test_bad_serving_options_exit_2_with_one_line(argv, expected, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = main(["sweep", "--variant", "full", *argv, "--out", str(out), "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and expected in err[0], err
    assert not out.exists()
