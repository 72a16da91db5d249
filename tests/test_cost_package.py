"""harness.cost is a package: its old flat paths still import for one release, with a DeprecationWarning."""
from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

OLD_PATHS = {  # old module -> (a name it exported, the module that defines it now)
    "harness.sweep": [("sweep_command", "harness.cost.command"), ("build_spec", "harness.cost.spec"),
                      ("CostChain", "harness.cost.sweep"), ("summary_tables", "harness.cost.summary"),
                      ("_fmt_len", "harness.cost.summary")],
    "harness.worker": [("Worker", "harness.cost.worker"), ("child_command", "harness.cost.worker")],
    "harness.timing": [("TimingConfig", "harness.cost.timing"), ("time_callable", "harness.cost.timing")],
    "harness.noise": [("assess", "harness.cost.noise"), ("least_noisy", "harness.cost.noise")],
    "harness.presets": [("PRESETS", "harness.cost.presets"), ("describe_presets", "harness.cost.presets")],
}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_path_still_imports_and_warns(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to harness\.cost"):
        module = importlib.import_module(old)
    for name, new in OLD_PATHS[old]:
        assert getattr(module, name) is getattr(importlib.import_module(new), name)
    assert set(module.__all__) <= set(dir(module))


def test_harness_cost_keeps_the_old_module_names_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import harness.cost as cost
        from harness.cost import cells
    for name in ("Cell", "build", "DTYPES", "KEY_FIELDS", "MODES", "SCOPES", "Measured", "Rewind", "attention_flops",
                 "op_flops", "model_flops", "linear_weights", "model_config", "json_normal", "train_factor"):
        assert getattr(cost, name) is getattr(cells, name)


def test_the_cost_package_imports_no_analysis_accuracy_or_cli():
    code = ("import sys, harness.cost.command, harness.cost.worker, harness.cost.noise\n"
            "bad = sorted(m for m in sys.modules if m.startswith(('harness.analysis', 'harness.accuracy', 'harness.cli')))\n"
            "old = sorted(m for m in sys.modules if m in ('harness.sweep', 'harness.worker', 'harness.timing',"
            " 'harness.noise', 'harness.presets'))\n"
            "print(bad + old)")
    out = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
