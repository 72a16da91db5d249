"""The ``ray`` executor: one Ray actor per slot, each holding a host; a lost actor is replaced and its task retried once.

This module is ``harness.executors.ray``; the Ray library itself is imported at run time through
:func:`harness.executors.config.require` (absolute imports, so ``ray`` here is always the library)."""
from __future__ import annotations

import collections
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.executors.base import Chain, Host, Record, Workload
from harness.executors.config import ExecutorConfig, require

RAY_RETRIES = 1  # a task whose actor is lost runs once more on a fresh actor before it is recorded as failed
POLL_S = 0.2


class HostActor:
    """The Ray actor around one host (wrapped with ``ray.remote`` at run time, so ray stays optional)."""

    def __init__(self, make_host: Callable[[], Host]):
        self.host = make_host()

    def run(self, task: Any) -> Any:
        return self.host.run(task)

    def close(self) -> None:
        self.host.close()


@dataclass
class _Slot:
    actor: Any = None
    chain: Chain | None = None
    task: Any = None
    ref: Any = None
    deadline: float = 0.0
    attempts: int = 0


class RayExecutor:
    """Chains over a pool of Ray actors, each reserving one GPU (CUDA work) or one CPU."""

    kind = "ray"

    def __init__(self, config: ExecutorConfig, echo: Callable[[str], None] = print):
        self.config, self.echo = config, echo

    def recover(self, tasks: dict[str, Any], record: Record) -> set[str]:
        return set()

    def _connect(self, ray: Any) -> bool:
        """Join ``--ray-address`` / $RAY_ADDRESS or start a small local instance; True if we started it."""
        if ray.is_initialized():
            return False
        address = self.config.ray_address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=False)
        else:  # a local instance: the object store only carries payloads, a few KB each
            ray.init(include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
        return True

    def capacity(self, ray: Any, gpus: int) -> int:
        resources = ray.cluster_resources()
        have = int(resources.get("GPU" if gpus else "CPU", 0))
        if gpus and have < gpus:
            raise ValueError(f"the Ray cluster has {have} GPUs; CUDA cells need {gpus} each (check `ray status`)")
        return max(1, have // max(gpus, 1))

    def run(self, work: Workload, record: Record, started: Callable[[Any], None] | None = None) -> None:
        if not work.chains:
            return
        ray = require("ray")
        ours = self._connect(ray)
        try:
            self._run(ray, work, record, started)
        finally:
            if ours:
                ray.shutdown()

    def _run(self, ray: Any, work: Workload, record: Record, started: Callable[[Any], None] | None) -> None:
        from ray.exceptions import GetTimeoutError, RayError, RayTaskError

        from harness.messages import one_line

        queue = collections.deque(work.chains)
        n = min(len(queue), self.config.max_concurrency or self.capacity(ray, work.gpus))
        actor_cls = ray.remote(num_cpus=1, num_gpus=work.gpus, max_restarts=0)(HostActor)
        slots = [_Slot() for _ in range(n)]

        def submit(slot: _Slot, task: Any, attempts: int) -> None:
            if slot.actor is None:
                slot.actor = actor_cls.remote(work.make_host)
            slot.task, slot.attempts = task, attempts
            slot.ref = slot.actor.run.remote(task)
            slot.deadline = time.monotonic() + work.task_timeout_s
            if started:
                started(task)

        def advance(slot: _Slot) -> None:
            """Give the slot its chain's next task, or its next chain; settled tasks are recorded on the way."""
            while True:
                step = slot.chain.next() if slot.chain is not None else None
                if step is None:
                    if not queue:
                        slot.chain, slot.ref = None, None
                        return
                    slot.chain = queue.popleft()
                    continue
                task, payload = step
                if payload is None:
                    submit(slot, task, 1)
                    return
                slot.chain.finish(task, payload)
                record(task, payload)

        def settle(slot: _Slot, payload: Any) -> None:
            slot.chain.finish(slot.task, payload)
            record(slot.task, payload)
            advance(slot)

        def lose(slot: _Slot, why: str) -> None:
            with contextlib.suppress(Exception):
                ray.kill(slot.actor, no_restart=True)
            slot.actor = None
            if slot.attempts <= RAY_RETRIES:
                self.echo(f"ray: {why}; retrying on a fresh actor")
                submit(slot, slot.task, slot.attempts + 1)
            else:
                settle(slot, work.lost(slot.task, f"{why} (lost {slot.attempts} times)"))

        try:
            for slot in slots:
                advance(slot)
            while any(s.ref is not None for s in slots):
                refs = [s.ref for s in slots if s.ref is not None]
                ready, _ = ray.wait(refs, num_returns=1, timeout=POLL_S)
                for slot in slots:
                    if slot.ref is None:
                        continue
                    if slot.ref in ready:
                        try:
                            payload = ray.get(slot.ref, timeout=60)
                        except RayTaskError as e:  # the host itself raised: a bug, not a lost node
                            payload = work.lost(slot.task, f"ray task failed: {one_line(e.__cause__ or e)}")
                        except (RayError, GetTimeoutError) as e:  # actor, worker or node died
                            lose(slot, f"Ray worker lost: {type(e).__name__}: {one_line(e, 200)}")
                            continue
                        settle(slot, payload)
                    elif time.monotonic() > slot.deadline:
                        lose(slot, f"no answer from the Ray worker within {work.task_timeout_s:g} s "
                                   f"(node unresponsive, or no free {'GPU' if work.gpus else 'CPU'} in the cluster)")
        finally:
            closing = [s.actor.close.remote() for s in slots if s.actor is not None]
            with contextlib.suppress(Exception):
                ray.wait(closing, num_returns=len(closing), timeout=10)
            for s in slots:
                if s.actor is not None:
                    with contextlib.suppress(Exception):
                        ray.kill(s.actor)


__all__ = ["HostActor", "RayExecutor"]
