"""What an evaluation pays for each arm beyond the first: n press arms sharing one prefill against one arm.

``python -m harness.accuracy.bench_arms --out results/arms-batch-cpu.jsonl`` runs passkey at 4K on SmolLM2-135M
through the evaluation pipeline (:mod:`harness.accuracy.pretrained`) with n = 1, 5, 10, 20 press arms, the first n of
:data:`ARMS` (``none``, the quantized cache, kvpress's six most compared presses at three ratios). Every arm branches
from one prefill per prompt (:class:`harness.accuracy.prefill.SharedPrefill`) and the arms' answers decode in one batch
(:mod:`attn.hf.batched`), so n arms cost one prefill, n replays and one batched decode; then the 20 arms once more, each
decoding alone (``decode: alone``), whose per-example scores the batched run must equal (``same_as_alone``). The time
is the pipeline's own ``eval_seconds`` of the cell (the prompts' prefills, every arm's compression and answer; not the
weights' reading or the model's build, paid once a run), one row per run, with its ratio to n = 1 measured in the same
run and its arm-examples an hour; every arm runs once at 512 tokens before the timed runs, so no one-time cost
(kvpress's and quanto's first calls) lands in one of them. A timed run: nothing else may share the machine.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import click

PRESSES = ("streaming_llm", "snapkv", "tova", "knorm", "expected_attention", "pyramidkv")
ARMS = ("none", "quantized:nbits=4", *(f"{p}:compression_ratio={r}" for r in (0.5, 0.25, 0.75) for p in PRESSES))
COUNTS = (1, 5, 10, 20)


def measure(model: str, length: int, examples: int, n: int, dtype: str, batch: bool = True) -> dict:
    """One run of the pipeline with the first ``n`` arms (``batch``: their answers decoded in one batch, else one arm
    at a time); the cell's row columns that say what it cost."""
    import dataclasses

    from harness.accuracy import pretrained
    from harness.accuracy.tasks import get_checkpoint_task
    from harness.results import read_rows

    config = get_checkpoint_task("passkey").config({"depths": (0.5,), "eval_examples": examples})
    plan = pretrained.plan(model, ("passkey",), ["full"], ["checkpoint"], [length], {"passkey": config}, ARMS[:n],
                           dtype=dtype)
    plan = dataclasses.replace(plan, batch_arms=batch)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        pretrained.run([plan], out, False, echo=lambda line: None)
        rows = read_rows(out)
    ok = [r for r in rows if r["status"] == "ok"]
    seconds = {r["eval_seconds"] for r in rows}  # one cell: every arm's row carries the cell's time
    assert len(seconds) == 1, seconds
    return {"n_arms": n, "arms": list(ARMS[:n]), "eval_seconds": seconds.pop(), "prompts": examples, "model": model,
            "decode": "batch" if batch else "alone", "arms_ok": len(ok),
            "exact_match": {r["press_spec"]: r["value"] for r in ok},
            "per_example": {r["press_spec"]: r["per_example"] for r in ok},
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

    store = ResultsStore(out, ("n_arms", "dtype", "decode"))
    for dtype in dtypes:
        measure(model, 512, 1, len(ARMS), dtype)  # untimed: every arm's first use (kvpress, quanto) paid before timing
        base, batched = None, None
        for n, batch in [*((n, True) for n in COUNTS), (COUNTS[-1], False)]:
            row = measure(model, length, examples, n, dtype, batch)
            base = base or row["eval_seconds"]
            row = {"task": "arms_sharing", "metric": "eval_seconds", "value": row["eval_seconds"], "status": "ok",
                   **row, "eval_len": length, "ratio_to_one": row["eval_seconds"] / base,
                   "arm_examples_per_hour": 3600 * n * examples / row["eval_seconds"], "variant": "full",
                   "variant_spec": "full"}
            if batch and n == COUNTS[-1]:
                batched = row
            elif not batch:
                row["same_as_alone"] = batched is not None and batched["per_example"] == row["per_example"]
            store.append(row)
            click.echo(f"{dtype} n={n} {row['decode']}: {row['eval_seconds']:.1f} s ({row['ratio_to_one']:.2f}x one "
                       f"arm, {row['arm_examples_per_hour']:.0f} arm-examples an hour)", err=True)


if __name__ == "__main__":
    main()
