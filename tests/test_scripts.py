"""The README's two commands: the main one installs what a sweep needs and writes a new run of its own."""
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_main_command_installs_no_test_extras():
    main = (ROOT / "scripts" / "main.sh").read_text()
    setup_calls = re.findall(r"bash scripts/setup\.sh(.*)", main)
    assert setup_calls == [""], "main.sh must call setup.sh with no extras"
    assert "bash scripts/setup.sh test" in (ROOT / "scripts" / "test.sh").read_text()
    # without an argument setup.sh installs "." -- the project's own dependencies, nothing else
    assert 'python -m pip install --quiet -e ".${EXTRAS:+[$EXTRAS]}"' in (ROOT / "scripts" / "setup.sh").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    for heavy in ("ray", "submitit", "pytest", "hypothesis", "ruff"):
        assert not re.search(rf"\b{heavy}\b", base), heavy
    assert any("ray" in d for d in project["optional-dependencies"]["test"])


def test_main_command_writes_a_new_run_folder_and_never_a_committed_file():
    main = (ROOT / "scripts" / "main.sh").read_text()
    assert "--resume" not in main
    outs = re.findall(r"--out (\S+)", main)
    assert outs and all(o.startswith('"$run') for o in outs), outs
    assert re.search(r"run=results/runs/quick-\$\(date", main)
    assert "results/runs/" in (ROOT / ".gitignore").read_text().splitlines()
