"""Where a sweep's work runs: in this process (``local``), on a Ray cluster (``ray``) or as Slurm jobs (``slurm``).

We schedule nothing ourselves: Ray and Slurm (through submitit, as xformers' benchmark suite did)
place the work; this module only feeds them and collects what comes back.

The work arrives as a :class:`Workload` of *chains*: sequences of tasks that run in order on one
*host* -- an object built on the measuring machine by ``make_host()`` (for cost sweeps a
``harness.sweep.CellMeasurer``: one isolated ``harness.worker`` process with its time and memory
limits). A chain decides its next task from the results so far (a sweep's configuration skips
longer lengths after an oom), so it runs on one host; different chains run concurrently.
Every result (a *payload*) comes back to the driver, which alone writes the results file: resume,
dedup and the row schema are the same wherever a task ran.

- ``local``: one host in this process's machine, the chains one after another.
- ``ray``: one Ray actor per slot (``num_gpus=1`` for CUDA work, else one CPU), each holding a host,
  so imports and compiled kernels are paid once per slot as they are locally. A lost actor (its
  worker or node died, or it stopped answering past the task's deadline) is replaced and the task
  retried once; a second loss is recorded as a failure. Nothing waits without a deadline.
- ``slurm``: one submitit job per chain (a job array, ``--max-concurrency`` at a time). A job writes
  each payload as a JSON line to its own file in the submission folder; the driver tails those
  files, appends the rows, and keeps the job ids in ``OUT.jobs.json`` so a sweep can be left
  (``--detach``, Ctrl-C, a closed terminal) and collected later with ``--resume``.
"""
from __future__ import annotations

import collections
import contextlib
import importlib
import json
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

EXECUTORS = ("local", "ray", "slurm")
EXTRAS = {"ray": ("ray", "ray"), "slurm": ("submitit", "slurm")}  # executor -> (module, pip extra)
SLURM_CLUSTERS = ("slurm", "local")  # local: submitit's LocalExecutor, the same code path on this machine
RAY_RETRIES = 1  # a task whose actor is lost runs once more on a fresh actor before it is recorded as failed
POLL_S = 0.2


@dataclass(frozen=True)
class ExecutorConfig:
    """Where the work runs; ``None`` fields take the defaults described on each option."""

    kind: str = "local"
    ray_address: str | None = None  # None: $RAY_ADDRESS if set, else start a Ray instance on this machine
    max_concurrency: int | None = None  # hosts at once; None: ray, one per GPU (CUDA) or CPU of the cluster; slurm, all
    slurm_partition: str | None = None
    slurm_time: int | None = None  # minutes per job; None: enough for the longest chain at its time limit
    slurm_gpus: int | None = None  # GPUs per job; None: 1 for CUDA work, else 0
    slurm_folder: str | None = None  # submitit's folder (shared with the nodes); None: OUT.slurm/ next to the results
    slurm_cluster: str = "slurm"
    detach: bool = False  # slurm: submit, record the jobs, return; --resume collects them

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ValueError(f"unknown executor {self.kind!r}; valid: {', '.join(EXECUTORS)}")
        if self.slurm_cluster not in SLURM_CLUSTERS:
            raise ValueError(f"unknown slurm_cluster {self.slurm_cluster!r}; valid: {', '.join(SLURM_CLUSTERS)}")
        if self.kind == "local" and (self.max_concurrency or 1) > 1:
            raise ValueError("--max-concurrency needs --executor ray or slurm: the local executor measures one cell "
                             "at a time so that cells do not contend for the machine")
        if self.detach and self.kind != "slurm":
            raise ValueError("--detach needs --executor slurm (Ray and local sweeps end with the command)")


EXECUTOR_KEYS = ("executor", "ray_address", "max_concurrency", "slurm_partition", "slurm_time", "slurm_gpus",
                 "slurm_folder", "slurm_cluster", "detach")  # option / sweep-file names; "executor" is ``kind``


def config_from(options: dict[str, Any]) -> ExecutorConfig:
    """An ExecutorConfig from option names (EXECUTOR_KEYS); absent or None values keep their defaults."""
    given = {("kind" if k == "executor" else k): v for k, v in options.items() if k in EXECUTOR_KEYS and v is not None}
    return ExecutorConfig(**given)


