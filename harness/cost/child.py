"""The worker process's own side: what ``python -m harness.cost.worker`` runs (harness.cost.worker
starts it and holds the parent's side). It reads requests on stdin, measures each cell in this process
(:func:`run_cell`) and answers JSON lines on the pipe the parent passed (``--fd``).
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import signal
import sys
from typing import Any

from harness.cost.timing import TimingConfig
from harness.memory import cap_address_space
from harness.messages import looks_like_oom, one_line


def _die_with_parent(parent_pid: int) -> None:
    """Linux: the kernel kills this worker when the sweep dies, even by SIGKILL."""
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def run_cell(cell_row: dict[str, Any], timing: TimingConfig, seed: int,
             peaks: tuple[str, ...] = ("before", "after"), options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Measure one cell in this process; every failure becomes a status (never raises).

    ``options``: ``gate`` (harness.cost.gate.GateOptions as a dict: the cell is checked against its reference before
    anything is timed, and refused as ``mismatch``), ``profile`` (a trace path: harness.cost.profile, after timing).

    Order: a warm-up call on a throwaway instance (compile, autotune, lazy init), the matmul peak,
    the memory baseline, the measured instance's inputs (for decoding: the prefill, whose freed
    buffers are then handed back to the OS), the timed calls with the CPU snapshots around them,
    the peak again (``harness.cost.noise.time_peak``, in the cell's dtype), each with the bandwidth of the memory
    level the call's working set lives in (``time_bandwidth``, ``bandwidth_level``). ``peaks`` names which of the
    two to time (the sweep times one per chain on CUDA: harness.cost.sweep.CellMeasurer.peaks_for).
    """
    import torch

    from attn.attention.base import UnsupportedBackend
    from harness.cost.cells import DTYPES, Cell, build
    from harness.cost.noise import cpu_snapshot, load_average, memory_level, other_cpu, time_bandwidth, time_peak, usable_cpus
    from harness.cost.timing import first_call, time_callable
    from harness.memory import PeakMemory, release_freed_memory

    cell = Cell.from_row(cell_row)
    options = options or {}
    checked: dict[str, Any] = {}
    mem = PeakMemory(cell.device)
    cuda = cell.device.startswith("cuda")
    working_set: int | None = None  # the bytes one call moves, known once the warm-up instance is built

    def peak(when: str) -> tuple[float | None, float | None]:  # (matmul FLOP/s, bytes/s of the call's level)
        # the bandwidth at the call's own working set, around every cell (on CUDA before it: a chain's cells
        # grow out of the L2 one by one), the matmul peak as ``peaks`` says
        flops = time_peak(cell.device, DTYPES[cell.dtype]) if when in peaks else None
        timed = when in peaks or (cuda and when == "before")
        return flops, time_bandwidth(cell.device, working_set) if timed and working_set else None

    if options.get("profile"):  # name each generated C++ kernel in the trace (set before anything compiles)
        import torch._inductor.config

        torch._inductor.config.cpp.enable_kernel_profile = True
    try:
        # Warm-up on a throwaway instance: compilation, autotuning and lazy initialisation
        # are timed here, and whatever they leave behind is in the baseline taken next.
        torch.manual_seed(seed)
        measured = build(cell)
        if options.get("gate") is not None:
            checked = gate_cell(cell, measured, options["gate"])
            if "mismatch" in (checked["check"], checked["base_check"]):
                return {"status": "mismatch", "error": f"not timed: {checked['check_detail']}", **checked}
        warmup_s = first_call(measured.fn)
        working_set = measured.bytes
        del measured
        peak_before = peak("before")
        mem.baseline()
        torch.manual_seed(seed)
        measured = build(cell)
        release_freed_memory()  # what building freed (a decode prefill's activations) is not the cell's memory
        mem.reset_peak()
        start = cpu_snapshot()
        t = time_callable(measured.fn, timing)
        end = cpu_snapshot()
        peak_mem = mem.peak()
        backend, flops, tokens, moved = measured.backend(), measured.flops, measured.tokens, measured.bytes
        columns = measured.columns() if measured.columns is not None else {}
        if options.get("profile"):
            from pathlib import Path

            from harness.cost.profile import profile_calls

            columns.update(profile_calls(measured.fn, Path(options["profile"]), cell.device, t.median_s))
        del measured
        peak_after = peak("after")
    except UnsupportedBackend as e:
        return {"status": "unsupported", "error": one_line(e)}
    except MemoryError as e:
        return {"status": "oom", "error": one_line(f"MemoryError: {e}")}
    except Exception as e:  # noqa: BLE001  (a cell's failure is data, not a crash of the sweep)
        msg = one_line(f"{type(e).__name__}: {e}")
        oom = isinstance(e, torch.OutOfMemoryError) or looks_like_oom(msg)
        return {"status": "oom" if oom else "error", "error": msg}
    median = t.median_s
    return {
        "status": "ok", "error": None, "backend": backend,
        "latency_ms": median * 1e3,
        "latency_iqr_ms": None if t.iqr_s is None else t.iqr_s * 1e3,
        "repeats": t.repeats, "timing_samples": t.samples,
        "sample_ms": [x * 1e3 for x in t.per_call_s], "calls_per_sample": t.number_per_run,
        "timed_calls": t.calls, "warmup_calls": 1,
        "warmup_s": warmup_s, "compile_s": max(0.0, warmup_s - median),
        "tokens_per_s": tokens / median,
        "flops": flops,
        "achieved_flops_per_s": None if flops is None else flops / median,
        "peak_mem_bytes": peak_mem, "mem_method": mem.method,
        "bytes": moved,
        "achieved_bytes_per_s": None if moved is None else moved / median,
        "peak_before_flops_per_s": peak_before[0], "peak_after_flops_per_s": peak_after[0],
        "bandwidth_before_bytes_per_s": peak_before[1], "bandwidth_after_bytes_per_s": peak_after[1],
        "bandwidth_level": memory_level(cell.device, moved) if moved else None,
        "peak_dtype": cell.dtype if peaks else None,
        "other_cpu": other_cpu(start, end), "loadavg_1m": load_average(),
        "num_threads": torch.get_num_threads(), "cpus": usable_cpus(),
        **checked, **columns,
    }


