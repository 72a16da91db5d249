"""`block_sparse`: the layout is pinned against its written definition, every backend equals the
reference (forward and gradients), and pairs / density / FLOPs count exactly the visible pairs."""
import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

import attn
from attn.attention import block_sparse as bsp
from attn.attention import flex
from attn.attention.base import UnsupportedBackend
from attn.attention.gathered import gathered_attention

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def definition_layout(cfg: bsp.BlockSparseConfig, n: int, causal: bool) -> torch.Tensor:
    """The deterministic parts (band, global, stride) of the (n, n) layout, one pair at a time."""
    out = torch.zeros(n, n, dtype=torch.bool)
    for b in range(n):
        for c in range(n):
            band = 0 <= b - c < cfg.local_blocks if causal else abs(b - c) < cfg.local_blocks
            glob = c < cfg.global_blocks or (not causal and b < cfg.global_blocks)
            strided = cfg.stride > 0 and (b - c) % cfg.stride == 0
            out[b, c] = (band or glob or strided) and (c <= b or not causal)
    return out


def definition_mask(cfg: bsp.BlockSparseConfig, lq: int, lk: int, causal: bool) -> torch.Tensor:
    """Element rule from the module docstring, using the module's full (lk x lk) layout."""
    full = bsp.block_layout(cfg, lk, lk, causal)  # rows = every absolute block
    bs = cfg.block_size
    mask = torch.zeros(lq, lk, dtype=torch.bool)
    for qi in range(lq):
        i = qi + lk - lq  # bottom-right aligned
        for j in range(lk):
            mask[qi, j] = bool(full[i // bs, j // bs]) and (j <= i or not causal)
    return mask


def float64_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(D)) v in float64, written apart from the code under test."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf)
    return torch.softmax(s, -1) @ v


@st.composite
def configs(draw, max_block=8):
    local = draw(st.integers(0, 4))
    glob = draw(st.integers(0 if local else 1, 2))
    return bsp.BlockSparseConfig(
        block_size=draw(st.integers(1, max_block)), local_blocks=local, global_blocks=glob,
        random_blocks=draw(st.integers(0, 2)), stride=draw(st.sampled_from([0, 0, 2, 3])), seed=draw(st.integers(0, 3)),
    )


@st.composite
def lengths(draw, max_len=48):
    lk = draw(st.integers(1, max_len))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    return lq, lk


def make_qkv(lq, lk, dtype=torch.float32, seed=0, B=2, H=2, D=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=g).to(dtype) for L in (lq, lk, lk)]


def module(cfg: bsp.BlockSparseConfig, backend: str = "auto"):
    return attn.build_attention("block_sparse", backend=backend, **cfg.__dict__)


# -- the layout ------------------------------------------------------------------------------------


@settings(max_examples=30)
@given(configs(), st.integers(1, 30), st.booleans())
def test_layout_is_its_definition_plus_random_blocks(cfg, n_blocks, causal):
    L = n_blocks * cfg.block_size
    lay = bsp.block_layout(cfg, L, causal=causal)
    assert lay.shape == (n_blocks, n_blocks)
    det = definition_layout(cfg, n_blocks, causal)
    assert not (det & ~lay).any()  # every deterministic block present
    extra = (lay & ~det).sum(-1)
    for b in range(n_blocks):  # random blocks: min(random_blocks, candidates) new ones per row
        cand = (~det[b])[:b].sum() if causal else (~det[b]).sum()
        assert extra[b] == min(cfg.random_blocks, int(cand))
    if causal:
        assert not lay.triu(1).any()


@settings(max_examples=30)
@given(configs(), lengths(), st.booleans())
def test_layout_rows_and_shape_for_any_lengths(cfg, lens, causal):
    lq, lk = lens
    bs = cfg.block_size
    lay = bsp.block_layout(cfg, lq, lk, causal)
    first, last = (lk - lq) // bs, (lk - 1) // bs
    assert lay.shape == (last - first + 1, math.ceil(lk / bs))
    torch.testing.assert_close(lay, bsp.block_layout(cfg, lk, lk, causal)[first:last + 1])
    if causal:  # no block above the (absolute) diagonal
        b = torch.arange(lay.shape[0])[:, None] + first
        assert not (lay & (torch.arange(lay.shape[1])[None, :] > b)).any()


