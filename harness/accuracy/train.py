"""The training loop for the accuracy tasks: AdamW, warm-up then cosine decay, gradient clipping.

Everything a step depends on is a function of (seed, step): the batch comes from
``batch_fn(step)`` and the learning rate from ``lr_at(step)``, so a run resumed from a
checkpoint continues exactly as an uninterrupted one would. Checkpoints hold only tensors,
numbers and strings (``torch.save`` of state dicts, loaded with ``weights_only=True``), written
to a temporary file and renamed, so a kill mid-write never leaves a corrupt one.
"""
from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from harness.accuracy.common import IGNORE

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), each (B, L) int64


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup: int = -1  # -1 -> 10 % of steps, at most 200
    weight_decay: float = 0.1  # on matrices only (not norms or biases), as in nanoGPT
    beta2: float = 0.95
    grad_clip: float = 1.0
    ckpt_every: int = 100

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"learning rate must be > 0, got {self.lr}")

    @property
    def warmup_steps(self) -> int:
        return min(200, self.steps // 10) if self.warmup < 0 else self.warmup


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``lr * min_lr_ratio`` at the last step."""
    w = cfg.warmup_steps
    if step < w:
        return cfg.lr * (step + 1) / w
    progress = (step - w) / max(1, cfg.steps - w)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())  # tied weights once
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2))


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)  # one per step, from step 0
    resumed_from: int = 0  # step the run continued from (0 = fresh)
    seconds: float = 0.0  # wall time of the steps run in this call

    @property
    def final_loss(self) -> float:
        tail = self.losses[-max(1, len(self.losses) // 20):]
        return sum(tail) / len(tail) if tail else math.nan


def loss_on(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)


def save_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int, losses: list[float],
                    identity: str) -> None:
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "step": step,
        "losses": torch.tensor(losses, dtype=torch.float64),
        "rng": torch.get_rng_state(),
        "identity": identity,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    torch.save(state, tmp)
    os.replace(tmp, path)


CHECKPOINT_KEYS = ("model", "optimizer", "step", "losses", "rng", "identity")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _move_aside(path: Path, reason: str, warn: Callable[[str], None]) -> None:
    """Rename an unreadable checkpoint to ``<name>.corrupt-<time>`` and say so, once: kept for a post-mortem,
    out of the way so this run (and every rerun) trains from scratch instead of failing on it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside, n = path.with_name(f"{path.name}.corrupt-{stamp}-{n}"), n + 1
    try:
        os.replace(path, aside)
        where = f"moved it to {aside.name}"
    except OSError as e:
        where = f"could not move it aside ({e.strerror}); it will be overwritten"
    warn(f"attn-bench: warning: checkpoint {path} is unreadable ({reason}); {where} and training from scratch")


def load_checkpoint(path: Path, identity: str, warn: Callable[[str], None] | None = None) -> dict | None:
    """The saved state if ``path`` holds a checkpoint of this exact run, else None.

    A checkpoint that does not load (truncated, garbage, not ours) is moved aside with one line to
    ``warn`` (stderr by default) and None returned, so the run retrains rather than erroring on every
    rerun; one of another run is refused (ValueError), since it is a mistake in ``--ckpt-dir``.
    """
    if not path.exists():
        return None
    if path.is_dir():
        raise ValueError(f"checkpoint {path} is a directory; remove it or use another --ckpt-dir")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise  # the file may be fine: never discard hours of training for a transient failure
    except Exception as e:  # truncated zip, pickle garbage, empty file, unreadable ...
        from harness.messages import looks_like_oom

        if isinstance(e, torch.OutOfMemoryError) or looks_like_oom(str(e)):
            raise  # torch's allocation failures are RuntimeErrors: under the memory cap, not corruption
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
        _move_aside(path, f"{type(e).__name__}: {first[:160]}" if first else type(e).__name__, warn or _stderr)
        return None
    if isinstance(state, dict) and state.get("identity") != identity:
        raise ValueError(f"checkpoint {path} belongs to another run; delete it or use another --ckpt-dir")
    if not isinstance(state, dict) or not all(k in state for k in CHECKPOINT_KEYS):
        _move_aside(path, "not a training checkpoint", warn or _stderr)
        return None
    return state


def aux_losses(model: nn.Module) -> torch.Tensor | None:
    """The sum of the ``aux_loss`` the model's modules left in their last forward (DSA's indexer KL), or None when none
    did; each is reset to None, so a loss is added once."""
    parts = []
    for m in model.modules():
        if getattr(m, "aux_loss", None) is not None:
            parts.append(m.aux_loss)
            m.aux_loss = None
    return sum(parts) if parts else None


def train(model: nn.Module, batch_fn: Callable[[int], Batch], cfg: TrainConfig, ckpt: Path | None = None,
          identity: str = "", desc: str = "train", progress: bool = True, stop_after: int | None = None) -> TrainResult:
    """Train ``model`` in place for ``cfg.steps`` steps, resuming from ``ckpt`` if it exists.

    ``stop_after`` ends the call early after that many total steps (simulates an interruption in tests).
    """
    opt = make_optimizer(model, cfg)
    result = TrainResult()
    start = 0
    state = load_checkpoint(ckpt, identity) if ckpt is not None else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start = result.resumed_from = int(state["step"])
        result.losses = state["losses"].tolist()
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    if start >= end:
        return result
    model.train()
    t0 = time.perf_counter()
    bar = tqdm(range(start, end), desc=desc, initial=start, total=cfg.steps, disable=not progress, leave=False,
               dynamic_ncols=True)
    for step in bar:
        lr = lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        inputs, targets = batch_fn(step)
        loss = loss_on(model, inputs, targets)
        extra = aux_losses(model)  # trained with the task loss; the recorded loss is the task's alone
        opt.zero_grad(set_to_none=True)
        (loss if extra is None else loss + extra).backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        result.losses.append(loss.item())
        if step % 10 == 0 or step == end - 1:
            bar.set_postfix(loss=f"{result.losses[-1]:.4f}", lr=f"{lr:.2e}")
        done = step + 1
        if ckpt is not None and (done % cfg.ckpt_every == 0 or done == end):
            save_checkpoint(ckpt, model, opt, done, result.losses, identity)
    bar.close()
    model.eval()
    result.seconds = time.perf_counter() - t0
    return result


def config_dict(cfg: TrainConfig) -> dict:
    return asdict(cfg)


__all__ = ["Batch", "TrainConfig", "TrainResult", "aux_losses", "config_dict", "load_checkpoint", "loss_on", "lr_at",
           "make_optimizer", "save_checkpoint", "train"]
