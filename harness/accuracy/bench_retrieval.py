"""What retrieval costs in time against a compressed prefill: seconds per prompt of each arm, answering alone.

``python -m harness.accuracy.bench_retrieval --out results/retrieval-time-cpu.jsonl`` times, on SmolLM2-135M's
passkey prompts (8K, the key at depth 0.5), each arm of :data:`ARMS` answering one prompt from nothing: ``none`` (the
whole context prefilled, the question and answer decoded against every key), a press at 1/8 (SnapKV: the whole
context prefilled and recorded, then compressed, then the question and answer decoded against an eighth of it), and
retrieval at 1/8 with each retriever (:mod:`attn.hf.retrieval`: chunks scored against the question, the kept eighth
prefilled alone, the question and answer decoded after it). Each prompt gets a fresh
:class:`harness.accuracy.prefill.SharedPrefill`, so no prompt reuses another's prefix -- the accuracy runs do, and their
times are not these. One row per arm: the median seconds per prompt, for retrieval its parts (retrieving, prefilling
what it kept), and its ratio to the press's in the same run. Every arm answers one short prompt before the timed ones
(MiniLM's load, kvpress's first call). A timed run: nothing else may share the machine.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import click

BUDGET = "compression_ratio=0.875"
PRESS = f"snapkv:{BUDGET}"
ARMS = ("none", PRESS, *(f"retrieval:retriever={r},{BUDGET}" for r in ("bm25", "dense", "keys")))


def prompts(tokens: Any, length: int, n: int) -> list[tuple[list[int], int]]:
    """``n`` passkey prompts of ``length`` tokens (keys at depth 0.5) and where each question starts."""
    import numpy as np

    from harness.accuracy.tasks.passkey import ANSWER_PREFIX, ASK, draw_key, haystack_ids, passkey_prompt

    rng = np.random.default_rng(length)
    keys = [draw_key(rng, 5, "test") for _ in range(n)]
    hay = haystack_ids(tokens, length, rng)  # one haystack for every prompt: a reused prefix would show in the times
    out = [passkey_prompt(tokens, length, 0.5, key, hay) for key in keys]
    asked = len(tokens.ask(ASK, ANSWER_PREFIX))
    return [(p, len(p) - asked) for p in out]


def time_arm(model: Any, tokens: Any, arm: str, items: list[tuple[list[int], int]]) -> dict[str, Any]:
    """Seconds of each prompt's answer under ``arm`` alone, and the arm's own statistics (medians over prompts)."""
    from transformers import GenerationConfig

    from harness.accuracy.prefill import SharedPrefill
    from harness.presses import parse_presses

    spec = parse_presses([arm])[0]
    gen = GenerationConfig(max_new_tokens=7, min_new_tokens=7, do_sample=False, pad_token_id=tokens.boundary)
    seconds, stats = [], []
    for prompt, at in items:
        arms = SharedPrefill([spec], decode=tokens.decode)
        t0 = time.perf_counter()
        arms.answers(model, prompt, at, gen)
        seconds.append(time.perf_counter() - t0)
        if spec.label in arms.failed:
            raise arms.failed[spec.label]
        stats.append(arms.take_stats(spec.label))
    parts = {k: statistics.median(s[k] for s in stats) for k in ("retrieval_seconds", "prefill_seconds",
                                                                 "kv_tokens_mean", "context_tokens") if k in stats[0]}
    return {"press_spec": spec.label, **spec.columns(False), "value": statistics.median(seconds),
            "seconds": seconds, **parts}


@click.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--model", "name", default="smollm2-135m", show_default=True)
@click.option("--length", default=8192, show_default=True)
@click.option("--prompts", "n", default=3, show_default=True, help="Timed prompts per arm.")
def main(out: Path, name: str, length: int, n: int) -> None:
    """Each arm of ARMS timed alone on the same prompts, one row each appended to OUT."""
    import torch

    from attn.hf.models import load_model
    from harness.accuracy.checkpoint import load_checkpoint
    from harness.environment import environment
    from harness.results import ResultsStore

    ckpt = load_checkpoint(name)
    model = load_model(ckpt.path, "full", config=ckpt.config).eval()
    store = ResultsStore(out, ("press_spec",))
    warm, items = prompts(ckpt.tokens, 2048, 1), prompts(ckpt.tokens, length, n)
    rows = []
    with torch.no_grad():
        for arm in ARMS:
            time_arm(model, ckpt.tokens, arm, warm)  # untimed: first calls (MiniLM's load, kvpress's hooks)
            rows.append(time_arm(model, ckpt.tokens, arm, items))
    press = next(r["value"] for r in rows if r["press_spec"] == PRESS)
    for r in rows:
        store.append({"task": "retrieval_time", "metric": "seconds_per_prompt", "status": "ok", **r,
                      "ratio_to_press": r["value"] / press, "prompts": n, "eval_len": length, "model": name,
                      "variant": "full", "variant_spec": "full", "dtype": "float32", **environment()})
        click.echo(f"{r['press_spec']}: {r['value']:.2f} s a prompt ({r['value'] / press:.2f}x {PRESS})", err=True)


if __name__ == "__main__":
    main()