def executor_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--executor`` family of click options (values reach the command as keyword arguments named as EXECUTOR_KEYS)."""
    import click

    options = [
        click.option("--executor", type=click.Choice(EXECUTORS),
                     help="Where the work runs: local (default: this machine, one cell at a time), ray or slurm "
                          "(docs/scaling.md)."),
        click.option("--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else a new local instance)."),
        click.option("--max-concurrency", type=int,
                     help="Hosts at once: Ray actors (default one per GPU, or CPU, of the cluster) or Slurm jobs."),
        click.option("--slurm-partition", help="Slurm partition of the jobs."),
        click.option("--slurm-time", type=int, help="Minutes per Slurm job (default: enough for the longest chain)."),
        click.option("--slurm-gpus", type=int, help="GPUs per Slurm job (default 1 for --device cuda, else 0)."),
        click.option("--slurm-folder", help="submitit folder, shared with the nodes (default: OUT.slurm/ next to --out)."),
        click.option("--slurm-cluster", type=click.Choice(SLURM_CLUSTERS),
                     help="slurm (default) or local: submitit's local executor, the same jobs on this machine."),
        click.option("--detach", is_flag=True, default=None,
                     help="Slurm: submit, note the jobs in OUT.jobs.json and return; --resume collects the results."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def require(kind: str) -> Any:
    """The engine module of ``kind``, or ValueError with the one line that says how to install it."""
    if kind not in EXTRAS:
        return None
    module, extra = EXTRAS[kind]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"--executor {kind} needs {module}: pip install 'attn-bench[{extra}]'") from None


# -- the work ------------------------------------------------------------------------------------

class Host(Protocol):
    """Lives on the measuring machine; ``run`` never raises for a task's own failure (that is a payload)."""

    def run(self, task: Any) -> Any: ...

    def close(self) -> None: ...


class Chain(Protocol):
    """Tasks in order. ``next`` gives (task, None) to run, (task, payload) for a task it settles itself
    (a skipped cell), or None when done; ``finish`` tells it each task's payload."""

    tasks: list[Any]  # every task it may run

    def next(self) -> tuple[Any, Any] | None: ...

    def finish(self, task: Any, payload: Any) -> None: ...


@dataclass
class Workload:
    """Everything an executor needs; the callables must pickle by reference (they travel to the cluster)."""

    chains: list[Chain]
    make_host: Callable[[], Host]
    key: Callable[[Any], str]  # a task's identity, as the results store knows it
    lost: Callable[[Any, str], Any]  # the payload of a task whose host was lost, given why
    gpus: int = 0  # per host
    task_timeout_s: float = 3600.0  # past this without an answer a Ray host counts as lost
    job_minutes: int = 60  # default Slurm time per chain


Record = Callable[[Any, Any], None]


def drive(chain: Chain, host: Host, emit: Record, started: Callable[[Any], None] | None = None) -> None:
    """Run one chain to its end on ``host``, emitting every (task, payload)."""
    while (step := chain.next()) is not None:
        task, payload = step
        if payload is None:
            if started:
                started(task)
            payload = host.run(task)
        chain.finish(task, payload)
        emit(task, payload)


# -- local ---------------------------------------------------------------------------------------

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


# -- ray -----------------------------------------------------------------------------------------

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


# -- slurm ---------------------------------------------------------------------------------------

def sidecar_path(out: Path) -> Path:
    """Where a Slurm sweep keeps its job ids: ``OUT.jobs.json`` next to the results file."""
    return out.with_name(out.name + ".jobs.json")


def pending_jobs(out: Path) -> int:
    """Submitted Slurm jobs of ``out`` that no driver has collected yet."""
    path = sidecar_path(out)
    if not path.exists():
        return 0
    with contextlib.suppress(OSError, ValueError):
        return len(json.loads(path.read_text()).get("jobs", {}))
    return 0


