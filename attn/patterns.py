"""Layer patterns: which attention variant each layer of the backbone runs (hybrid models).

A pattern is a repeating unit of variant specs separated by ``;``, each optionally repeated with ``*N``:
``"sliding_window:window=512*5; full"`` is Gemma 3's unit (5 local layers, 1 global). ``;`` and not ``,``
separates layers because ``,`` already separates a spec's parameters (the transformers layer spec,
attn/hf/layers.py, uses ``;`` too). A model of ``n_layers`` runs the unit's layer ``i % len(unit)`` at depth ``i``,
the unit repeated and cut at the end (transformers' ``layer_types`` for Gemma 3 cut the same way); the depth must
hold one whole unit. A named pattern (``PATTERNS``) stands for its unit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from attn.registry import ATTENTION, check, resolve_variant
from attn.specs import shorten

LAYERS = "layers"  # the variant name rows give a layer pattern (their variant_params say the pattern)

# Named units of the hybrids the field compares, each with where it comes from.
PATTERNS: dict[str, str] = {
    # Gemma 3 (Gemma Team 2025, arXiv 2503.19786, sec. 2.1): 5 local layers per global one; the 270M and 1B models'
    # local window is 512 tokens (config sliding_window=512, sliding_window_pattern=6), 1024 from 4B up.
    "gemma3": "sliding_window:window=512*5; full",
    # gpt-oss (OpenAI model card, 2025): layers alternate a 128-token banded window and dense attention, every
    # layer with a learned sink logit per head (s_aux).
    "gpt-oss": "sliding_window:window=128,sink_logit=true; full:sink_logit=true",
    # Qwen3-Next-80B-A3B (Qwen team, 2025): 3 Gated DeltaNet layers, then 1 (gated) full-attention layer.
    "qwen3-next": "gated_deltanet*3; full",
    # Samba (Ren et al. 2024, arXiv 2406.07522): a Mamba layer, then sliding-window attention of 2048 (each with its MLP).
    # The paper's Mamba is Mamba-1; its nearest here is mamba2 (a per-head scalar decay, not a per-channel one).
    "samba": "mamba2; sliding_window:window=2048",
    # Jamba (Lieber et al. 2024, arXiv 2403.19887): 1 attention layer per 8, at index 4 of each block (attn_layer_offset).
    "jamba": "mamba2*4; full; mamba2*3",
}

MAX_UNIT_LAYERS = 1024  # deeper than any model: a longer unit fits no depth (and ``*N`` would build N specs)
_REPEAT = re.compile(r"^(?P<spec>.*?)\s*\*\s*(?P<n>\d+)\s*$")


@dataclass(frozen=True)
class LayerPattern:
    """A parsed unit: the spec of each of its layers (as written, repeats expanded), and the name it was given by."""

    unit: tuple[str, ...]
    name: str | None = None

    @property
    def text(self) -> str:
        """The unit written back with runs folded (``gated_deltanet*3; full``): rows record it."""
        runs: list[list[Any]] = []
        for spec in self.unit:
            if runs and runs[-1][0] == spec:
                runs[-1][1] += 1
            else:
                runs.append([spec, 1])
        return "; ".join(s if n == 1 else f"{s}*{n}" for s, n in runs)

    @property
    def label(self) -> str:
        return self.name or self.text

    def layers(self, n_layers: int) -> list[str]:
        """The spec of each of ``n_layers`` layers; ValueError if the depth holds no whole unit."""
        check(n_layers >= len(self.unit), f"layer pattern {shorten(self.label)} is {len(self.unit)} layers a unit: "
                                          f"n_layers ({n_layers}) must be at least that")
        return [self.unit[i % len(self.unit)] for i in range(n_layers)]

    def full_fraction(self, n_layers: int | None = None) -> float:
        """The fraction of layers (of one unit, or of ``n_layers``) that run plain softmax attention over every key."""
        specs = self.layers(n_layers) if n_layers else list(self.unit)
        return sum(resolve_variant(s).name in ("full", "mla") for s in specs) / len(specs)


def parse_pattern(text: str | list[str] | tuple[str, ...]) -> LayerPattern:
    """A named pattern, ``"spec*N; spec"`` or a list of specs -> :class:`LayerPattern`, every spec validated by the
    registry; ValueError naming what is wrong (and the named patterns, for an unknown name)."""
    if isinstance(text, (list, tuple)):
        check(len(text) > 0 and all(isinstance(s, str) for s in text), "a layer list must be one or more variant specs")
        parts, name = list(text), None
    else:
        check(isinstance(text, str) and text.strip() != "", "empty layer pattern; expected SPEC[*N]; SPEC[*N]...")
        name = text.strip() if text.strip() in PATTERNS else None
        parts = (PATTERNS[name] if name else text).split(";")
    unit: list[str] = []
    for raw in parts:
        part = raw.strip()
        m = _REPEAT.match(part)
        spec, n = (m.group("spec").strip(), int(m.group("n"))) if m else (part, 1)
        check(spec != "", f"layer pattern {shorten(text)}: an empty layer (two ';' in a row?)")
        check(n >= 1, f"layer pattern {shorten(text)}: a repeat must be >= 1, got *{n}")
        check(len(unit) + n <= MAX_UNIT_LAYERS, f"layer pattern {shorten(text)}: a unit of at most "
                                                f"{MAX_UNIT_LAYERS} layers, got {shorten(str(n), quote=False)} more "
                                                f"after {len(unit)}")
        if ":" not in spec and spec not in ATTENTION.names():
            valid = ", ".join(PATTERNS)
            raise ValueError(f"unknown layer pattern or variant {shorten(spec)}; named patterns: {valid}; "
                             f"or write one as SPEC[*N]; SPEC[*N] (attn-bench list)")
        resolve_variant(spec)  # unknown variant, parameter or backend: the registry's own message
        unit += [spec] * n
    return LayerPattern(tuple(unit), name)


def list_patterns() -> list[dict[str, Any]]:
    """The named patterns: name, unit, layers a unit and the fraction of full-attention layers (``attn-bench list``)."""
    out = []
    for name in PATTERNS:
        p = parse_pattern(name)
        out.append({"name": name, "unit": p.text, "layers": len(p.unit), "full_fraction": p.full_fraction()})
    return out


__all__ = ["LAYERS", "PATTERNS", "LayerPattern", "list_patterns", "parse_pattern"]