def gate_cell(cell: Any, measured: Any, gate: dict[str, Any]) -> dict[str, Any]:
    """The gate's columns for ``cell`` (harness.cost.gate); a scope without a gate says so and is timed."""
    from harness.cost.gate import GateOptions

    if measured.gate is None:
        return {"check": "skipped", "check_detail": f"the gate compares the op scope's cells, not {cell.scope}'s",
                "check_tokens": None, "base_check": None, "base_err": None}
    return measured.gate(GateOptions(**gate))


def claim_cuda_device(device: str, mem_limit: int | None) -> int:
    """Make ``device`` ("cuda" or "cuda:N") current and cap this process's share of it; returns N.

    Current, because the timer synchronises the current device: a cell on cuda:1 with cuda:0 current
    would time kernel launches. An index, because torch's set_device and memory-fraction calls refuse
    a bare "cuda" (ValueError: expected a device with an index).
    """
    import torch

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    torch.cuda.set_device(index)
    if mem_limit:
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, mem_limit / total), index)
    return index


def child_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.cost.worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mem-limit", type=int, default=0, help="bytes; 0 = none")
    parser.add_argument("--plugin", action="append", default=[])
    parser.add_argument("--no-address-space-cap", action="store_true", help="leave memory to the parent's RSS watchdog")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = torch's default")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    faulthandler.enable()  # a crash leaves the Python stack in the log, and so in the row's error
    out = os.fdopen(args.fd, "w", buffering=1)

    def send(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg, default=str) + "\n")
        out.flush()

    import torch
    import torch._dynamo

    import attn

    # One worker compiles every shape of a sweep. Past dynamo's default of 8 recompiles per function
    # it would silently run eager instead -- for FlexAttention the dense L x L path -- and the cell
    # would time the wrong program; raise the limit, and fail loudly if it is ever reached.
    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 8192
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    failed = {p: attn.plugin_errors().get(p) for p in args.plugin if not attn.load_plugin(p)}
    if args.threads:
        torch.set_num_threads(args.threads)  # before any cell: the peak matmul and the cell run with these
    cuda = args.device.startswith("cuda")
    if cuda and torch.cuda.is_available():
        claim_cuda_device(args.device, args.mem_limit)
    send({"event": "ready", "pid": os.getpid(), "plugin_errors": failed})
    for line in sys.stdin:
        req = json.loads(line)
        timing = TimingConfig(**req.get("timing", {}))
        if not cuda and args.mem_limit and not args.no_address_space_cap:
            cap_address_space(args.mem_limit)
        if req["op"] == "cell":
            send(run_cell(req["cell"], timing, req.get("seed", 0), tuple(req.get("peaks", ("before", "after"))),
                          req.get("options")))
        elif req["op"] == "exit":
            break


__all__ = ["child_main", "claim_cuda_device", "run_cell"]