def run_job(chains: list[Chain], make_host: Callable[[], Host], key: Callable[[Any], str], rows_path: str) -> int:
    """The body of one Slurm job: run the chains on one host, one JSON line [key, payload] per task."""
    n = 0
    host = make_host()
    with open(rows_path, "a") as f:

        def emit(task: Any, payload: Any) -> None:
            nonlocal n
            f.write(json.dumps([key(task), payload], default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
            n += 1

        try:
            for chain in chains:
                drive(chain, host, emit)
        finally:
            host.close()
    return n


@dataclass
class _Job:
    token: str
    job_id: str
    keys: list[str]
    handle: Any = None
    offset: int = 0  # bytes of its rows file already recorded
    seen: set[str] = field(default_factory=set)
    unknown_since: float | None = None


class SlurmExecutor:
    """One submitit job per chain; rows come back through per-job files the driver tails."""

    kind = "slurm"
    UNKNOWN_GRACE_S = 600.0  # a job Slurm has forgotten (purged from sacct) is given up after this long

    def __init__(self, config: ExecutorConfig, out: Path, echo: Callable[[str], None] = print):
        self.config, self.out, self.echo = config, out, echo
        self.sidecar = sidecar_path(out)
        self.folder = Path(config.slurm_folder) if config.slurm_folder else out.with_name(out.name + ".slurm")
        self.jobs: dict[str, _Job] = {}
        self.tasks: dict[str, Any] = {}  # every task of the sweep by key: what earlier jobs' rows belong to
        self.poll_s = 1.0 if config.slurm_cluster == "local" else 10.0

    # bookkeeping
    def _save(self) -> None:
        """The jobs not yet collected (written atomically); no file once every job is collected."""
        if not self.jobs:
            self.sidecar.unlink(missing_ok=True)
            return
        data = {"folder": str(self.folder.resolve()), "cluster": self.config.slurm_cluster,
                "jobs": {t: {"job_id": j.job_id, "keys": j.keys} for t, j in self.jobs.items()}}
        tmp = self.sidecar.with_name(self.sidecar.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.sidecar)

    def _rows_path(self, token: str) -> Path:
        return self.folder / f"{token}.rows.jsonl"

    def _handle(self, job: _Job, cluster: str) -> Any:
        submitit = require("slurm")
        cls = submitit.LocalJob if cluster == "local" else submitit.SlurmJob
        return cls(folder=self.folder, job_id=job.job_id)

    def _alive(self, job: _Job) -> bool:
        h = job.handle
        if h.paths.result_pickle.exists():
            return False
        if self.config.slurm_cluster == "local":
            proc = getattr(h, "_process", None)
            if proc is not None:
                return proc.poll() is None
            import psutil

            with contextlib.suppress(psutil.Error, ValueError):
                return psutil.Process(int(job.job_id)).status() != psutil.STATUS_ZOMBIE
            return False
        if h.done():
            return False
        if h.state.upper() == "UNKNOWN":
            job.unknown_since = job.unknown_since or time.monotonic()
            return time.monotonic() - job.unknown_since < self.UNKNOWN_GRACE_S
        job.unknown_since = None
        return True

    def _drain(self, job: _Job, tasks: dict[str, Any], record: Record) -> None:
        """Record the complete lines the job has written since the last look."""
        path = self._rows_path(job.token)
        if not path.exists():
            return
        with path.open("rb") as f:
            f.seek(job.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        job.offset += end
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                key, payload = json.loads(line)
                job.seen.add(key)
                if key in tasks:
                    record(tasks[key], payload)

    def _close(self, job: _Job, tasks: dict[str, Any], record: Record, lost: Callable[[Any, str], Any]) -> None:
        """A finished job: its last rows, then a failure row for each task it never reported."""
        self._drain(job, tasks, record)
        missing = [k for k in job.keys if k in tasks and k not in job.seen]
        if missing:
            from harness.messages import one_line

            h = job.handle
            err = h.exception() if h.paths.result_pickle.exists() else None  # without a result it would wait forever
            why = f"slurm job {job.job_id} ended before this cell finished"
            why += f": {one_line(err, 300)}" if err else f" (state {h.state}; log {h.paths.stderr}: {_tail(h.paths.stderr)})"
            for k in missing:
                record(tasks[k], lost(tasks[k], why))
        del self.jobs[job.token]
        self._save()

    # the executor
    def recover(self, tasks: dict[str, Any], record: Record) -> set[str]:
        """Collect what jobs of an earlier run wrote; returns the keys that jobs still running will deliver."""
        self.tasks = dict(tasks)
        if not self.sidecar.exists():
            return set()
        data = json.loads(self.sidecar.read_text())
        cluster = data.get("cluster", self.config.slurm_cluster)
        if cluster != self.config.slurm_cluster:
            raise ValueError(f"{self.sidecar} lists jobs of slurm_cluster {cluster!r}; resume with --slurm-cluster {cluster}")
        self.folder = Path(data["folder"])
        for token, entry in data["jobs"].items():
            job = _Job(token, entry["job_id"], entry["keys"])
            job.handle = self._handle(job, cluster)
            self.jobs[token] = job
        running: set[str] = set()
        for job in list(self.jobs.values()):
            if self._alive(job):
                self._drain(job, tasks, record)
                running.update(job.keys)
            else:  # tasks it never reported are measured again by this run
                self._drain(job, tasks, record)
                del self.jobs[job.token]
        self._save()
        if self.jobs:
            self.echo(f"slurm: {len(self.jobs)} jobs of an earlier run still running; collecting them")
        return running

    def _submit(self, work: Workload) -> None:
        submitit = require("slurm")
        cfg = self.config
        self.folder.mkdir(parents=True, exist_ok=True)
        executor = submitit.AutoExecutor(folder=self.folder, cluster=cfg.slurm_cluster)
        gpus = cfg.slurm_gpus if cfg.slurm_gpus is not None else work.gpus
        params: dict[str, Any] = {"name": "attn-bench", "timeout_min": cfg.slurm_time or work.job_minutes,
                                  "nodes": 1, "tasks_per_node": 1, "gpus_per_node": gpus}
        if cfg.slurm_partition:
            params["slurm_partition"] = cfg.slurm_partition
        if cfg.max_concurrency:
            params["slurm_array_parallelism"] = cfg.max_concurrency
        executor.update_parameters(**params)
        tokens, handles = [], []
        with executor.batch():
            for chain in work.chains:
                token = uuid.uuid4().hex[:12]
                tokens.append((token, [work.key(t) for t in chain.tasks]))
                handles.append(executor.submit(run_job, [chain], work.make_host, work.key, str(self._rows_path(token))))
        for (token, keys), handle in zip(tokens, handles, strict=True):
            self.jobs[token] = _Job(token, handle.job_id, keys, handle)
        self._save()
        where = f"partition {cfg.slurm_partition}" if cfg.slurm_partition else "the default partition"
        self.echo(f"slurm: submitted {len(handles)} jobs ({params['timeout_min']} min, {gpus} GPU each, {where}); "
                  f"job ids in {self.sidecar}, logs in {self.folder}")

    def run(self, work: Workload, record: Record, started: Callable[[Any], None] | None = None) -> None:
        tasks = {**self.tasks, **{work.key(t): t for c in work.chains for t in c.tasks}}
        if work.chains:
            self._submit(work)
        if self.config.detach:
            if self.jobs:
                self.echo(f"slurm: detached; `attn-bench sweep ... --out {self.out} --resume` collects the rows")
            return
        try:
            while self.jobs:
                for job in list(self.jobs.values()):
                    if self._alive(job):
                        self._drain(job, tasks, record)
                    else:
                        self._close(job, tasks, record, work.lost)
                if self.jobs:
                    time.sleep(self.poll_s)
        except KeyboardInterrupt:
            self.echo(f"slurm: {len(self.jobs)} jobs keep running; `--resume` with the same --out collects them")
            raise


def _tail(path: Path, chars: int = 200) -> str:
    from harness.messages import one_line

    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4 * chars))
            return one_line(f.read().decode(errors="replace")[-chars:], chars)
    except OSError:
        return "(no log)"


def job_minutes(chain_lengths: list[int], time_limit_s: float) -> int:
    """Slurm time for the longest chain at its per-task time limit, plus start-up."""
    return int(math.ceil(max(chain_lengths, default=1) * time_limit_s / 60)) + 10


def make_executor(config: ExecutorConfig, out: Path, echo: Callable[[str], None] = print
                  ) -> LocalExecutor | RayExecutor | SlurmExecutor:
    """The executor ``config`` names (ValueError with the install line if its engine is missing)."""
    require(config.kind)
    if config.kind == "ray":
        return RayExecutor(config, echo)
    if config.kind == "slurm":
        return SlurmExecutor(config, out, echo)
    return LocalExecutor()


__all__ = [
    "EXECUTORS", "EXECUTOR_KEYS", "Chain", "ExecutorConfig", "Host", "HostActor", "LocalExecutor", "RayExecutor",
    "SlurmExecutor", "Workload", "config_from", "drive", "executor_options", "job_minutes", "make_executor", "pending_jobs",
    "require", "run_job", "sidecar_path",
]
