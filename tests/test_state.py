"""The decoding-state contract (attn/attention/state.py): every built-in state follows it, the one-step undo is
shared, and a state without the contract is refused where it is made."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import attn
from attn.attention.state import DecodingState, KVCache, OneStepUndo, checked
from attn.attention.token_inputs import draw_inputs, sliced
from attn.registry import ATTENTION


@pytest.mark.parametrize("name", sorted(e["name"] for e in attn.list_attention()))
def test_every_builtin_state_follows_the_contract(name):
    m = attn.build_attention(name)
    if not m.supports_decode:
        pytest.skip(f"{name} does not decode")
    state = m.start_state(16)
    assert isinstance(state, DecodingState)
    q = k = v = torch.randn(1, 2, 5, 8)
    inputs = draw_inputs(m.token_inputs, 1, 2, 6, 8)
    with torch.no_grad():
        m.run_step(q, k, v, state, **sliced(inputs, 0, 5))
        before = state.nbytes()
        m.run_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], state, **sliced(inputs, 5, 6))
    assert state.length == 6
    state.truncate(5)  # the harness's rewind: one step back always works
    assert state.length == 5 and state.nbytes() <= max(before, state.nbytes())


@dataclass
class Counter(OneStepUndo):
    UNDO_FIELDS = ("total",)
    KIND = "counter"
    total: int = 0

    def add(self, x: int) -> None:
        self.remember()
        self.total, self.length = self.total + x, self.length + 1

    def nbytes(self) -> int:
        return 8


def test_one_step_undo_goes_back_one_step_only():
    c = Counter()
    c.add(3)
    c.add(4)
    c.truncate(9)  # at or past its length: nothing to forget
    assert (c.total, c.length) == (7, 2)
    c.truncate(1)
    assert (c.total, c.length) == (3, 1)
    with pytest.raises(ValueError, match="a counter cannot forget tokens: at 1, it can rewind nothing, not to 0"):
        c.truncate(0)
    c.add(1)
    c.add(1)
    with pytest.raises(ValueError, match="at 3, it can rewind only to 2, not to 1"):
        c.truncate(1)
    assert (c.total, c.length) == (5, 3)  # a refused rewind changes nothing


class NoRewind:
    length = 0

    def nbytes(self) -> int:
        return 0


def test_a_state_without_the_contract_is_refused_where_it_is_made():
    assert checked(Counter(), "X") is not None
    with pytest.raises(TypeError, match=r"Y.new_state returned a NoRewind without truncate: a decoding state needs"):
        checked(NoRewind(), "Y")
    with pytest.raises(TypeError, match="without length, truncate, nbytes"):
        checked(object(), "Z")

    full = ATTENTION.get("full").cls

    class Bad(full):
        def new_state(self, max_len: int = 0):
            return NoRewind()

    m = Bad(ATTENTION.make_config("full", {}))
    with pytest.raises(TypeError, match="Bad.new_state returned a NoRewind without truncate"):
        m.start_state()
    model = attn.Transformer(attn.TransformerConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2))
    model.blocks[0].attn.attn = m  # the layer's attention module
    with pytest.raises(TypeError, match="without truncate"):
        model.init_state()


def test_a_kv_cache_allocates_its_hint_and_doubles_only_past_it():
    """A prefill of L tokens into a cache hinted for L + 1 allocates L + 1 slots, not 2L (a repeated state for a
    memory budget copied the unused half); past the hint it grows by doubling."""
    cache = KVCache(capacity_hint=11)
    k = torch.randn(2, 3, 10, 4)
    cache.append(k, k)
    assert cache.k.shape[2] == 11
    cache.append(k[:, :, :1], k[:, :, :1])
    assert cache.k.shape[2] == 11 and cache.length == 11
    keys, _ = cache.append(k[:, :, :2], k[:, :, :2])
    assert cache.k.shape[2] == 26 and torch.equal(keys[:, :, :10], k)
