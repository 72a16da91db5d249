"""A pytest plugin for scripts/gpu_check.sh (``-p pytest_unrun``): a run stopped at its cap by SIGINT
still ends with pytest's summary, but that names only the cases that reported; this adds every collected
case that never finished, split into those cut while running and those never started. Works with and
without pytest-xdist (under xdist the controller learns the cases from the workers' collection).
"""
from __future__ import annotations

from typing import Any

import pytest


class Unrun:
    def __init__(self) -> None:
        self.collected: list[str] = []
        self.started: set[str] = set()
        self.finished: set[str] = set()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = [item.nodeid for item in session.items]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.collected = self.collected or list(ids)  # every worker collects the same cases

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.started.add(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # a case is done once its call reported, or once setup skipped or failed it (no call follows), or
        # once xdist reported its worker crashed under it (``when`` is then "???")
        if report.when not in ("setup", "teardown") or (report.when == "setup" and report.outcome != "passed"):
            self.finished.add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        if not self.collected:  # a section, as below: gpu_check.sh copies its title line into its log
            tr.section("not run: every case, the cut came before collection finished")
            return
        unrun = [i for i in self.collected if i not in self.finished]
        if not unrun:
            return
        tr.section(f"not run: {len(unrun)} of {len(self.collected)} cases")
        for nodeid in unrun:
            tr.write_line(f"{'CUT' if nodeid in self.started else 'NOT STARTED'} {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist), never an xdist worker
        config.pluginmanager.register(Unrun(), "gpu_check_unrun")
