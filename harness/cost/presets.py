"""Named sweeps, looked up exactly. Each is written in the sweep-file format (``attn-bench sweep
--config``): top-level settings, and optional ``grid`` entries that each override a few of them,
so a preset can add a small train/decode subset to a large forward sweep."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The four built-in variants with the parameters the committed figures use (results/README.md).
BUILTIN_VARIANTS = [
    "full",
    "sliding_window:window=256",
    "block_sparse:block_size=64,local_blocks=2,global_blocks=1",
    "linear",
]


# The order chains run in (expand keeps it): the project's own CUDA paths first -- SDPA, chunked torch,
# then the compiled Flex paths (a compile per length) -- then the carried wheels' backends, whose working
# or not the equivalence stage has already shown; a sweep cut at its cap loses these last.
GPU_VARIANTS = [
    "full",
    "linear",
    "sliding_window:window=256",
    "block_sparse:block_size=64,local_blocks=2,global_blocks=1",
    "full:backend=xformers",
    "sliding_window:window=256,backend=xformers",
    "linear:backend=fla",
]


@dataclass(frozen=True)
class Preset:
    about: str
    settings: dict[str, Any]


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        "a first look on a laptop CPU, under 5 minutes on 2 cores",
        {
            "device": "cpu", "dtype": "float32", "scope": "op", "batch": 1, "heads": 8, "head_dim": 64,
            "variant": BUILTIN_VARIANTS, "lengths": "512..8K", "time_limit": 120,
            "min_run_time": 0.1, "max_run_time": 1.0,
            "grid": [
                {"mode": "forward"},
                {"mode": ["train", "decode"], "lengths": [512, 2048]},
            ],
        },
    ),
    "long": Preset(
        "how far each variant goes on this CPU: forward, doubling lengths to 1M (full attention to 128K)",
        {
            "device": "cpu", "dtype": "float32", "scope": "op", "mode": "forward", "batch": 1, "heads": 8,
            "head_dim": 64, "variant": BUILTIN_VARIANTS, "lengths": "1K..1M", "time_limit": 900,
            "min_run_time": 0.5, "max_run_time": 5.0,
            # full attention at 256K would take ~25 min a call on 2 cores: its curve stops at 128K
            "grid": [{"variant": BUILTIN_VARIANTS[:1], "lengths": "1K..128K"}, {"variant": BUILTIN_VARIANTS[1:]}],
        },
    ),
    "decode": Preset(
        "one decoding step against a cache or state of 1K..64K tokens: latency and the memory of what is kept",
        {
            "device": "cpu", "dtype": "float32", "scope": "op", "mode": "decode", "batch": 1, "heads": 8,
            "head_dim": 64, "variant": BUILTIN_VARIANTS, "lengths": "1K..64K", "time_limit": 600,
            "min_run_time": 0.5, "max_run_time": 3.0,
        },
    ),
    "gpu": Preset(
        "one CUDA GPU in bf16, sized for scripts/gpu_check.sh's ~3-minute sweep stage: forward at 4K/16K/128K, "
        "train at 16K, every variant and fast backend (the most valuable rows first)",
        {
            "device": "cuda", "dtype": "bfloat16", "scope": "op", "batch": 1, "heads": 16, "head_dim": 64,
            # per cell, warm-up included: a cold Flex forward+backward compile or fla's first (trimmed) autotune
            "time_limit": 150, "min_run_time": 0.2, "max_run_time": 1.0,
            "variant": GPU_VARIANTS,
            # Grid order = chain order: every forward curve, then train, then the tile comparison, so a cut
            # stage loses the least valuable rows.
            "grid": [
                {"mode": "forward", "lengths": "4K,16K,128K"},
                {"mode": "train", "lengths": "16K"},
                # block_sparse's Flex tile at Flex's default 128 instead of the layout's 64: what the tile costs
                {"mode": "forward", "lengths": "16K,128K",
                 "variant": ["block_sparse:block_size=64,local_blocks=2,global_blocks=1,flex_tile=128"]},
            ],
        },
    ),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[name]


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def describe_presets() -> dict[str, str]:
    """Preset name -> one line: what it is for, then its grid (for ``attn-bench list``)."""
    out = {}
    for name, p in PRESETS.items():
        s = p.settings
        grids = s.get("grid") or [{}]
        modes = []
        for g in grids:
            lengths = g.get("lengths", s.get("lengths"))
            if isinstance(lengths, str):
                span = lengths
            else:
                span = ",".join(map(str, lengths)) if len(lengths) <= 4 else f"{min(lengths)}..{max(lengths)}"
            modes.append(f"{'/'.join(map(str, _as_list(g.get('mode', s.get('mode')))))} at {span}")
        out[name] = (f"{p.about} [{s['device']}, {s['dtype']}, {len(s['variant'])} variants, "
                     f"{'; '.join(modes)}; {s['time_limit']} s per cell]")
    return out


__all__ = ["BUILTIN_VARIANTS", "GPU_VARIANTS", "PRESETS", "Preset", "describe_presets", "get_preset"]