@settings(max_examples=15)
@given(configs(), st.integers(1, 40), st.integers(1, 40))
def test_causal_rows_do_not_depend_on_the_sequence_length(cfg, l1, l2):
    """What decoding relies on: a block's keys are the same whether the sequence ends there or later."""
    short, long = sorted((l1, l2))
    n = math.ceil(short / cfg.block_size)
    assert torch.equal(bsp.block_layout(cfg, short)[:, :n], bsp.block_layout(cfg, long)[:n, :n])


def test_random_blocks_are_reproducible_and_depend_on_the_seed():
    cfg = bsp.BlockSparseConfig(block_size=4, local_blocks=1, global_blocks=0, random_blocks=3, seed=7)
    a = bsp.block_layout(cfg, 160)
    bsp._cached_query_layout.cache_clear()  # recompute, not a cache hit
    assert torch.equal(a, bsp.block_layout(cfg, 160))
    other = bsp.block_layout(bsp.BlockSparseConfig(block_size=4, local_blocks=1, global_blocks=0, random_blocks=3, seed=8), 160)
    assert not torch.equal(a, other)
    assert torch.equal(a & torch.eye(40, dtype=torch.bool), torch.eye(40, dtype=torch.bool))
    assert (a.sum(-1)[3:] == 4).all()  # diagonal + 3 random earlier blocks once 3 exist


@settings(max_examples=30)
@given(configs(max_block=6), lengths(max_len=30), st.booleans())
def test_element_mask_density_pairs_and_flops_count_the_visible_pairs(cfg, lens, causal):
    lq, lk = lens
    mask = definition_mask(cfg, lq, lk, causal)
    assert torch.equal(bsp.element_mask(cfg, lq, lk, causal), mask)
    assert mask.any(-1).all()  # every query sees a key
    m = module(cfg)
    assert m.pairs(lq, lk, causal) == int(mask.sum())
    assert m.density(lq, lk, causal) == pytest.approx(int(mask.sum()) / (lq * lk))
    assert m.flops(2, 3, lq, lk, 16, causal) == 4 * 2 * 3 * 16 * int(mask.sum())


# -- backends against the reference --------------------------------------------------------------


@given(configs(), lengths(), st.booleans(), st.integers(0, 99))
def test_gathered_matches_reference_forward_and_grads_fp32(cfg, lens, causal, seed):
    q, k, v = (t.requires_grad_() for t in make_qkv(*lens, seed=seed))
    ref = module(cfg, "reference")(q, k, v, causal=causal)
    m = module(cfg, "gathered")
    out = m(q, k, v, causal=causal)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    grad = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad), strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


@settings(max_examples=30, deadline=None)
@given(configs(), st.integers(1, 60), st.integers(0, 99), st.sampled_from([1, 2]), st.booleans())
def test_split_matches_reference_forward_and_grads_where_it_runs(cfg, L, seed, kv_heads, plain):
    """Causal bands with global blocks, square: the merged flash parts and their own backward; GQA keys."""
    if plain:
        cfg = dataclasses.replace(cfg, random_blocks=0, stride=0)
    q, k, v = make_qkv(L, L, seed=seed, H=2)
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    if cfg.random_blocks or cfg.stride or not cfg.local_blocks:
        with pytest.raises(UnsupportedBackend, match="causal bands"):
            module(cfg, "split")(q, k, v)
        return
    ref = module(cfg, "reference")(q, k, v)
    m = module(cfg, "split")
    out = m(q, k, v)
    assert m.last_backend == "split"
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    grad = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad), strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


@settings(max_examples=10)
@given(configs(), lengths(), st.booleans(), st.integers(0, 99))
def test_gathered_equals_the_float64_definition_and_bf16_is_no_worse_than_reference(cfg, lens, causal, seed):
    lq, lk = lens
    q, k, v = make_qkv(lq, lk, torch.float64, seed=seed)
    expected = float64_attention(q, k, v, definition_mask(cfg, lq, lk, causal))
    torch.testing.assert_close(gathered_attention(q, k, v, bsp.block_layout(cfg, lq, lk, causal), cfg.block_size,
                                                      causal), expected, **TOL[torch.float64])
    # bf16: the fast path's error against the float64 truth is within that of the bf16 reference.
    qb, kb, vb = (t.to(torch.bfloat16).requires_grad_() for t in (q, k, v))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (qb, kb, vb))
    truth = float64_attention(q64, k64, v64, definition_mask(cfg, lq, lk, causal))
    grad = torch.randn_like(truth)
    true_grads = torch.autograd.grad(truth, (q64, k64, v64), grad)
    errs = {}
    for backend in ("gathered", "reference"):
        out = module(cfg, backend)(qb, kb, vb, causal=causal)
        grads = torch.autograd.grad(out, (qb, kb, vb), grad.to(torch.bfloat16))
        pairs = zip((out, *grads), (truth, *true_grads), strict=True)
        errs[backend] = [float((a.detach().double() - b.detach()).abs().max()) for a, b in pairs]
    for fast, ref in zip(errs["gathered"], errs["reference"], strict=True):
        assert fast <= 2 * ref + 2e-2


