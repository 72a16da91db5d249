"""What an evaluation pays for each arm beyond the first: n press arms sharing one prefill against one arm.

``python -m harness.accuracy.bench_arms --out results/arms-sharing-cpu.jsonl`` runs passkey at 4K on SmolLM2-135M
through the evaluation pipeline (:mod:`harness.accuracy.pretrained`) with n = 1, 5, 10, 20 press arms, the first n of
:data:`ARMS` (``none``, the quantized cache, kvpress's six most compared presses at three ratios). Every arm branches
from one prefill per prompt (:class:`harness.accuracy.prefill.SharedPrefill`) and decodes its own answer, so n arms
cost one prefill plus n replays and decodes. The time is the pipeline's own ``eval_seconds`` of the cell (the prompts'
prefills, every arm's compression and answer; not the weights' reading or the model's build, paid once a run), one
row per n, with its ratio to n = 1 measured in the same run; every arm runs once at 512 tokens before the timed runs,
so no one-time cost (kvpress's and quanto's first calls) lands in one of them. A timed run: nothing else may share the
machine.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import click

PRESSES = ("streaming_llm", "snapkv", "tova", "knorm", "expected_attention", "pyramidkv")
ARMS = ("none", "quantized:nbits=4", *(f"{p}:compression_ratio={r}" for r in (0.5, 0.25, 0.75) for p in PRESSES))
COUNTS = (1, 5, 10, 20)


def measure(model: str, length: int, examples: int, n: int, dtype: str) -> dict:
    """One run of the pipeline with the first ``n`` arms; the cell's row columns that say what it cost."""
    from harness.accuracy import pretrained
    from harness.accuracy.tasks import get_checkpoint_task
    from harness.results import read_rows

    config = get_checkpoint_task("passkey").config({"depths": (0.5,), "eval_examples": examples})
    plan = pretrained.plan(model, ("passkey",), ["full"], ["checkpoint"], [length], {"passkey": config}, ARMS[:n],
                           dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        pretrained.run([plan], out, False, echo=lambda line: None)
        rows = read_rows(out)
    ok = [r for r in rows if r["status"] == "ok"]
    seconds = {r["eval_seconds"] for r in rows}  # one cell: every arm's row carries the cell's time
    assert len(seconds) == 1, seconds
    return {"n_arms": n, "arms": list(ARMS[:n]), "eval_seconds": seconds.pop(), "prompts": examples, "model": model,
            "arms_ok": len(ok), "exact_match": {r["press_spec"]: r["value"] for r in ok},
            **{k: rows[0][k] for k in ("dtype", "device", "device_name", "cpu_capability", "num_threads",
                                        "torch_version", "project_version", "hostname", "timestamp")}}


@click.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--length", default=4096, show_default=True)
@click.option("--examples", default=2, show_default=True, help="Prompts per run (passkey keys at depth 0.5).")
@click.option("--dtype", "dtypes", multiple=True, default=("float32",), show_default=True,
              help="float32 and/or bfloat16 (repeatable): each its own n = 1, 5, 10, 20.")
def main(out: Path, model: str, length: int, examples: int, dtypes: tuple[str, ...]) -> None:
    """n arms against one, each run's rows appended to OUT as it finishes."""
    from harness.results import ResultsStore

    store = ResultsStore(out, ("n_arms", "dtype"))
    for dtype in dtypes:
        measure(model, 512, 1, len(ARMS), dtype)  # untimed: every arm's first use (kvpress, quanto) paid before timing
        base = None
        for n in COUNTS:
            row = measure(model, length, examples, n, dtype)
            base = base or row["eval_seconds"]
            row = {"task": "arms_sharing", "metric": "eval_seconds", "value": row["eval_seconds"], "status": "ok",
                   **row, "eval_len": length, "ratio_to_one": row["eval_seconds"] / base, "variant": "full",
                   "variant_spec": "full"}
            store.append(row)
            click.echo(f"{dtype} n={n}: {row['eval_seconds']:.1f} s ({row['ratio_to_one']:.2f}x one arm)", err=True)


if __name__ == "__main__":
    main()
