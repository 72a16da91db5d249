"""Runs cells in a child process with a time limit and a memory limit, so that nothing a cell
does -- run out of memory, hang, raise, or kill its own process -- can stop the sweep.

One worker process (``python -m harness.cost.worker``) measures cell after cell, so imports and
compiled kernels are paid for once; it is replaced by a fresh one after any cell that ran out
of memory, timed out or crashed. Requests go in on the child's stdin, answers come back as JSON
lines on a private pipe (the child's own stdout/stderr go to an unlinked temporary file whose tail
explains a crash). This module is the parent's side and the worker's entry point; what the worker
process runs is harness.cost.child.

What it can import: installed modules and the plugins the user named, never a stray file in the
directory the sweep was started from (``python -m`` would put that directory first on
``sys.path``, so a ``psutil.py`` there would run inside the measuring process): see
:func:`child_command`.

Limits:
- time: the parent kills the worker's whole process group once a cell passes its deadline
  (compile workers included), and every descendant it has seen that left the group (a child
  started in a session of its own) -> ``timeout``.
- memory on CPU: before each cell the worker caps its address space (``RLIMIT_AS``) at its
  current size plus the limit, so an allocation beyond it fails at once (``oom``) instead of
  pushing the machine into swap or the kernel's OOM killer. The parent also watches the
  worker's resident set and kills it past baseline + limit (a backstop, and the host guard on
  CUDA, where an address-space cap would break the driver). On CUDA the device limit is
  ``torch.cuda.set_per_process_memory_fraction``.
- a SIGKILL the parent did not send is ``oom`` only with evidence of an out-of-memory kill (the
  kernel's OOM-kill count rose, the worker's resident memory was near its limit, or the machine's
  available memory was nearly gone when last sampled); otherwise it is ``error``, so a backend that
  kills itself does not make the sweep skip every longer length as if memory had run out.
"""
from __future__ import annotations

import contextlib
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

from harness.cost.child import child_main, run_cell  # the worker process's side
from harness.cost.timing import TimingConfig
from harness.messages import looks_like_oom, one_line

POLL_S = 0.05
TRACK_S = 0.5  # how often the parent lists the worker's descendants while it waits
NEAR_LIMIT = 0.9  # a SIGKILL with resident memory past this fraction of the limit counts as out of memory
LOW_AVAILABLE = 0.05  # ... or with less than this fraction of the machine's memory available

# Python 3.10 has no -P: start with -c (which puts '' first on sys.path), drop that entry before
# anything else is imported, then run the module named by the first argument as -m would (the name
# stays on the command line, so the worker is recognisable in ``ps`` as with -m).
_BOOTSTRAP = ("import sys\n"
              "if sys.path[:1] == ['']:\n    del sys.path[0]\n"
              "import runpy\n"
              "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n")


# -- the parent ---------------------------------------------------------------------------------

def child_command(args: list[str], version: tuple[int, int] | None = None) -> list[str]:
    """The command line of a worker: the current directory is never on its ``sys.path``.

    3.11+: ``python -P -m harness.cost.worker`` (safe path; the flag is not inherited through the
    environment, so a backend's own subprocesses run scripts as usual). 3.10: a ``-c`` bootstrap that
    removes the '' entry first. ``harness`` itself is found as an installed (or editable) package.
    """
    version = version or sys.version_info[:2]
    if version >= (3, 11):
        return [sys.executable, "-P", "-m", "harness.cost.worker", *args]
    return [sys.executable, "-c", _BOOTSTRAP, "harness.cost.worker", *args]


