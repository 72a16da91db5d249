"""Named accuracy runs: one dict of job lists, looked up exactly.

``quick`` checks the whole pipeline on a laptop CPU in minutes (tiny models, one seed);
``full`` is the committed reference run (three seeds, 16x length range), hours on a CPU; ``zoology`` is Zoology's
MQAR grid at its own sizes, for a GPU. The checkpoint presets (``smollm2-cpu``, ``frontier-qwen-cpu``...) evaluate a
pretrained checkpoint instead, no training: :mod:`harness.accuracy.checkpoint_presets`.
A task run without a preset runs its own ``default_job`` (harness/accuracy/tasks/), from the lists below.
Command-line options override every job of a preset. Jobs that train the same model (same
task, variant, training position, length, steps...) share one checkpoint: lengthgen's RoPE model
is fidelity's, and the whole RoPE family shares one RoPE-trained model per seed.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from harness.accuracy.jobs import Job
from harness.accuracy.train import TrainConfig

VARIANTS = ["full", "sliding_window:window=16", "block_sparse:block_size=16", "linear"]
# MQAR (Zoology's protocol) compares every family; the gated linear family needs its own projections to be trained
MQAR_VARIANTS = ["full", "sliding_window:window=16", "block_sparse:block_size=16", "linear", "retention", "gla",
                 "gated_deltanet"]
MQAR_CONV = 4  # Zoology's models are conv + attention hybrids (fla's layers: 4-tap short convolutions); measured
# here: without it a tiny full-attention model sits at the in-context baseline for hundreds of steps (0.50 after 300
# steps at 2 pairs), with it 1.00 (tests/test_accuracy_train.py)
ROPE_FAMILY = ["rope", "rope_linear", "rope_ntk", "rope_dynamic", "rope_yarn"]
POSITIONS = ["none", "sinusoidal", "learned", *ROPE_FAMILY, "rope_llama3", "alibi"]
# Length generalisation without a position method of their own: the decayed/gated recurrences (their decay is the
# position signal), trained on the same text next to full attention's position methods
RECURRENT_LENGTHGEN = ["retention", "gla"]
RULER_VARIANTS = ["full", "sliding_window:window=256"]
# RULER's tasks that fit in 1024 bytes: cwe's shortest form (10 words x 6 and RULER's question) takes ~1050
RULER_AT_1K = ("niah_single_1", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "niah_multivalue",
               "niah_multiquery", "vt", "fwe")


def _quick() -> list[Job]:
    """About 10 minutes on a quiet 2-core CPU. MQAR is kept short (train length 24) because
    attention's recall circuit forms late at longer lengths (~4000 steps at length 64)."""
    small_variants = ["full", "sliding_window:window=4", "block_sparse:block_size=8", "linear"]
    lm = TrainConfig(steps=800, batch_size=16, lr=3e-3)
    return [
        Job("mqar", variants=small_variants, positions=["rope"], train_len=64, eval_lens=[64], model="tiny", d_model=32,
            short_conv=MQAR_CONV, train=TrainConfig(steps=600, batch_size=32, lr=1e-2),
            task_params={"vocab_size": 512, "eval_examples": 128}),
        Job("passkey", variants=["full"], positions=ROPE_FAMILY, train_len=128, eval_lens=[128, 256, 512, 1024],
            model="tiny", train=TrainConfig(steps=600, batch_size=16, lr=3e-3),
            task_params={"depths": (0.0, 0.5, 1.0), "eval_examples": 32}),
        Job("lengthgen", base_task="lm", variants=["full"], positions=["none", *ROPE_FAMILY], train_len=128,
            eval_lens=[128, 256, 512, 1024, 2048], model="tiny", train=lm, task_params={"eval_bytes": 1 << 14},
            finetune_steps=60),
        Job("fidelity", base_task="lm", variants=VARIANTS, positions=["rope"], train_len=128, eval_lens=[128, 512, 2048],
            model="tiny", train=lm, task_params={"eval_bytes": 1 << 14}),
        Job("ruler", variants=["full", "sliding_window:window=128"], positions=["rope"], train_len=768,
            eval_lens=[768, 1536], model="tiny", short_conv=4, train=TrainConfig(steps=300, batch_size=8, lr=3e-3),
            task_params={"tasks": ("niah_single_1", "niah_multikey_2", "vt"), "eval_examples": 8}),
    ]


