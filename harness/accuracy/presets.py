"""Named accuracy runs: one dict of job lists, looked up exactly.

``quick`` checks the whole pipeline on a laptop CPU in minutes (tiny models, one seed);
``full`` is the committed reference run (three seeds, 16x length range), hours on a CPU.
Command-line options override every job of a preset. Jobs that train the same model (same
task, variant, training position, length, steps...) share one checkpoint: lengthgen's RoPE model
is fidelity's, and the whole RoPE family shares one RoPE-trained model per seed.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from harness.accuracy.runner import Job
from harness.accuracy.train import TrainConfig

VARIANTS = ["full", "sliding_window:window=16", "block_sparse:block_size=16", "linear"]
ROPE_FAMILY = ["rope", "rope_linear", "rope_ntk", "rope_dynamic", "rope_yarn"]
POSITIONS = ["none", "sinusoidal", "learned", *ROPE_FAMILY, "rope_llama3"]


def _quick() -> list[Job]:
    """About 10 minutes on a quiet 2-core CPU. MQAR is kept short (train length 24) because
    attention's recall circuit forms late at longer lengths (~4000 steps at length 64)."""
    small_variants = ["full", "sliding_window:window=4", "block_sparse:block_size=8", "linear"]
    lm = TrainConfig(steps=800, batch_size=16, lr=3e-3)
    return [
        Job("mqar", variants=small_variants, positions=["rope"], train_len=24, eval_lens=[24, 48, 96], model="tiny",
            train=TrainConfig(steps=2000, batch_size=32, lr=3e-3),
            task_params={"num_pairs": 4, "num_keys": 8, "eval_examples": 128}),
        Job("passkey", variants=["full"], positions=ROPE_FAMILY, train_len=128, eval_lens=[128, 256, 512, 1024],
            model="tiny", train=TrainConfig(steps=600, batch_size=16, lr=3e-3),
            task_params={"depths": (0.0, 0.5, 1.0), "eval_examples": 32}),
        Job("lengthgen", base_task="lm", variants=["full"], positions=["none", *ROPE_FAMILY], train_len=128,
            eval_lens=[128, 256, 512, 1024, 2048], model="tiny", train=lm, task_params={"eval_bytes": 1 << 14},
            finetune_steps=60),
        Job("fidelity", base_task="lm", variants=VARIANTS, positions=["rope"], train_len=128, eval_lens=[128, 512, 2048],
            model="tiny", train=lm, task_params={"eval_bytes": 1 << 14}),
    ]


def _full() -> list[Job]:
    """The committed reference run: three seeds, 16x length range. About 1.5 hours on a 2-core CPU
    run as two processes (``--task mqar`` and the rest, ``--threads 1`` each; see results/README.md).

    The RoPE family shares one RoPE-trained model per seed (passkey, lengthgen, fidelity), so the
    extension methods differ only at evaluation (zero-shot) and in a short fine-tune at 2L."""
    seeds = [0, 1, 2]
    lm = TrainConfig(steps=2000, batch_size=16, lr=3e-3)
    mqar_variants = ["full", "sliding_window:window=8", "block_sparse:block_size=8", "linear"]
    return [
        # 8 keys: with 16, full attention's recall circuit formed only after ~2500 steps and in 1 of 3 seeds by 4000
        Job("mqar", variants=mqar_variants, positions=["rope"], seeds=seeds, train_len=32,
            eval_lens=[32, 64, 128, 256, 512], model="tiny", train=TrainConfig(steps=5000, batch_size=32, lr=3e-3),
            task_params={"num_pairs": 4, "num_keys": 8}),
        Job("passkey", variants=["full"], positions=[*ROPE_FAMILY, "rope_llama3"], seeds=seeds, train_len=256,
            eval_lens=[256, 512, 1024, 2048, 4096], model="tiny", train=TrainConfig(steps=1500, batch_size=16, lr=3e-3),
            task_params={"eval_examples": 32}, finetune_steps=100),
        Job("lengthgen", base_task="lm", variants=["full"], positions=["none", *ROPE_FAMILY, "rope_llama3"], seeds=seeds,
            train_len=256, eval_lens=[256, 512, 1024, 2048, 4096], model="tiny", train=lm,
            task_params={"eval_bytes": 1 << 15}, finetune_steps=150),
        Job("fidelity", base_task="lm", variants=VARIANTS, positions=["rope"], seeds=seeds, train_len=256,
            eval_lens=[256, 1024, 4096], model="tiny", train=lm, task_params={"eval_bytes": 1 << 15}),
    ]


PRESETS = {"quick": _quick, "full": _full}


def default_job(task: str) -> Job:
    """A task run without a preset: the built-in variants or position methods the task is about."""
    if task in ("mqar", "fidelity"):
        return Job(task, variants=list(VARIANTS), positions=["rope"])
    if task == "passkey":
        return Job(task, variants=["full"], positions=list(ROPE_FAMILY))
    return Job(task, variants=["full"], positions=list(POSITIONS))  # lm, lengthgen


def get_preset(name: str) -> list[Job]:
    if name not in PRESETS:
        raise ValueError(f"unknown accuracy preset {name!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[name]()


def describe(name: str) -> list[dict[str, Any]]:
    return [dataclasses.asdict(j) for j in get_preset(name)]


__all__ = ["POSITIONS", "PRESETS", "ROPE_FAMILY", "VARIANTS", "default_job", "describe", "get_preset"]
