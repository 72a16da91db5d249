"""Peak memory of one cell, measured rather than estimated.

- CUDA: the caching allocator's peak (``torch.cuda.max_memory_allocated``) after
  ``reset_peak_memory_stats``, minus what was allocated before the cell's inputs were built.
- CPU: the worker process's peak resident set size (``VmHWM``, reset by writing ``5`` to
  ``/proc/self/clear_refs``) minus its resident set size right before the cell's inputs were
  built, taken after ``gc.collect()`` and ``malloc_trim(0)`` so memory freed by earlier cells
  is back with the OS and cannot hide in the baseline.

Both therefore count the inputs (and the KV cache for decoding, the weights for a model), the
output and every intermediate alive at the worst moment of a steady-state call, autograd
buffers in training; compilation happens in an earlier warm-up call and is not counted.

Also here, the memory policy both harnesses follow: how much memory one cell or job may use by default
(:func:`available_budget`, :func:`host_memory_limit`, :func:`cell_memory_limits`) and the address-space cap that
makes an allocation past it fail at once instead of swapping (:func:`cap_address_space`, :func:`address_space_cap`).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Iterator

import torch


def proc_status(field: str) -> int | None:
    """A ``/proc/self/status`` size field (``VmRSS``, ``VmHWM``, ``VmSize``) in bytes; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        return None
    return None


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


AVAILABLE_FRACTION = 0.8  # of the memory available when the sweep starts: what other processes hold stays theirs
TOTAL_FRACTION = 0.5  # of the machine's memory: the floor, for a VM whose available memory grows on demand


def available_budget() -> int:
    """Bytes one cell or job may use by default: ``AVAILABLE_FRACTION`` of the memory available now."""
    import psutil

    return int(AVAILABLE_FRACTION * psutil.virtual_memory().available)


def host_memory_limit(total_floor: bool = True) -> tuple[int, str]:
    """(bytes, rule) of the default host-memory limit of one cell: 80% of what is available now (rule
    ``available``), or half the machine's memory (rule ``total``) where that is larger and ``total_floor``.

    80% of what is available alone is far below the machine's size on a VM that hands memory out on
    demand (it starts with little free), and the host watchdog of a CUDA sweep set there would kill cells
    the machine could hold. A CPU cell's own limit keeps no floor: past what is free, a laptop swaps.
    """
    import psutil

    mem = psutil.virtual_memory()
    available, total = int(AVAILABLE_FRACTION * mem.available), int(TOTAL_FRACTION * mem.total)
    return (total, "total") if total_floor and total > available else (available, "available")


def cell_memory_limits(device: str, mem_limit_gib: float | None) -> tuple[int | None, int | None, str | None]:
    """(limit on the measuring device, host resident-memory watchdog, the rule of the default host limit) of a cost cell.

    CPU: the limit covers the process's memory (default 80% of what is free now). CUDA: it covers device
    memory (default none: the whole GPU) and the host side keeps a watchdog at the larger of that and half
    the machine's memory (:func:`host_memory_limit`). Bytes; the rule is None where ``mem_limit_gib``
    set a CPU cell's only limit."""
    if device.startswith("cuda"):
        host_bytes, rule = host_memory_limit()
        return (None if mem_limit_gib is None else int(mem_limit_gib * 2**30)), host_bytes, rule
    if mem_limit_gib is not None:
        return int(mem_limit_gib * 2**30), None, None
    limit, rule = host_memory_limit(total_floor=False)
    return limit, None, rule


def cap_address_space(extra_bytes: int, keep_tighter: bool = False) -> tuple[int, int] | None:
    """Cap this process's address space (``RLIMIT_AS``) at its current size plus ``extra_bytes``, so an allocation
    past it fails at once (MemoryError, or torch's "can't allocate memory") instead of swapping; never above the
    hard limit, nor, with ``keep_tighter``, above a soft limit already set. Returns the limits it replaced, or
    None where there is none to set (not POSIX, no ``/proc``). Never with CUDA: the cap breaks the driver."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    size = proc_status("VmSize")
    if size is None:
        return None
    old = resource.getrlimit(resource.RLIMIT_AS)
    soft, hard = size + extra_bytes, old[1]
    for bound in (old[0], hard) if keep_tighter else (hard,):
        if bound != resource.RLIM_INFINITY:
            soft = min(soft, bound)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    return old


@contextlib.contextmanager
def address_space_cap(extra_bytes: int) -> Iterator[int | None]:
    """:func:`cap_address_space` (never loosening a tighter cap) for the ``with`` block, lifted afterwards; yields
    the cap in bytes, or None where there is none to set (also with CUDA initialised, whose driver it breaks)."""
    old = None if torch.cuda.is_initialized() else cap_address_space(extra_bytes, keep_tighter=True)
    if old is None:
        yield None
        return
    import resource

    try:
        yield resource.getrlimit(resource.RLIMIT_AS)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)


def release_freed_memory() -> None:
    """Collect garbage and hand glibc's free heap pages back to the OS (no-op elsewhere)."""
    gc.collect()
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def reset_rss_peak() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """``baseline()`` before building a cell's inputs, ``reset_peak()`` once they exist, ``peak()`` after."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.device = device
        self.method = "cuda_max_allocated" if self.cuda else "rss_hwm"
        self._base: int | None = None
        self._reset_ok = True

    def baseline(self) -> None:
        release_freed_memory()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._base = proc_status("VmRSS")

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._reset_ok = reset_rss_peak()

    def peak(self) -> int | None:
        """Bytes above the baseline at the worst moment since ``reset_peak``; None if unmeasurable."""
        if self._base is None:
            return None
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return max(0, torch.cuda.max_memory_allocated(self.device) - self._base)
        hwm = proc_status("VmHWM")
        if hwm is None or not self._reset_ok:
            return None  # no resettable high-water mark: an unreset lifetime peak would be wrong
        return max(0, hwm - self._base)


__all__ = ["AVAILABLE_FRACTION", "PeakMemory", "TOTAL_FRACTION", "address_space_cap", "available_budget",
           "cap_address_space", "cell_memory_limits", "host_memory_limit", "proc_status", "release_freed_memory",
           "reset_rss_peak"]
