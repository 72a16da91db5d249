"""scripts/gpu_check.sh on a machine without a GPU: runs end to end, validating the gpu sweep grid."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU fallback path")
def test_gpu_check_script_falls_back_cleanly_on_cpu(tmp_path):
    out = tmp_path / "gpu"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", str(out), "--lengths", "1K"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not (out / "gpu.jsonl").exists(), "a dry run measures nothing and writes no results"
    dry = (out / "gpu_dry_run.txt").read_text()
    for variant in ["full", "sliding_window", "block_sparse", "linear"]:
        assert variant in dry
    assert "passed" in (out / "equivalence.txt").read_text()