def oom_kill_count() -> int | None:
    """The kernel's count of OOM kills since boot (``/proc/vmstat``; cgroup OOM kills included), or None."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


@dataclass(frozen=True)
class WorkerConfig:
    device: str = "cpu"
    mem_limit_bytes: int | None = None  # the measuring device's memory; None: no limit
    host_limit_bytes: int | None = None  # resident-memory watchdog; None: mem_limit_bytes on CPU, off on CUDA
    plugins: tuple[str, ...] = ()
    startup_timeout_s: float = 300.0
    address_space_cap: bool = True  # CPU: RLIMIT_AS per cell; off leaves only the RSS watchdog
    threads: int | None = None  # torch.set_num_threads in the worker; None: torch's default
    # first on the worker's import path (PYTHONPATH): a --base ref's attn package (harness.cost.pinned)
    path: tuple[str, ...] = ()


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
        self._ps: psutil.Process | None = None  # the worker, as psutil sees it (pid reuse safe)
        self._descendants: dict[int, psutil.Process] = {}  # every descendant seen, so escaped ones can be killed
        self._tracked_at = 0.0
        # evidence for telling an OOM kill from another SIGKILL, sampled while waiting on a request
        self._peak_rss = 0
        self._rss_limit: int | None = None
        self._available: int | None = None
        self._oom_kills: int | None = None

    # lifecycle
    def start(self) -> None:
        rfd, wfd = os.pipe()
        fd, log = tempfile.mkstemp(prefix="attn-bench-worker-", suffix=".log")
        os.unlink(log)  # the open descriptors keep it alive; nothing is left behind, even if we are killed
        self._log_fd = fd
        args = ["--fd", str(wfd), "--parent", str(os.getpid()),
                "--device", self.config.device, "--mem-limit", str(self.config.mem_limit_bytes or 0)]
        for p in self.config.plugins:
            args += ["--plugin", p]
        if not self.config.address_space_cap:
            args.append("--no-address-space-cap")
        if self.config.threads:
            args += ["--threads", str(self.config.threads)]
        cmd = child_command(args)
        env = None
        if self.config.path:  # no empty entry: one would put the current directory back on the path
            inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([*self.config.path, *inherited])}
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=fd, stderr=subprocess.STDOUT, pass_fds=(wfd,), env=env,
                start_new_session=True,  # its own process group: a timeout kills compile workers too
            )
        finally:
            os.close(wfd)
        self._rfd, self._buf = rfd, b""
        with contextlib.suppress(psutil.Error):
            self._ps = psutil.Process(self.proc.pid)
        self.starts += 1
        begin = time.monotonic()
        self._start_evidence(None)
        msg = self._receive(begin + self.config.startup_timeout_s, watch_rss=None)
        self.startup_s += time.monotonic() - begin
        if msg.get("event") != "ready":
            self.kill()
            raise RuntimeError(f"worker failed to start: {msg.get('error')}")

    def kill(self) -> None:
        """Kill the worker's process group and every descendant that left it, and wait for them."""
        if self.proc is not None:
            self._track()  # children still attached to a live worker are found here
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self._kill_descendants()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            if self.proc.stdin:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
        if self._rfd is not None:
            os.close(self._rfd)
        if self._log_fd is not None:
            os.close(self._log_fd)
        self.proc, self._rfd, self._log_fd, self._ps = None, None, None, None
        self._descendants = {}

    def _track(self) -> None:
        """Remember the worker's descendants now: one that starts its own session and whose parent
        dies is no longer anyone's child we can find, nor in the worker's process group."""
        self._tracked_at = time.monotonic()
        self._descendants = {pid: p for pid, p in self._descendants.items() if _running(p)}
        if self._ps is None or self.proc is None or self.proc.poll() is not None:
            return  # reaped: its pid may be reused, and its orphans are already someone else's children
        with contextlib.suppress(psutil.Error):
            for p in self._ps.children(recursive=True):
                self._descendants.setdefault(p.pid, p)

    def _kill_descendants(self) -> None:
        """SIGKILL every tracked descendant still running (psutil refuses a reused pid), and the
        process group of each one that leads its own, so its own children go with it."""
        procs = [p for p in self._descendants.values() if _running(p)]
        own = os.getpgrp()
        for p in procs:
            with contextlib.suppress(OSError):
                if os.getpgid(p.pid) == p.pid != own and _running(p):
                    os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(psutil.Error):
                p.kill()
        with contextlib.suppress(psutil.Error):
            psutil.wait_procs(procs, timeout=5)

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
    def run_cell(self, cell_row: dict[str, Any], timing: TimingConfig, seed: int, time_limit_s: float,
                 peaks: tuple[str, ...] = ("before", "after"), options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Measure one cell in the worker; ``peaks``: which matmul peaks to time around it, ``options``: its gate
        and profile (harness.cost.child.run_cell)."""
        return self._request({"op": "cell", "cell": cell_row, "seed": seed, "timing": vars_of(timing),
                              "peaks": list(peaks), "options": options or {}}, time_limit_s)

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
        self._start_evidence(None if limit is None else base_rss + limit)
        result = self._receive(time.monotonic() + time_limit_s, watch_rss=None if limit is None else base_rss + limit,
                               time_limit_s=time_limit_s)
        if self.proc is not None and self.proc.poll() is None:
            self._track()  # what the cell started, while the worker still holds it
        fresh = result.get("status") not in ("ok", "unsupported", "error") or result.get("crashed")
        # On CUDA any error may be sticky (an illegal address poisons the context for every later call).
        if fresh or (result.get("status") == "error" and self.config.device.startswith("cuda")):
            self.kill()  # a fresh process for the next cell after oom, timeout, a crash, or a CUDA error
        result.pop("crashed", None)
        return result

    def _rss(self) -> int:
        try:
            return self._ps.memory_info().rss
        except (psutil.Error, AttributeError):
            return 0

    def _start_evidence(self, rss_limit: int | None) -> None:
        self._peak_rss, self._rss_limit, self._available = self._rss(), rss_limit, None
        self._oom_kills = oom_kill_count()

    def _sample(self) -> int:
        """The worker's resident memory now; also keeps the evidence an unexplained SIGKILL is judged by."""
        rss = self._rss()
        self._peak_rss = max(self._peak_rss, rss)
        with contextlib.suppress(OSError, RuntimeError):
            self._available = psutil.virtual_memory().available
        return rss

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
            if time.monotonic() - self._tracked_at > TRACK_S:
                self._track()
            rss = self._sample()
            if watch_rss is not None and rss > watch_rss:
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
            if sig == "SIGKILL":  # not ours: our own kills (time limit, watchdog) return before this
                status, why = self._judge_sigkill()
                return {"status": status, "crashed": True, "error": one_line(f"{why}; log: {tail}" if tail else why)}
            why = f"worker crashed: killed by {sig}{self._crash_site()}"
            tail = "" if self._crash_site() else tail
        else:
            why = f"worker exited with status {code}"
        status = "oom" if looks_like_oom(tail) else "error"
        return {"status": status, "crashed": True, "error": one_line(f"{why}; log: {tail}" if tail else why)}

    def _judge_sigkill(self) -> tuple[str, str]:
        """(status, why) of a SIGKILL the parent did not send, from the evidence sampled while waiting.

        The kernel's OOM killer and a backend killing its own process look alike from here; only an
        out-of-memory kill must make the sweep skip longer lengths, so ``oom`` needs evidence.
        """
        gib = 2**30
        rss, limit, available = self._peak_rss, self._rss_limit, self._available
        kills = oom_kill_count()
        if kills is not None and self._oom_kills is not None and kills > self._oom_kills:
            return "oom", (f"worker killed by SIGKILL: the kernel's OOM killer (its kill count rose; "
                           f"worker resident memory {rss / gib:.2f} GiB when last sampled)")
        if limit and rss >= NEAR_LIMIT * limit:
            return "oom", (f"worker killed by SIGKILL with resident memory {rss / gib:.2f} GiB, "
                           f"near its limit {limit / gib:.2f} GiB")
        total = _total_memory()
        if available is not None and total and available < LOW_AVAILABLE * total:
            return "oom", (f"worker killed by SIGKILL with the machine's memory nearly exhausted "
                           f"({available / gib:.2f} of {total / gib:.2f} GiB available when last sampled)")
        of = f"of limit {limit / gib:.2f} GiB" if limit else f"of {total / gib:.2f} GiB on this machine"
        return "error", f"worker killed by SIGKILL (not out of memory: RSS {rss / gib:.2f} GiB {of})"


def _running(p: psutil.Process) -> bool:
    """Alive and still the same process (not a zombie, not a reused pid)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _total_memory() -> int:
    try:
        return psutil.virtual_memory().total
    except (OSError, RuntimeError):
        return 0


def vars_of(timing: TimingConfig) -> dict[str, float]:
    return timing.as_dict()


__all__ = ["Worker", "WorkerConfig", "child_command", "looks_like_oom", "one_line", "oom_kill_count",
           "run_cell"]


if __name__ == "__main__":  # the worker process (started by child_command)
    child_main()
