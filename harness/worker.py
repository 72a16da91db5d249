"""Runs cells in a child process with a time limit and a memory limit, so that nothing a cell
does -- run out of memory, hang, raise, or kill its own process -- can stop the sweep.

One worker process (``python -m harness.worker``) measures cell after cell, so imports and
compiled kernels are paid for once; it is replaced by a fresh one after any cell that ran out
of memory, timed out or crashed. Requests go in on the child's stdin, answers come back as JSON
lines on a private pipe (the child's own stdout/stderr go to an unlinked temporary file whose tail
explains a crash).

Limits:
- time: the parent kills the worker's whole process group once a cell passes its deadline
  (compile workers included) -> ``timeout``.
- memory on CPU: before each cell the worker caps its address space (``RLIMIT_AS``) at its
  current size plus the limit, so an allocation beyond it fails at once (``oom``) instead of
  pushing the machine into swap or the kernel's OOM killer. The parent also watches the
  worker's resident set and kills it past baseline + limit (a backstop, and the host guard on
  CUDA, where an address-space cap would break the driver). On CUDA the device limit is
  ``torch.cuda.set_per_process_memory_fraction``.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import psutil

from harness.timing import TimingConfig

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc", "memoryerror")
POLL_S = 0.05


def one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def looks_like_oom(text: str) -> bool:
    return any(m in text.lower() for m in OOM_MARKERS)


# -- the child ----------------------------------------------------------------------------------

def _die_with_parent(parent_pid: int) -> None:
    """Linux: the kernel kills this worker when the sweep dies, even by SIGKILL."""
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _cap_address_space(limit_bytes: int) -> None:
    import resource

    from harness.memory import proc_status

    size = proc_status("VmSize")
    if size is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = size + limit_bytes
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class PeakTimer:
    """The device's matmul FLOP/s, timed next to every cell with the cell's threads and dtype.

    Its operands are allocated once, before any cell's memory baseline, so they never count in a
    cell's peak memory; each timing is short (``PEAK_TIMING``) because it runs twice per cell.
    """

    def __init__(self, device: str):
        from harness.noise import peak_matmul

        self.fn, self.flops, self.dtype = peak_matmul(device)
        self._warm = False

    def measure(self) -> float:
        from harness.timing import first_call, time_callable

        if not self._warm:
            first_call(self.fn)
            self._warm = True
        return self.flops / time_callable(self.fn, PEAK_TIMING).median_s


PEAK_TIMING = TimingConfig(min_run_time=0.3, max_run_time=1.0, threshold=0.05)


def run_cell(cell_row: dict[str, Any], timing: TimingConfig, seed: int, peak: PeakTimer | None = None) -> dict[str, Any]:
    """Measure one cell in this process; every failure becomes a status (never raises).

    Order: a warm-up call on a throwaway instance (compile, autotune, lazy init), the matmul peak,
    the memory baseline, the measured instance's inputs (for decoding: the prefill, whose freed
    buffers are then handed back to the OS), the timed calls with the CPU snapshots around them,
    the peak again. ``peak`` None skips the peaks (tests of other things).
    """
    import torch

    from attn.attention.base import UnsupportedBackend
    from harness.cost import Cell, build
    from harness.memory import PeakMemory, release_freed_memory
    from harness.noise import cpu_snapshot, load_average, other_cpu
    from harness.timing import first_call, time_callable

    cell = Cell.from_row(cell_row)
    mem = PeakMemory(cell.device)
    try:
        # Warm-up on a throwaway instance: compilation, autotuning and lazy initialisation
        # are timed here, and whatever they leave behind is in the baseline taken next.
        torch.manual_seed(seed)
        measured = build(cell)
        warmup_s = first_call(measured.fn)
        del measured
        peak_before = peak.measure() if peak else None
        mem.baseline()
        torch.manual_seed(seed)
        measured = build(cell)
        release_freed_memory()  # what building freed (a decode prefill's activations) is not the cell's memory
        mem.reset_peak()
        start = cpu_snapshot()
        t = time_callable(measured.fn, timing)
        end = cpu_snapshot()
        peak_mem = mem.peak()
        backend, flops, tokens = measured.backend(), measured.flops, measured.tokens
        del measured
        peak_after = peak.measure() if peak else None
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
        "repeats": t.repeats, "timing_samples": t.samples, "calls_per_sample": t.number_per_run,
        "timed_calls": t.calls, "warmup_calls": 1,
        "warmup_s": warmup_s, "compile_s": max(0.0, warmup_s - median),
        "tokens_per_s": tokens / median,
        "flops": flops,
        "achieved_flops_per_s": None if flops is None else flops / median,
        "peak_mem_bytes": peak_mem, "mem_method": mem.method,
        "peak_before_flops_per_s": peak_before, "peak_after_flops_per_s": peak_after,
        "peak_dtype": peak.dtype if peak else None,
        "other_cpu": other_cpu(start, end), "loadavg_1m": load_average(),
    }


def child_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mem-limit", type=int, default=0, help="bytes; 0 = none")
    parser.add_argument("--plugin", action="append", default=[])
    parser.add_argument("--no-address-space-cap", action="store_true", help="leave memory to the parent's RSS watchdog")
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
    cuda = args.device.startswith("cuda")
    if cuda and args.mem_limit and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(torch.device(args.device)).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.mem_limit / total), torch.device(args.device))
    send({"event": "ready", "pid": os.getpid(), "plugin_errors": failed})
    peak: PeakTimer | None = None
    for line in sys.stdin:
        req = json.loads(line)
        timing = TimingConfig(**req.get("timing", {}))
        if not cuda and args.mem_limit and not args.no_address_space_cap:
            _cap_address_space(args.mem_limit)
        if req["op"] == "cell":
            if peak is None:  # once, before the first cell's memory baseline
                peak = PeakTimer(args.device)
            send(run_cell(req["cell"], timing, req.get("seed", 0), peak))
        elif req["op"] == "exit":
            break


# -- the parent ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerConfig:
    device: str = "cpu"
    mem_limit_bytes: int | None = None  # the measuring device's memory; None: no limit
    host_limit_bytes: int | None = None  # resident-memory watchdog; None: mem_limit_bytes on CPU, off on CUDA
    plugins: tuple[str, ...] = ()
    startup_timeout_s: float = 300.0
    address_space_cap: bool = True  # CPU: RLIMIT_AS per cell; off leaves only the RSS watchdog


class Worker:
    """Parent-side handle: ``run_cell`` returns the cell's result dict, whatever happened to it."""

    def __init__(self, config: WorkerConfig):
        self.config = config
        self.proc: subprocess.Popen | None = None
        self._rfd: int | None = None
        self._buf = b""
        self._log_fd: int | None = None  # the worker's stdout/stderr (an unlinked temporary file)
        self.starts = 0  # processes started so far (a fresh one after every failure)
        self.startup_s = 0.0  # seconds spent starting them (imports), not charged to any cell

    # lifecycle
    def start(self) -> None:
        rfd, wfd = os.pipe()
        fd, log = tempfile.mkstemp(prefix="attn-bench-worker-", suffix=".log")
        os.unlink(log)  # the open descriptors keep it alive; nothing is left behind, even if we are killed
        self._log_fd = fd
        cmd = [sys.executable, "-m", "harness.worker", "--fd", str(wfd), "--parent", str(os.getpid()),
               "--device", self.config.device, "--mem-limit", str(self.config.mem_limit_bytes or 0)]
        for p in self.config.plugins:
            cmd += ["--plugin", p]
        if not self.config.address_space_cap:
            cmd.append("--no-address-space-cap")
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=fd, stderr=subprocess.STDOUT, pass_fds=(wfd,),
                start_new_session=True,  # its own process group: a timeout kills compile workers too
            )
        finally:
            os.close(wfd)
        self._rfd, self._buf = rfd, b""
        self.starts += 1
        begin = time.monotonic()
        msg = self._receive(begin + self.config.startup_timeout_s, watch_rss=None)
        self.startup_s += time.monotonic() - begin
        if msg.get("event") != "ready":
            self.kill()
            raise RuntimeError(f"worker failed to start: {msg.get('error')}")

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            if self.proc.stdin:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
        if self._rfd is not None:
            os.close(self._rfd)
        if self._log_fd is not None:
            os.close(self._log_fd)
        self.proc, self._rfd, self._log_fd = None, None, None

    def close(self) -> None:
        """Ask the worker to exit, then make sure it has."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.flush()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self.kill()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # requests
    def run_cell(self, cell_row: dict[str, Any], timing: TimingConfig, seed: int, time_limit_s: float) -> dict[str, Any]:
        return self._request({"op": "cell", "cell": cell_row, "seed": seed, "timing": vars_of(timing)}, time_limit_s)

    def _request(self, msg: dict[str, Any], time_limit_s: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.kill()
            try:
                self.start()
            except RuntimeError as e:
                return {"status": "error", "error": one_line(str(e))}
        base_rss = self._rss()
        try:
            self.proc.stdin.write((json.dumps(msg, default=str) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the worker died; _receive reports how
        limit = self.config.host_limit_bytes
        if limit is None and not self.config.device.startswith("cuda"):
            limit = self.config.mem_limit_bytes
        result = self._receive(time.monotonic() + time_limit_s, watch_rss=None if limit is None else base_rss + limit,
                               time_limit_s=time_limit_s)
        if result.get("status") not in ("ok", "unsupported", "error") or result.get("crashed"):
            self.kill()  # a fresh process for the next cell after oom, timeout or a crash
        result.pop("crashed", None)
        return result

    def _rss(self) -> int:
        try:
            return psutil.Process(self.proc.pid).memory_info().rss
        except (psutil.Error, AttributeError):
            return 0

    def _log_tail(self, chars: int = 300) -> str:
        try:
            size = os.fstat(self._log_fd).st_size
            data = os.pread(self._log_fd, 4 * chars, max(0, size - 4 * chars))
        except (OSError, TypeError):
            return ""
        return one_line(data.decode(errors="replace")[-chars:], chars)

    def _receive(self, deadline: float, watch_rss: int | None, time_limit_s: float | None = None) -> dict[str, Any]:
        """The next message from the worker, or a status saying why none will come."""
        while True:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                return json.loads(line)
            ready, _, _ = select.select([self._rfd], [], [], POLL_S)
            if ready:
                chunk = os.read(self._rfd, 1 << 16)
                if chunk:
                    self._buf += chunk
                    continue
                return self._died()
            if self.proc.poll() is not None and not select.select([self._rfd], [], [], 0)[0]:
                return self._died()
            if time.monotonic() > deadline:
                self.kill()
                what = f"the {time_limit_s:g} s time limit" if time_limit_s else "the worker start-up time limit"
                return {"status": "timeout", "error": f"did not finish within {what}"}
            if watch_rss is not None and self._rss() > watch_rss:
                rss = self._rss()
                self.kill()
                return {"status": "oom", "error": f"worker resident memory reached {rss / 2**30:.2f} GiB, "
                                                  f"past the memory limit (watchdog)"}

    def _crash_site(self) -> str:
        """Where a crash happened, from faulthandler's dump in the log: the innermost Python frame."""
        try:
            size = os.fstat(self._log_fd).st_size
            text = os.pread(self._log_fd, 1 << 16, max(0, size - (1 << 16))).decode(errors="replace")
        except (OSError, TypeError):
            return ""
        start = text.rfind("Current thread")
        frame = re.search(r'File "([^"]+)", line (\d+) in (\S+)', text[start:]) if start >= 0 else None
        return f" in {frame.group(3)} ({frame.group(1)}:{frame.group(2)})" if frame else ""

    def _died(self) -> dict[str, Any]:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        code = self.proc.returncode
        tail = self._log_tail()
        if code is not None and code < 0:
            sig = signal.Signals(-code).name
            if sig == "SIGKILL":
                return {"status": "oom", "crashed": True,
                        "error": f"worker killed by SIGKILL (most likely the kernel's OOM killer); log: {tail}"}
            why = f"worker crashed: killed by {sig}{self._crash_site()}"
            tail = "" if self._crash_site() else tail
        else:
            why = f"worker exited with status {code}"
        status = "oom" if looks_like_oom(tail) else "error"
        return {"status": status, "crashed": True, "error": one_line(f"{why}; log: {tail}" if tail else why)}


def vars_of(timing: TimingConfig) -> dict[str, float]:
    return timing.as_dict()


__all__ = ["Worker", "WorkerConfig", "PeakTimer", "looks_like_oom", "one_line", "run_cell"]


if __name__ == "__main__":
    child_main()
