"""One prefill recorded, replayed for every press (:mod:`attn.hf.presses`' protocol, its module docstring): each
attention layer's input and RoPE kept beside the keys it wrote (:class:`Recorder`), then each press's own
``forward_hook`` called on a fresh cache as after that layer's forward (:func:`compress`); a press that hooks the model
its own way prefills the context itself (:func:`prefill_with`)."""
from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from attn.hf.presses import PressSpec, language_model


class Recorder:
    """Each attention layer's input (``hidden_states``) and RoPE (``position_embeddings``) over the context, kept
    beside the prefill's cache; :meth:`crop` cuts both back with the cache when a prompt reuses a prefix."""

    def __init__(self, model: Any):
        self.layers = [layer.self_attn for layer in language_model(model).layers]
        self.hidden: list[list[torch.Tensor]] = [[] for _ in self.layers]
        self.rope: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in self.layers]

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        def hook(i: int):
            def pre(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
                self.hidden[i].append(kwargs["hidden_states"].detach())
                self.rope[i].append(tuple(t.detach() for t in kwargs["position_embeddings"]))
            return pre

        handles = [m.register_forward_pre_hook(hook(i), with_kwargs=True) for i, m in enumerate(self.layers)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _join(self, i: int) -> None:
        """Layer ``i``'s recorded pieces (one per prefill call) as one tensor each."""
        if len(self.hidden[i]) > 1:
            self.hidden[i] = [torch.cat(self.hidden[i], dim=1)]
            self.rope[i] = [tuple(torch.cat(parts, dim=1) for parts in zip(*self.rope[i], strict=True))]

    def crop(self, keep: int) -> None:
        for i in range(len(self.layers)):
            if self.hidden[i]:
                self._join(i)
                cos, sin = self.rope[i][0]
                self.hidden[i], self.rope[i] = [self.hidden[i][0][:, :keep]], [(cos[:, :keep], sin[:, :keep])]

    def layer(self, i: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        self._join(i)
        return self.hidden[i][0], self.rope[i][0]


@torch.no_grad()
def compress(model: Any, spec: PressSpec, press: Any, keys: list[torch.Tensor], values: list[torch.Tensor],
             recorder: Recorder) -> Any:
    """A new cache holding the context as ``press`` leaves it: each layer's recorded keys written as the prefill wrote
    them, then the press's hook called as after that layer's forward (``press`` None: nothing pruned)."""
    cache = spec.new_cache(model.config)
    if press is not None:
        press.post_init_from_model(model)
        lm = language_model(model)
    from attn.hf.layers import window_layers

    windows = window_layers(model.config)
    for i, module in enumerate(recorder.layers):
        if i in windows:  # the model's window reads only these; kvpress leaves such layers to it
            w = windows[i] - 1
            cache.update(keys[i][..., -w:, :], values[i][..., -w:, :], i)
            continue
        cache.update(keys[i], values[i], i)
        if press is None:
            continue
        hidden, rope = recorder.layer(i)
        if hidden.shape[1] != keys[i].shape[-2]:
            raise RuntimeError(f"layer {i}: {hidden.shape[1]} recorded positions for {keys[i].shape[-2]} cached keys")
        rope_of(module, lm.rotary_emb, model.config)  # what BasePress.__call__ sets (presses that re-rotate keys read it)
        L = hidden.shape[1]
        kwargs = {"hidden_states": hidden, "position_embeddings": rope, "attention_mask": None, "past_key_values": cache,
                  "cache_position": torch.arange(L, device=hidden.device)}
        press.forward_hook(module, (), kwargs, (None, None))
    return cache


def rope_of(module: Any, rotary: Any, config: Any) -> None:
    """Give the layer its model's RoPE as kvpress calls it, ``rotary(x, position_ids)``: a model with one RoPE per layer
    type (Gemma 3) takes the layer's type too."""
    if "layer_type" not in inspect.signature(rotary.forward).parameters:
        module.rotary_emb = rotary
        return
    typed = functools.partial(rotary, layer_type=config.layer_types[module.layer_idx])
    module.__dict__["rotary_emb"] = typed  # a function, not a submodule: set past nn.Module's registration


@torch.no_grad()
def prefill_with(model: Any, spec: PressSpec, press: Any, context: torch.Tensor) -> Any:
    """A press's own prefill of the context, kvpress's way (``with press(model)``), for presses not replayable
    (:mod:`attn.hf.arms.kvpress`)."""
    from attn.hf.layers import window_layers

    if press is not None and window_layers(model.config):
        raise ValueError(f"press {spec.label} runs its own prefill, where kvpress would compress this model's sliding "
                         "layers too: on a model with sliding layers only replayable presses run")
    cache = spec.new_cache(model.config)
    with press(model) if press is not None else contextlib.nullcontext():
        language_model(model)(input_ids=context, past_key_values=cache)
    return cache


__all__ = ["Recorder", "compress", "prefill_with", "rope_of"]