@settings(max_examples=15)
@given(lengths(max_len=40), st.integers(1, 8), st.booleans(), st.integers(0, 99), st.booleans())
def test_every_block_active_equals_full(lens, bs, causal, seed, only_local):
    lq, lk = lens
    n = math.ceil(lk / bs)
    # Either a band covering the whole sequence alone, or every part at once.
    params = dict(local_blocks=n, global_blocks=0) if only_local else dict(local_blocks=1, global_blocks=n, random_blocks=2)
    cfg = bsp.BlockSparseConfig(block_size=bs, **params)
    lay, first = bsp.block_layout(cfg, lq, lk, causal), (lk - lq) // bs
    b, c = torch.arange(lay.shape[0])[:, None] + first, torch.arange(n)[None, :]
    assert torch.equal(lay, c <= b if causal else torch.ones_like(lay))
    q, k, v = make_qkv(lq, lk, seed=seed)
    expected = attn.build_attention("full", backend="reference")(q, k, v, causal=causal)
    for backend in ("reference", "gathered"):
        torch.testing.assert_close(module(cfg, backend)(q, k, v, causal=causal), expected, **TOL[torch.float32])
    assert module(cfg).pairs(lq, lk, causal) == attn.build_attention("full").pairs(lq, lk, causal)


def test_gathered_work_is_proportional_to_active_blocks():
    """Matmul FLOPs of `gathered` stay within 25% (bucket padding) of the active blocks' FLOPs, far below L^2."""
    cfg = bsp.BlockSparseConfig(block_size=16, local_blocks=2, global_blocks=1, random_blocks=1)
    L, B, H, D = 512, 1, 2, 16
    q, k, v = make_qkv(L, L, B=B, H=H, D=D)
    for causal in (True, False):
        active = int(bsp.block_layout(cfg, L, causal=causal).sum())
        with FlopCounterMode(display=False) as counter:
            gathered_attention(q, k, v, bsp.block_layout(cfg, L, causal=causal), 16, causal)
        block_flops = 4 * B * H * D * 16 * 16 * active
        assert block_flops <= counter.get_total_flops() <= 1.25 * block_flops
        assert block_flops < 4 * B * H * D * L * L / 4  # this layout is sparse at this length


def test_bidirectional_global_rows_do_not_make_every_row_dense():
    cfg = bsp.BlockSparseConfig(block_size=8, local_blocks=1, global_blocks=1)
    L = 512
    q, k, v = make_qkv(L, L, B=1, H=1, D=8)
    with FlopCounterMode(display=False) as counter:
        gathered_attention(q, k, v, bsp.block_layout(cfg, L, causal=False), 8, False)
    active = int(bsp.block_layout(cfg, L, causal=False).sum())  # one dense row, the rest 2 blocks
    assert counter.get_total_flops() <= 1.25 * 4 * 8 * 8 * 8 * active


# Flex: three fixed cases, two compiles (causal and bidirectional share a kernel at one shape).
# A length that is not a multiple of the block, with random + strided parts, at tile = block (64), long enough
# (>= FLEX_MIN_LEN queries) for auto to pick Flex;
# the same shape bidirectional with global rows; fewer queries than keys with a block (48) that is
# not a power of two (tile 128) at an offset that is not a multiple of it (a tile straddles rows).
FLEX_CASES = [
    (300, 300, True, dict(block_size=64, local_blocks=1, global_blocks=1, random_blocks=1, stride=2)),
    (300, 300, False, dict(block_size=64, local_blocks=1, global_blocks=1, random_blocks=1)),
    (37, 200, True, dict(block_size=48, local_blocks=2, global_blocks=1, random_blocks=1)),
]


