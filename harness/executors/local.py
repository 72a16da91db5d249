"""The ``local`` executor: one host in this process's machine, the chains one after another."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.executors.base import Record, Workload, drive


class LocalExecutor:
    """One host on this machine, chains in order: the sweep as it always ran."""

    kind = "local"

    def recover(self, tasks: dict[str, Any], record: Record) -> set[str]:
        return set()

    def run(self, work: Workload, record: Record, started: Callable[[Any], None] | None = None) -> None:
        if not work.chains:
            return
        host = work.make_host()
        try:
            for chain in work.chains:
                drive(chain, host, record, started)
        finally:
            host.close()


__all__ = ["LocalExecutor"]
