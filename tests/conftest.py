import os

import torch
from hypothesis import HealthCheck, settings

# Reproducible property tests: the same examples on every machine, no deadline on a shared CPU.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