def _full() -> list[Job]:
    """The committed reference run: three seeds, 16x length range; hours on a 2-core CPU, best run as one process per
    task with ``--threads 1`` (see results/README.md: RULER's models took 40-70 min each there).

    The RoPE family shares one RoPE-trained model per seed (passkey, lengthgen, fidelity), so the
    extension methods differ only at evaluation (zero-shot) and in a short fine-tune at 2L."""
    seeds = [0, 1, 2]
    lm = TrainConfig(steps=2000, batch_size=16, lr=3e-3)
    return [
        *mqar_grid(seeds, lengths=(64, 128), widths=(32, 64), lrs=(1e-2,), vocab=512, steps=1000),
        Job("passkey", variants=["full"], positions=[*ROPE_FAMILY, "rope_llama3"], seeds=seeds, train_len=256,
            eval_lens=[256, 512, 1024, 2048, 4096], model="tiny", train=TrainConfig(steps=1500, batch_size=16, lr=3e-3),
            task_params={"eval_examples": 32}, finetune_steps=100),
        Job("lengthgen", base_task="lm", variants=["full"], positions=["none", *ROPE_FAMILY, "rope_llama3", "alibi"],
            seeds=seeds, train_len=256, eval_lens=[256, 512, 1024, 2048, 4096], model="tiny", train=lm, finetune_steps=150),
        Job("lengthgen", base_task="lm", variants=list(RECURRENT_LENGTHGEN), positions=["none"], seeds=seeds,
            train_len=256, eval_lens=[256, 512, 1024, 2048, 4096], model="tiny", train=lm, finetune_steps=150),
        Job("ruler", variants=list(RULER_VARIANTS), positions=["rope"], seeds=seeds[:2], train_len=1024,
            eval_lens=[1024, 2048, 4096], model="tiny", short_conv=MQAR_CONV,
            train=TrainConfig(steps=3000, batch_size=8, lr=3e-3), task_params={"tasks": RULER_AT_1K, "eval_examples": 24}),
        Job("fidelity", base_task="lm", variants=VARIANTS, positions=["rope"], seeds=seeds, train_len=256,
            eval_lens=[256, 1024, 4096], model="tiny", train=lm, task_params={"eval_bytes": 1 << 15}),
    ]


def mqar_grid(seeds: list[int], lengths: tuple[int, ...], widths: tuple[int, ...], lrs: tuple[float, ...], vocab: int,
              steps: int, batch_size: int = 32, variants: list[str] | None = None) -> list[Job]:
    """Zoology's MQAR grid: each length trained and evaluated at itself (pairs = length / 16), every width and
    learning rate a job of its own (the figures take the best rate per point)."""
    return [Job("mqar", variants=list(variants or MQAR_VARIANTS), positions=["rope"], seeds=seeds, train_len=L,
                eval_lens=[L], model="tiny", d_model=d, short_conv=MQAR_CONV,
                train=TrainConfig(steps=steps, batch_size=batch_size, lr=lr), task_params={"vocab_size": vocab})
            for L in lengths for d in widths for lr in lrs]


def _zoology() -> list[Job]:
    """Zoology's MQAR grid (Arora et al. 2023, fig. 2) for a GPU: vocabulary 8192, lengths 64..512 with length/16 pairs,
    widths 64..256, four learning rates 1e-3..3e-2 (best per point), three seeds; about 2000 steps of batch 64 each.
    Hours on a GPU, days on a CPU: the ``full`` preset holds the CPU-sized cut."""
    return mqar_grid([0, 1, 2], lengths=(64, 128, 256, 512), widths=(64, 128, 256), lrs=(1e-3, 3e-3, 1e-2, 3e-2),
                     vocab=8192, steps=2000, batch_size=64)


PRESETS = {"quick": _quick, "full": _full, "zoology": _zoology}


def get_preset(name: str) -> list[Job]:
    if name not in PRESETS:
        raise ValueError(f"unknown accuracy preset {name!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[name]()


def describe(name: str) -> list[dict[str, Any]]:
    return [dataclasses.asdict(j) for j in get_preset(name)]


__all__ = ["MQAR_CONV", "MQAR_VARIANTS", "POSITIONS", "PRESETS", "RECURRENT_LENGTHGEN", "ROPE_FAMILY", "RULER_VARIANTS",
           "VARIANTS", "describe", "get_preset"]
