"""An accuracy job as plain data: :class:`Job` (what to run), :class:`Run` (one trained model), :class:`Plan`
(a validated job), and the helpers rows are identified with (:func:`short_hash`, :func:`resolved`).

Both the runner and the fidelity task use these; neither imports the other for them."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import attn
from attn.patterns import LAYERS
from harness.accuracy import build
from harness.accuracy.build import Spec
from harness.accuracy.common import Task
from harness.accuracy.train import TrainConfig


@dataclass
class Job:
    """Everything one ``attn-bench accuracy`` task run needs; presets are lists of these."""

    task: str
    variants: list[str] = field(default_factory=lambda: ["full"])
    positions: list[str] = field(default_factory=lambda: ["none"])
    seeds: list[int] = field(default_factory=lambda: [0])
    train_len: int = 128
    eval_lens: list[int] = field(default_factory=list)  # [] -> task default
    model: str = "tiny"  # attn.model.PRESETS name
    d_model: int | None = None  # the preset's width, overridden (MQAR's recall vs width); heads stay the preset's
    short_conv: int = 0  # taps of the backbone's short convolution (Zoology's conv + attention hybrid); 0 = none
    n_layers: int | None = None  # the preset's depth, overridden (a layer pattern's ratio needs the layers)
    patterns: list[str] = field(default_factory=list)  # layer patterns (attn/patterns.py), each one more variant
    init_std: float | None = None  # weight init; None -> d_model^-1/2 (see build.make_model)
    train: TrainConfig = field(default_factory=TrainConfig)
    task_params: dict[str, Any] = field(default_factory=dict)  # fields of the task's config dataclass
    base_task: str = "lm"  # the trained task of a task built on one (fidelity, lengthgen)
    finetune_steps: int = 0  # > 0: also fine-tune at finetune_len and evaluate again (stage "finetune")
    finetune_len: int = 0  # 0 -> 2 * train_len
    finetune_lr: float | None = None  # peak learning rate of the fine-tune; None -> train.lr
    fidelity_heads: int = 4  # random q, k, v for fidelity
    fidelity_head_dim: int = 32

    @property
    def finetune(self) -> TrainConfig:
        """The fine-tune's training config: the job's, with its own steps, warm-up and peak LR."""
        return dataclasses.replace(self.train, steps=self.finetune_steps, warmup=max(1, self.finetune_steps // 10),
                                   lr=self.finetune_lr or self.train.lr)



def short_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]



@dataclass
class Run:
    """One trained model: a (variant, position, seed) of a job, and how it is identified."""

    variant: Spec
    position: Spec  # the method being evaluated
    trained_as: Spec  # the position it is trained with (rope for the rope family at factor 1)
    seed: int
    train_id: str  # identity of the trained weights: names the checkpoint

    @property
    def run_id(self) -> str:
        return f"{self.variant.label}|{self.trained_as.label}|s{self.seed}|{self.train_id}"


@dataclass
class Plan:
    """A validated job: parsed specs, the task object, resolved lengths, the runs."""

    job: Job
    task: Task
    eval_lens: list[int]
    runs: list[Run]
    head_dim: int
    max_len: int
    variants: list[Spec]
    positions: list[Spec]

    @property
    def finetune_len(self) -> int:
        return self.job.finetune_len or 2 * self.job.train_len



def resolved(kind: str, spec: Spec, head_dim: int = 64) -> dict[str, Any]:
    """Every field of a spec's config (defaults included, shape fields left out), as rows carry them."""
    if kind == "attention" and spec.name == LAYERS:
        return dict(spec.params)  # the pattern's unit: each layer's spec says its own parameters
    registry = attn.registry.ATTENTION if kind == "attention" else attn.registry.POSITIONS
    fill = {"head_dim": head_dim} if kind == "position" and "head_dim" in build.position_fields(spec.name) else {}
    cfg = registry.make_config(spec.name, {**fill, **spec.params})
    skip = {"head_dim", "d_model", "max_seq_len"}
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in skip}



__all__ = ["Job", "Plan", "Run", "resolved", "short_hash"]