@pytest.mark.skipif(flex.flex_unavailable() is not None, reason="needs FlexAttention")
@pytest.mark.parametrize("lq, lk, causal, params", FLEX_CASES)
def test_flex_matches_reference(lq, lk, causal, params):
    cfg = bsp.BlockSparseConfig(**params)
    q, k, v = make_qkv(lq, lk, B=1, D=16, seed=lq)
    ref = module(cfg, "reference")(q, k, v, causal=causal)
    if lq == lk:  # the module: auto runs Flex for a CPU forward without grad
        m = module(cfg)
        with torch.no_grad():
            out = m(q, k, v, causal=causal)
        assert m.last_backend == "flex"
    else:  # Lq < Lk is decode mode, where auto runs `gathered`; check the bottom-right BlockMask directly
        fb = bsp.flex_block_size(cfg.block_size, "cpu")
        out = flex.run_flex(q, k, v, bsp._flex_block_mask(cfg, lq, lk, causal, "cpu", fb))
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


@pytest.mark.parametrize("lq, lk, causal, params", [*FLEX_CASES, (1, 129, True, dict(block_size=64)),
                                                    (100, 333, False, dict(block_size=16, local_blocks=3, stride=5)),
                                                    (70, 333, True, dict(block_size=7, random_blocks=2, stride=4))])
@pytest.mark.parametrize("tile", ["cpu", "cuda-forward", "cuda-backward", 16])
def test_flex_block_mask_covers_every_visible_pair_and_full_blocks_need_no_mask(lq, lk, causal, params, tile):
    """At every tile a device would use: the CPU's (>= 64), a CUDA forward's (the layout block, down to
    16, so a tile can be narrower than a block) and a CUDA backward's (128); and a tile of 16 asked for."""
    cfg = bsp.BlockSparseConfig(**params)
    device, _, mode = str(tile).partition("-")
    fb = 16 if tile == 16 else bsp.flex_block_size(cfg.block_size, device, grad=mode == "backward")
    bm = bsp._flex_block_mask(cfg, lq, lk, causal, "cpu", fb)
    mask = definition_mask(cfg, lq, lk, causal)
    nq, nk = math.ceil(lq / fb), math.ceil(lk / fb)
    padded = torch.nn.functional.pad(mask, (0, nk * fb - lk, 0, nq * fb - lq)).view(nq, fb, nk, fb)
    dense = bm.to_dense()[0, 0].bool()  # partial | full
    full = torch.zeros(nq, nk, dtype=torch.bool)
    for r in range(nq if bm.full_kv_indices is not None else 0):
        full[r, bm.full_kv_indices[0, 0, r, : bm.full_kv_num_blocks[0, 0, r]].long()] = True
    assert not (padded.any(3).any(1) & ~dense).any()  # no visible pair in a skipped block
    assert not (full & ~padded.all(3).all(1)).any()  # full blocks skip the mask_mod: all pairs visible
    # The mask_mod is the element rule, and its lookups stay in bounds on padded tile positions
    # (eager indexing would raise), where it never lets a key past k_len through.
    i, j = torch.arange(nq * fb)[:, None], torch.arange(nk * fb)[None, :]
    on_tiles = bm.mask_mod(0, 0, i, j).expand(nq * fb, nk * fb)
    assert torch.equal(on_tiles[:lq, :lk], mask)
    assert not on_tiles[:, lk:].any()


def test_flex_tile_follows_the_layout_block_where_flex_allows_it():
    assert bsp.flex_block_size(64, "cuda") == 64 and bsp.flex_kernel_options(64, "cuda") == {"BLOCK_M": 64, "BLOCK_N": 64}
    assert bsp.flex_block_size(64, "cuda", grad=True) == 128  # Flex's sm90 backward tiles are 64 x 128
    assert bsp.flex_block_size(64, "cpu") == 64 and bsp.flex_kernel_options(64, "cpu") is None
    assert bsp.flex_block_size(32, "cpu") == 64 and bsp.flex_block_size(8, "cuda") == 16
    assert bsp.flex_block_size(48, "cuda") == 128  # not a power of two
    assert bsp.flex_block_size(64, "cuda", tile=128) == 128 and bsp.flex_kernel_options(128, "cuda") is None
    with pytest.raises(ValueError, match="flex_tile"):
        bsp.BlockSparseConfig(flex_tile=48)


def test_auto_picks_flex_for_cpu_forward_split_for_backward_and_gathered_for_decode():
    m = module(bsp.BlockSparseConfig())
    expected = "flex" if flex.flex_unavailable() is None else "gathered"
    assert m.select_backend("cpu", torch.float32, "forward") == expected
    assert m.select_backend("cpu", torch.float32, "backward") == "split"
    assert m.select_backend("cpu", torch.float32, "decode") == "gathered"
    q = torch.randn(1, 2, 40, 16, requires_grad=True)
    m(q[:, :, 8:], q, q)  # fewer queries than keys: split passes the call to gathered
    assert m.last_backend == "gathered"
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    with pytest.raises(UnsupportedBackend, match="backward"):
        module(bsp.BlockSparseConfig(), "flex")(q, q, q)


