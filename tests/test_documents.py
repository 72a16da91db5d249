"""Packed documents (``documents=``): no information crosses a document boundary, for every registered
variant; the fallback equals separate calls; the backbone and the sweep carry ``--docs``; bad ids are refused."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attn
from attn.attention.documents import even_documents, lengths
from attn.attention.token_inputs import draw_inputs
from attn.registry import ATTENTION
from harness.cli import main
from harness.cost.cells import Cell, attention_flops
from harness.cost.spec import build_spec, expand

pytestmark = pytest.mark.usefixtures("one_thread")
# one small spec per built-in variant (windows and blocks smaller than the documents, so masks matter)
SPECS = {"full": {}, "sliding_window": {"window": 5}, "block_sparse": {"block_size": 4}, "linear": {}}


def variants():
    return list(SPECS) + [n for n in ATTENTION.names() if n not in SPECS]


@st.composite
def packed(draw):
    sizes = draw(st.lists(st.integers(1, 13), min_size=2, max_size=4))
    L = sum(sizes)
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    H_kv = draw(st.sampled_from([1, 2]))
    H = H_kv * draw(st.sampled_from([1, 2]))
    lq = draw(st.sampled_from([L, max(1, L - sizes[-1] - 1), 1]))
    return ids, (2, H, H_kv, lq, L, 8), draw(st.integers(0, 2**16))


def make(name, shape, seed):
    B, H, Hkv, lq, lk, D = shape
    g = torch.Generator().manual_seed(seed)
    m = attn.build_attention(name, **SPECS.get(name, {}))
    q = torch.randn(B, H, lq, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, lk, D, generator=g, dtype=torch.float64) for _ in range(2))
    return m, q, k, v, draw_inputs(m.token_inputs, B, Hkv, lk, D, dtype=torch.float64, generator=g)


@pytest.mark.parametrize("name", variants())
@given(case=packed())
def test_no_information_crosses_a_document_boundary(name, case):
    ids, shape, seed = case
    m, q, k, v, extra = make(name, shape, seed)
    if not m.supports_causal:
        pytest.skip("bidirectional-only variant")
    out = m(q, k, v, documents=ids, **extra)
    assert out.shape == q.shape
    # perturb every document but the last: the last document's outputs must not move
    first_last = int((ids == ids[-1]).nonzero()[0])
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :first_last] += torch.randn_like(k2[:, :, :first_last])
    v2[:, :, :first_last] *= -3
    extra2 = {n: t.clone() for n, t in extra.items()}
    for t in extra2.values():
        t[:, :, :first_last] = t[:, :, :first_last].flip(2)
    out2 = m(q, k2, v2, documents=ids, **extra2)
    lq, lk = q.shape[2], k.shape[2]
    last_queries = slice(max(0, first_last - (lk - lq)), lq)
    torch.testing.assert_close(out2[:, :, last_queries], out[:, :, last_queries], rtol=0, atol=0)
    # and each document alone gives the same output
    alone = m(q[:, :, last_queries], k[:, :, first_last:], v[:, :, first_last:],
              **{n: t[:, :, first_last:] for n, t in extra.items()})
    torch.testing.assert_close(out[:, :, last_queries], alone, rtol=1e-9, atol=1e-9)


def test_equal_documents_fold_into_the_batch_and_rows_may_differ():
    m = attn.build_attention("full")
    q, k, v = (torch.randn(3, 2, 12, 8, dtype=torch.float64) for _ in range(3))
    ids = even_documents(12, 3)
    expected = torch.cat([m(q[..., i:i + 4, :], k[..., i:i + 4, :], v[..., i:i + 4, :]) for i in (0, 4, 8)], 2)
    torch.testing.assert_close(m(q, k, v, documents=ids), expected)
    per_row = torch.stack([ids, torch.zeros(12, dtype=torch.long), torch.arange(12) // 6])  # (B, L), rows differ
    got = m(q, k, v, documents=per_row)
    torch.testing.assert_close(got[1:2], m(q[1:2], k[1:2], v[1:2]))
    torch.testing.assert_close(got[0:1], expected[0:1])


@pytest.mark.parametrize("ids, message", [
    (torch.tensor([0, 0, 1, 0]), "non-decreasing"),
    (torch.tensor([0.0, 0.0, 1.0, 1.0]), "integer ids"),
    (torch.tensor([0, 0, 1]), "expected (4,)"),
    (torch.zeros(3, 4, dtype=torch.long), "expected (4,) or (2, 4)"),
])
def test_bad_document_ids_are_refused(ids, message):
    q = torch.randn(2, 2, 4, 8)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        attn.build_attention("full")(q, q, q, documents=ids)


def test_backbone_keeps_documents_apart_and_refuses_packed_decoding():
    torch.manual_seed(0)
    model = attn.Transformer(attn.TransformerConfig(d_model=32, n_heads=4, num_kv_heads=2, n_layers=2,
                                                    position="rope")).eval()
    ids = torch.arange(16) // 8
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[:, :8] = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        a, b = model(x, documents=ids), model(y, documents=ids)
        torch.testing.assert_close(a[:, 8:], b[:, 8:], rtol=0, atol=0)
        assert not torch.allclose(model(x)[:, 8:], model(y)[:, 8:])  # without documents, it does cross
        with pytest.raises(ValueError, match="decoding packed documents"):
            model(x, state=model.init_state(1, 16), documents=ids)


def test_sweep_cells_count_only_within_document_pairs():
    cells = expand(build_spec([("command line", dict(variant=["full", "linear"], lengths=[64], docs=[1, 4],
                                                      mode=["forward", "train", "decode"]))]))
    assert sorted((c.variant, c.mode, c.docs or 1) for c in cells) == sorted(
        (v, m, d) for v in ("full", "linear") for m in ("forward", "train", "decode") for d in (1, 4)
        if not (m == "decode" and d > 1))  # a packed decode step is a step of the last document: not a cell
    full = attn.build_attention("full")
    cell = next(c for c in cells if c.variant == "full" and c.mode == "forward" and c.docs == 4)
    assert attention_flops(full, cell) == 4 * full.mode_flops("forward", 1, 8, 16, 64)
    assert lengths(cell.documents(), 64) == [16] * 4
    lin = attn.build_attention("linear")
    one = next(c for c in cells if c.variant == "linear" and c.mode == "forward" and not c.docs)
    packed_lin = next(c for c in cells if c.variant == "linear" and c.mode == "forward" and c.docs == 4)
    assert attention_flops(lin, one) == attention_flops(lin, packed_lin)  # linear's work is per token either way
    assert Cell.from_row(cell.as_row()) == cell and cell.key() != Cell.from_row({**cell.as_row(), "docs": None}).key()


@pytest.mark.parametrize("argv, expected", [
    (["--docs", "0"], "expected positive integers"),
    (["--docs", "65", "--lengths", "64"], "docs 65 exceeds length 64"),
    (["--docs", "2", "--scope", "hf"], "--docs needs scope op or model"),
])
def test_bad_docs_exit_2_with_one_line(argv, expected, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = main(["sweep", "--variant", "full", *argv, "--out", str(out), "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and expected in err[0], err
    assert not out.exists()
