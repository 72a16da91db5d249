"""How much the harness adds to a number: a cell's reported median vs the same callable in a bare loop.

Two comparisons, alternated over a few rounds so that drifting machine load hits both sides alike:
- end to end: the median the sweep's worker process reports for the cell (exactly the path of
  ``attn-bench sweep``) vs ``time.perf_counter()`` around each call in a plain loop in this process;
- timing method only: ``harness.cost.timing.time_callable`` vs the bare loop on the same callable object.

    python scripts/harness_overhead.py --variant full --length 2048 --rounds 3
"""
from __future__ import annotations

import argparse
import statistics

import torch

from harness.cost import build
from harness.cost.spec import build_spec, expand
from harness.cost.timing import TimingConfig, bare_loop, first_call, time_callable
from harness.cost.worker import Worker, WorkerConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", default="full")
    p.add_argument("--length", default="2048")
    p.add_argument("--heads", default="8")
    p.add_argument("--head-dim", default="64")
    p.add_argument("--mode", default="forward")
    p.add_argument("--scope", default="op")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=0, help="bare-loop calls per round (default: as many as the harness made)")
    args = p.parse_args()

    spec = build_spec([("command line", {"variant": [args.variant], "lengths": args.length, "heads": args.heads,
                                         "head_dim": args.head_dim, "mode": [args.mode], "scope": [args.scope]})])
    cell = expand(spec)[0]
    timing = spec.run.timing
    torch.manual_seed(spec.run.seed)
    measured = build(cell)
    first_call(measured.fn)

    worker_ms, method_ms, bare_ms = [], [], []
    with Worker(WorkerConfig(cell.device)) as worker:
        for r in range(args.rounds):
            row = worker.run_cell(cell.as_row(), timing, spec.run.seed, time_limit_s=600)
            if row["status"] != "ok":
                raise SystemExit(f"the cell did not run: {row['status']}: {row['error']}")
            worker_ms.append(row["latency_ms"])
            t = time_callable(measured.fn, TimingConfig(timing.min_run_time, timing.max_run_time, timing.threshold))
            method_ms.append(t.median_s * 1e3)
            calls = args.calls or max(5, row["repeats"])
            bare_ms.append(statistics.median(bare_loop(measured.fn, calls)) * 1e3)
            print(f"round {r + 1}: worker {worker_ms[-1]:.3f} ms ({row['repeats']} calls), "
                  f"time_callable {method_ms[-1]:.3f} ms, bare loop {bare_ms[-1]:.3f} ms ({calls} calls)")

    bare = statistics.median(bare_ms)
    for name, values in (("sweep worker (reported median)", worker_ms), ("harness.cost.timing.time_callable", method_ms)):
        m = statistics.median(values)
        print(f"{name:32s} {m:10.3f} ms  vs bare loop {bare:.3f} ms: {100 * (m - bare) / bare:+.1f}%")
    print(f"cell: {cell.label} [{cell.scope}, {cell.dtype}, B={cell.batch_size} H={cell.num_heads} D={cell.head_dim}]")


if __name__ == "__main__":
    main()
