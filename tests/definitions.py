"""Shared by the property tests of the variants: attention computed from its definition in float64, written apart
from the code under test, and a variant's decoding driven in chunks."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch


def float64_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      softcap: float = 0.0, bias: torch.Tensor | None = None,
                      sink: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(mask(cap(q k^T / sqrt(D)))) v in float64; k, v repeated to q's heads (GQA); rows with no key give 0.

    ``bias``: added to the (capped) scores, broadcastable to (B, H, Lq, Lk) (ALiBi). ``sink``: (H,) logits, one more
    column of each row's softmax whose value is zero: out = sum_j e^{s_ij} v_j / (e^{sink_h} + sum_j e^{s_ij})."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1).double(), v.repeat_interleave(g, 1).double()
    scores = q.double() @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.double()
    scores = scores.masked_fill(~mask, -math.inf)
    if sink is None:
        return torch.softmax(scores, -1).nan_to_num(0.0) @ v
    column = sink.double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1] @ v


def decode_in_chunks(m: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunks: Sequence[int],
                     on_step: Callable[[Any], None] | None = None,
                     inputs: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """``m.run_step`` on a fresh state, fed chunks of the given sizes and then the rest; the outputs concatenated.
    ``on_step(state)`` runs after each step (to watch the state's size); ``inputs``: token inputs, sliced alike."""
    inputs = inputs or {}
    L = q.shape[2]
    state, outs, t = m.new_state(L), [], 0
    with torch.no_grad():
        for n in [*chunks, L]:
            if t >= L:
                break
            outs.append(m.run_step(q[:, :, t:t + n], k[:, :, t:t + n], v[:, :, t:t + n], state,
                                   **{name: x[:, :, t:t + n] for name, x in inputs.items()}))
            t += n
            if on_step is not None:
                on_step(state)
    return torch.cat(outs, 2)


def fla_naive(relative: str) -> Any:
    """fla's naive reference ``fla/<relative>``, loaded from the installed package's file by path (its package
    ``__init__`` needs Triton; nothing of fla is copied here). pytest.skip says why when there is none, or when the
    file needs a module that is not installed (its naive.py files import einops)."""
    import importlib.util
    from pathlib import Path

    import pytest

    spec = importlib.util.find_spec("fla")
    if spec is None or spec.origin is None:
        pytest.skip("fla (flash-linear-attention / fla-core) is not installed (pip install 'attn-bench[gpu]')")
    path = Path(spec.origin).parent / relative
    if not path.exists():
        pytest.skip(f"this fla has no {relative}")
    file_spec = importlib.util.spec_from_file_location(f"fla_naive_{path.parent.name}", path)
    module = importlib.util.module_from_spec(file_spec)
    try:
        file_spec.loader.exec_module(module)
    except ModuleNotFoundError as e:
        pytest.skip(f"fla's {relative} imports {e.name}, which is not installed")
    return module


def prefill_then_steps(model: Any, length: int = 17, prefill: int = 6) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(logits decoded as a ``prefill``-token prompt then one token at a time, logits of one forward over the same
    ``length`` seeded tokens, the decoding state after the last step) of an eval-mode backbone."""
    idx = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        state = model.init_state(2, max_len=length)
        outs = [model(idx[:, :prefill], state=state)] + [model(idx[:, t:t + 1], state=state)
                                                          for t in range(prefill, length)]
    return torch.cat(outs, 1), full, state


def backbone_steps_and_forward(attention: str, params: dict[str, Any]) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A seeded ``tiny`` backbone with ``attention``: (model, logits decoded as a 6-token prefill then one token at a
    time, logits of one forward over the same 17 tokens)."""
    import attn

    torch.manual_seed(0)
    model = attn.Transformer(attn.TransformerConfig.preset("tiny", attention=attention, attention_params=params)).eval()
    steps, full, _ = prefill_then_steps(model)
    return model, steps, full