# -- backbone and decoding ----------------------------------------------------------------------


def test_backbone_runs_with_block_sparse_and_decoding_token_by_token_equals_forward():
    torch.manual_seed(0)
    params = dict(block_size=4, local_blocks=2, global_blocks=1, random_blocks=1, stride=3)
    config = attn.TransformerConfig.preset("tiny", attention="block_sparse", attention_params=params, backend="gathered",
                                           n_layers=1)
    model = attn.Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (2, 19))
    with torch.no_grad():
        logits = model(idx)
        ref = attn.Transformer(dataclasses.replace(config, backend="reference"))
        ref.load_state_dict(model.state_dict())
        torch.testing.assert_close(logits, ref(idx), atol=1e-5, rtol=1e-5)
        state = model.init_state(2, 19)
        steps = [model(idx[:, t:t + 1], state=state) for t in range(19)]
    torch.testing.assert_close(torch.cat(steps, dim=1), logits, atol=1e-5, rtol=1e-5)
    model.train().loss(idx[:, :-1], idx[:, 1:]).backward()  # trains through the gathered backward
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


# -- parameters ---------------------------------------------------------------------------------


@pytest.mark.parametrize("params, field", [
    (dict(block_size=0), "block_size"), (dict(local_blocks=-1), "local_blocks"), (dict(global_blocks=-2), "global_blocks"),
    (dict(random_blocks=-1), "random_blocks"), (dict(stride=-1), "stride"), (dict(seed=-1), "seed"),
    (dict(block_size="big"), "block_size"), (dict(window=4), "window"),
    (dict(local_blocks=0, global_blocks=0), "local_blocks"),
])
def test_bad_params_raise_value_error_naming_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        attn.build_attention("block_sparse", **params)


def test_listed_with_params_and_backends():
    spec = next(s for s in attn.list_attention() if s["name"] == "block_sparse")
    assert spec["params"] == dict(block_size=64, local_blocks=2, global_blocks=1, random_blocks=0, stride=0, seed=0,
                                 flex_tile=0)
    assert [b["name"] for b in spec["backends"]] == ["reference", "flex", "gathered", "split"]


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 8), st.integers(0, 3), st.integers(0, 3), st.lists(st.integers(1, 9), min_size=1, max_size=5),
       st.integers(0, 99))
def test_band_block_cache_decodes_like_the_forward_in_bounded_memory(bs, local, glob, chunks, seed):
    """Global + local layouts decode with a bounded cache (what the default layout uses): token by token and in
    chunks, with the harness's one-step rewinds, it equals one causal forward, and it never holds more than the
    global blocks, the local band and the new tokens."""
    if local == 0 and glob == 0:
        local = 1
    cfg = bsp.BlockSparseConfig(block_size=bs, local_blocks=local, global_blocks=glob)
    L = 70
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, L, 8, generator=g, dtype=torch.float64) for _ in range(3))
    expected = module(cfg, "reference")(q, k, v, causal=True)
    m = module(cfg)
    state = m.new_state(L)
    assert isinstance(state, bsp.BandBlockCache)
    outs, t, i = [], 0, 0
    while t < L:
        T = min(chunks[i % len(chunks)], L - t)
        args = (q[:, :, t:t + T], k[:, :, t:t + T], v[:, :, t:t + T], state)
        if T == 1 and i % 2:
            m.step(*args)
            state.truncate(t)  # the harness's rewind of a timed step
        outs.append(m.step(*args))
        t, i = t + T, i + 1
        assert state.k.shape[2] <= (glob + local + 1) * bs
    torch.testing.assert_close(torch.cat(outs, dim=2), expected, atol=1e-12, rtol=1e-12)
    assert isinstance(module(bsp.BlockSparseConfig(random_blocks=1)).new_state(), attn.attention.base.KVCache)


def test_auto_never_compiles_flex_for_a_short_forward():
    """Below FLEX_MIN_LEN queries `auto` runs `gathered` (as sliding_window runs `blocked`): no compile per length."""
    m = module(bsp.BlockSparseConfig(block_size=16))
    q, k, v = make_qkv(flex.FLEX_MIN_LEN - 1, flex.FLEX_MIN_LEN - 1, B=1, D=16, seed=0)
    with torch.no_grad():
        m(q, k, v, causal=True)
    assert m.last_backend == "gathered"
