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


@pytest.fixture
def one_thread():
    """For tiny tensors a second thread only adds synchronisation, which is costly on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
