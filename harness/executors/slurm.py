"""The ``slurm`` executor: one submitit job per chain; jobs write their rows to files the driver tails, and
``OUT.jobs.json`` (the sidecar) keeps the job ids so a detached or interrupted sweep is collected by ``--resume``."""
from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.executors.base import Chain, Host, Record, Workload, drive
from harness.executors.config import ExecutorConfig, require


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

    def __init__(self, config: ExecutorConfig, out: Path, echo: Callable[[str], None] = print, command: str = "sweep"):
        self.config, self.out, self.echo = config, out, echo
        self.command = command  # the attn-bench subcommand whose --resume collects detached jobs
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
                self.echo(f"slurm: detached; `attn-bench {self.command} ... --out {self.out} --resume` collects the rows")
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


__all__ = ["SlurmExecutor", "pending_jobs", "run_job", "sidecar_path"]
