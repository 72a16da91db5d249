"""Bytes each built-in variant must move per harness mode (the bandwidth roofline's count), against hand counts, and
each decoding state's count against the bytes the state really holds after a step."""
import pytest
import torch

import attn
from attn.attention.token_inputs import draw_inputs
from harness.cost import Cell
from harness.cost.cells import attention_bytes

B, H, HKV, D, L = 2, 4, 2, 16, 1000
NEW = B * D * (2 * H + 2 * HKV)  # one token's q (H heads), k, v (H_kv heads) read and its output (H heads) written
KV = 2 * B * HKV * D  # a key and a value per key head: one cached token

# spec -> (token-input channels per key head and token, state elements a step at context L reads and writes,
#          elements it reads to choose keys); every count by hand from the variant's defaults, at L = 1000
HAND = {
    "full": (0, KV * (L + 1), 0),  # all L cached keys and values read, the new pair written
    "sliding_window:window=256": (0, KV * 256, 0),  # 255 cached keys in the window, the new one written
    "sliding_window:window=256,sinks=4": (0, KV * 260, 0),  # and the 4 first tokens
    "sliding_window:window=64,dilation=4": (0, KV * 64, 0),  # 64 keys, every 4th back: the ring holds 252
    # position 1000 is in block 15 (960..): local blocks 14-15 hold 896..1000 (105 keys), global block 0 64 keys
    "block_sparse": (0, KV * 169, 0),
    # MoBA (64, top-4): its own block's 41 keys and 3 chosen complete blocks; the 15 earlier blocks' mean keys
    "moba": (0, KV * (41 + 3 * 64), B * HKV * D * 15),
    # Quest (page 16, budget 256 = 16 pages): its own page's 9 keys (992..1000) and 15 chosen pages; min and max
    # keys of the 62 complete pages before its own
    "quest": (0, KV * (9 + 15 * 64 // 4), 2 * B * HKV * D * 62),
    # NSA: own selection block's 9 keys (992..) + 7 chosen blocks of 32, the window's 128 keys; compressed keys and
    # values of (1001 - 16) // 8 + 1 = 124 windows; gates: 3 per token
    "nsa": (3, KV * (9 + 7 * 32 + 128 - 1), 2 * B * HKV * D * 124),
    # DSA: its top 64 keys; the indexer keys of the 1000 cached tokens (16 each); index q 4 x 16, k 16, weights 4
    "dsa": (64 + 16 + 4, KV * 64, B * HKV * L * 16),
    "linear": (0, 2 * B * HKV * 16 * (D + 1), 0),  # [S | z] read and written back: d_phi = D for elu1
    "linear:feature_map=favor": (0, 2 * B * HKV * (64 * (D + 1) + 1), 0),  # 64 features and the running max logit
    "retention": (0, 2 * B * HKV * D * D, 0),
    "gla": (D, 2 * B * HKV * D * D, 0),  # gk: a decay per key channel
    "gated_deltanet": (2, 2 * B * HKV * D * D, 0),  # g and beta
    "mamba2": (1, 2 * B * HKV * D * D, 0),  # dt
}
RECURRENT = {"linear", "linear:feature_map=favor", "retention", "gla", "gated_deltanet", "mamba2"}


def build(spec):
    name, params = attn.parse_spec(spec)
    return attn.build_attention(name, **params)


@pytest.mark.parametrize("spec", sorted(HAND))
@pytest.mark.parametrize("itemsize", [4, 2])
def test_bytes_per_mode_match_a_hand_count(spec, itemsize):
    inputs, state, chosen = HAND[spec]
    m = build(spec)
    per_token = NEW + B * HKV * inputs
    state_size = max(itemsize, 4) if spec in RECURRENT else itemsize  # recurrent states are kept in fp32
    assert m.mode_bytes("forward", B, H, L, D, kv_heads=HKV, itemsize=itemsize) == itemsize * L * per_token
    assert m.mode_bytes("train", B, H, L, D, kv_heads=HKV, itemsize=itemsize) == 3 * itemsize * L * per_token
    want = itemsize * (per_token + chosen) + state_size * state
    assert m.mode_bytes("decode", B, H, L, D, kv_heads=HKV, itemsize=itemsize) == want


def test_a_recurrent_step_moves_the_same_bytes_at_every_context():
    m = build("gla")
    counts = {m.mode_bytes("decode", 1, 8, n, 64) for n in (1024, 65536, 1 << 20)}
    assert len(counts) == 1


def test_mla_reads_its_latent_cache():
    """4 x head dim of latent and head dim / 2 of shared RoPE key per token, one "head" for all."""
    m = build("mla")
    assert m.decode_state_elements(B, H, L, D, HKV) == B * (L + 1) * (4 * D + D // 2)


@pytest.mark.parametrize("spec", sorted(HAND))
@pytest.mark.parametrize("length", [37, 300])
def test_a_step_moves_no_more_state_than_it_holds(spec, length):
    """The counted state of a step at ``length``, against ``nbytes()`` of the real state after that step: a recurrence
    reads and writes all of it (2x), a cache that keeps only what it reads (full, a window, a band) exactly that, and
    one that keeps every key to choose among them (MoBA, Quest, NSA, DSA) no more than it holds. A window's ring is
    allocated whole before it fills, so it matches once the context passes the window."""
    m = build(spec)
    state = m.start_state(length + 1)
    extra = lambda n: draw_inputs(m.token_inputs, B, HKV, n, D)  # noqa: E731
    with torch.no_grad():
        for n in (length, 1):  # the prefill, then one decoding step
            m.run_step(torch.randn(B, H, n, D), torch.randn(B, HKV, n, D), torch.randn(B, HKV, n, D), state, **extra(n))
    counted = m.decode_state_elements(B, H, length, D, HKV) * m.state_itemsize(4)
    if spec in RECURRENT:
        assert counted == 2 * state.nbytes()
    elif spec in ("full", "block_sparse") or spec.startswith("sliding_window:window=256") and length > 256:
        assert counted == state.nbytes()
    else:
        assert 0 < counted <= state.nbytes()


def test_a_cell_counts_its_scope():
    """op: the variant's count in the cell's dtype; packed documents count each document's tokens once."""
    m = build("full")
    c = Cell(variant="full", variant_params={}, backend_requested="auto", position="none", position_params={},
             scope="op", mode="forward", device="cpu", dtype="bfloat16", batch_size=1, num_heads=8, head_dim=64,
             seq_len=1024, num_kv_heads=2)
    assert attention_bytes(m, c) == 2 * 1024 * 64 * (2 * 8 + 2 * 2)
    packed = Cell(**{**c.as_row(), "docs": 4})
    assert attention_bytes(m, packed) == attention_bytes(m, c)
    assert attention_bytes(object(), c) is None  # a plugin that does not count its bytes
