import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# Reproducible property tests: the same examples on every machine, no deadline on a shared CPU.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
# The CPU's cores shared among pytest-xdist's workers (scripts/test.sh runs one per core): no oversubscription.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // WORKERS))
# The files that took longest on a fresh 2-core clone (`--durations`, compile caches cold), slowest first. xdist hands
# whole files out in collection order (scripts/test.sh: --no-loadscope-reorder; by default it puts the files with most
# tests first), so these start first and no long file is left running alone at the end.
SLOW_FILES = ("test_gpu_script.py", "test_sweep.py", "test_checks.py", "test_softcap.py", "test_executors.py",
              "test_sinks.py", "test_checkpoints.py", "test_sink_logit.py", "test_results_files.py", "test_sweep_hf.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES)))  # stable: each file keeps its order


@pytest.fixture
def one_thread():
    """For tiny tensors a second thread only adds synchronisation, which is costly on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
