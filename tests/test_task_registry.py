"""The accuracy task registry: a new task is one file and one import line, and then it runs through
``attn-bench accuracy`` (its option, its column, its summary) and ``attn-bench list`` shows it."""
import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.accuracy import tasks
from harness.accuracy.runner import CELL_FIELDS
from harness.accuracy.tasks import BuiltOnTask, TrainedTask, register_task
from harness.analysis.frontier import points

ROOT = Path(__file__).resolve().parents[1]
TASKS_DIR = ROOT / "harness" / "accuracy" / "tasks"
INFRA = {"__init__", "base", "registry"}  # the package's own modules; every other one is a task

TOY = '''
"""A toy task: repeat the first token at the end (one file; importing it registers it)."""
from dataclasses import dataclass

import click
import torch

from harness.accuracy.common import IGNORE, predictions, rng_for
from harness.accuracy.stats import accuracy
from harness.accuracy.prefill import generate_answers
from harness.accuracy.tasks import CheckpointTask, Metric, TaskOption, TrainedTask, register_task


@dataclass(frozen=True)
class ToyConfig:
    vocab_size: int = 8
    eval_examples: int = 16


class OnCheckpoint(CheckpointTask):
    """On a pretrained checkpoint: the same sequences in its tokens, the first token asked back by greedy decoding."""

    default = True
    prompts = True

    @classmethod
    def cells(cls, config, lens, data):
        return [({"eval_len": L, "toy_offset": L - 1}, ("accuracy",)) for L in lens]

    @classmethod
    def eval_id(cls, ckpt, config, data):
        return f"toy-{config.vocab_size}"

    @classmethod
    def evaluate(cls, model, ckpt, config, data, cell, device, cache):
        x = Toy(config).batch(99, config.eval_examples, cell["eval_len"] - 1)[0] + 48  # digits in a byte tokenizer
        prompts = [[ckpt.tokens.boundary, *row.tolist()] for row in x]
        said = generate_answers(model, prompts, 1, ckpt.tokens.decode, ckpt.tokens.boundary, cache)
        hits = {arm: [a[:1] == chr(p[1]) for a, p in zip(out, prompts)] for arm, out in said.items()}
        return {arm: {"accuracy": accuracy(sum(h), len(h), outcomes=h)} for arm, h in hits.items()}


@register_task("toy", config=ToyConfig)
class Toy(TrainedTask):
    """Repeat the first token at the end of the sequence."""

    pretrained = OnCheckpoint  # how it runs on a checkpoint (--hf-model): the same file, no edit anywhere else
    main_metric = "accuracy"
    declares = (Metric("accuracy", "proportion", ranks=True),)  # what its rows say: the frontier ranks by it
    columns = ("toy_offset",)
    options = (TaskOption("toy_vocab", "vocab_size", "vocabulary of the toy.", click.IntRange(min=4)),)

    def __init__(self, config):
        self.config = config
        self.vocab_size = config.vocab_size

    def check(self, train_len, eval_lens):
        if min([train_len, *eval_lens]) < 2:
            raise ValueError("toy: lengths must be >= 2")

    def batch(self, seed, n, length):
        x = torch.from_numpy(rng_for(seed, length).integers(0, self.vocab_size, (n, length)))
        y = torch.full_like(x, IGNORE)
        y[:, -1] = x[:, 0]
        return x, y

    def train_batch(self, seed, step, batch_size, length):
        return self.batch(seed * 1000 + step, batch_size, length)

    def cells(self, train_len, eval_lens):
        return [{"eval_len": L, "toy_offset": L - 1} for L in eval_lens]

    def metrics(self, cell, train_len):
        return ("accuracy",)

    def evaluate(self, model, cell, train_len):
        x, y = self.batch(99, self.config.eval_examples, cell["eval_len"])
        right = int((predictions(model, x, 64)[:, -1] == y[:, -1]).sum())
        return {"accuracy": accuracy(right, len(x))}

    def sample_inputs(self, n, length):
        return self.batch(98, n, length)[0]
'''

DRIVER = '''
import sys

import toy_task  # noqa: F401  -- the one import line (harness/accuracy/tasks/__init__.py holds the built-in ones)
from harness.cli import main

rc = main(sys.argv[1:])
print("---LIST---", flush=True)
rc_list = main(["list", "--json"])
print("---TEXT---", flush=True)
rc_text = main(["list"])
sys.exit(rc or rc_list or rc_text)
'''


def test_a_toy_task_in_one_file_runs_through_accuracy_and_is_listed(tmp_path):
    (tmp_path / "toy_task.py").write_text(TOY)
    (tmp_path / "driver.py").write_text(DRIVER)
    out = tmp_path / "toy.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    args = ["accuracy", "--task", "toy", "--variant", "full", "--position", "rope", "--train-len", "8",
            "--eval-lens", "8,16", "--steps", "3", "--batch-size", "4", "--toy-vocab", "6", "--threads", "1",
            "--no-progress", "--out", str(out)]
    r = subprocess.run([sys.executable, str(tmp_path / "driver.py"), *args], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r_["eval_len"] for r_ in rows) == [8, 16]
    for row in rows:  # the task's column, its metric, its option (--toy-vocab -> vocab_size), the runner's columns
        assert row["task"] == "toy" and row["metric"] == "accuracy" and row["status"] == "ok"
        assert row["toy_offset"] == row["eval_len"] - 1 and row["task_params"] == {}
        assert 0 <= row["value"] <= 1 and row["n"] == 16 and row["stage"] == "zero_shot"
    accuracy_out, _, listed = r.stdout.partition("---LIST---")
    assert "toy: accuracy by evaluation length (mean over seeds)" in accuracy_out  # its summary table
    as_json, _, text = listed.partition("---TEXT---")
    toy = {t["name"]: t for t in json.loads(as_json)["tasks"]}["toy"]
    assert toy["params"] == {"vocab_size": 8, "eval_examples": 16} and toy["main_metric"] == "accuracy"
    assert toy["options"] == ["--toy-vocab"] and toy["columns"] == ["toy_offset"] and toy["source"] == "toy_task"
    assert "  toy              Repeat the first token at the end of the sequence." in text
    assert "    from toy_task" in text


def test_the_same_task_file_runs_on_a_pretrained_checkpoint(tmp_path):
    """The toy file's checkpoint face: ``--hf-model`` on a tiny random Llama (bytes as tokens) runs it with its option,
    its column and its metric, through the plain arm and through press arms sharing one prefill (the oracle at half the
    cache, and kvpress's KNorm where kvpress is installed). Its rows say what the task declares of its metric, so the
    frontier ranks them without the task's code (this process never imports the file)."""
    from transformers import AutoModelForCausalLM

    from attn import hf

    config = hf.tiny_config("llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "ckpt")
    (tmp_path / "toy_task.py").write_text(TOY)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    presses = ["--press", "none", "--press", "oracle", *(["--press", "knorm"] if _kvpress() else []), "--budget", "1/2"]
    for out, extra in ((tmp_path / "plain.jsonl", []), (tmp_path / "pressed.jsonl", presses)):
        args = ["accuracy", "--hf-model", str(tmp_path / "ckpt"), "--task", "toy", "--eval-lens", "32,48",
                "--toy-vocab", "6", "--threads", "1", "--out", str(out), *extra]
        r = subprocess.run([sys.executable, str(tmp_path / "driver.py"), *args], env=env, capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-3000:]
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        arms = extra.count("--press") or 1
        assert sorted(r_["eval_len"] for r_ in rows) == [32] * arms + [48] * arms
        for row in rows:
            assert row["task"] == "toy" and row["status"] == "ok" and row["stage"] == "pretrained", row
            assert row["toy_offset"] == row["eval_len"] - 1 and row["eval_id"] == "toy-6" and row["n"] == 16
            assert row["dtype"] == "float32" and (row.get("press_spec") is None) == (not extra)
            assert (row["metric_kind"], row["metric_role"], row["task_label"]) == ("proportion", "ranked", "toy")
    assert "toy" not in tasks.task_names()  # the rows alone: the frontier reads their declaration
    pts = points(rows)
    assert set(pts["task"]) == {"toy"} and {"full", "oracle"} <= set(pts["method"]) and set(pts["n"]) == {16}


def _kvpress() -> bool:
    try:
        import kvpress  # noqa: F401
    except ImportError:
        return False
    return True


def test_list_shows_every_built_in_task(capsys):
    from harness.cli import main

    assert main(["list", "--json"]) == 0
    listed = [t["name"] for t in json.loads(capsys.readouterr().out)["tasks"]]
    assert listed == ["mqar", "passkey", "ruler", "lm", "fidelity", "selection", "lengthgen", "continuation"] == \
        tasks.task_names()
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert "Accuracy tasks" in text and "  lengthgen " in text and "main metric:  bpb" in text


def test_each_task_module_registers_one_task_and_is_imported_by_one_line():
    """One file per task: each module of harness/accuracy/tasks/ (the package's own and a task's ``<task>_*.py``
    companions aside: ruler_data.py, RULER's generators) registers exactly one task, and the package imports each with
    a line of its own."""
    registered = {tasks.get_task(n).__module__.rpartition(".")[2]: n for n in tasks.task_names()}
    modules = sorted(p.stem for p in TASKS_DIR.glob("*.py")
                     if p.stem not in INFRA and not any(p.stem.startswith(f"{t}_") for t in registered))
    assert sorted(registered) == modules
    for m in modules:
        assert (TASKS_DIR / f"{m}.py").read_text().count("@register_task(") == 1, m
    init = ast.parse((TASKS_DIR / "__init__.py").read_text())
    lines = [n for n in init.body if isinstance(n, ast.ImportFrom) and n.module == "harness.accuracy.tasks"]
    assert [[a.name for a in n.names] for n in lines] == [[m] for m in registered]


def test_the_runner_keys_cells_by_every_task_s_columns():
    assert set(CELL_FIELDS) == {"stage", "eval_id", *(c for n in tasks.task_names() for c in tasks.get_task(n).columns)}
    assert set(CELL_FIELDS) == {"stage", "num_pairs", "gap", "depth", "scored_bytes", "source", "layer", "head",
                                "subtask", "eval_id"}  # the built-in tasks' identity columns (selection adds head)


def test_shared_options_are_one_option_naming_every_task():
    opts = tasks.task_options()
    assert opts["eval_examples"][1] == ("mqar", "passkey", "ruler", "continuation")
    assert opts["subtasks"][0].decl == "--subtask" and opts["subtasks"][1] == ("ruler",)
    from harness.accuracy.cli import accuracy_command

    helps = {p.name: p.help for p in accuracy_command.params}
    assert helps["eval_examples"] == "mqar/passkey/ruler/continuation: test examples per cell."
    assert helps["depths"] == "passkey: comma-separated depths in [0, 1]."


def test_the_registry_refuses_what_the_harness_could_not_run():
    @dataclass
    class Config:
        n: int = 1

    with pytest.raises(ValueError, match="'mqar' is already registered"):
        register_task("mqar", config=Config)(type("Again", (TrainedTask,), {"main_metric": "accuracy"}))
    with pytest.raises(TypeError, match="takes its config dataclass"):
        register_task("no_config")(type("NoConfig", (TrainedTask,), {"main_metric": "accuracy"}))
    with pytest.raises(TypeError, match="a BuiltOnTask none"):
        register_task("on_base", config=Config)(type("OnBase", (BuiltOnTask,), {}))
    with pytest.raises(TypeError, match="must subclass TrainedTask or BuiltOnTask"):
        register_task("plain", config=Config)(type("Plain", (), {}))
    with pytest.raises(TypeError, match="declare its main_metric"):
        register_task("no_metric", config=Config)(type("NoMetric", (TrainedTask,), {}))
    assert "no_config" not in tasks.task_names() and "on_base" not in tasks.task_names()
    with pytest.raises(ValueError, match="unknown task 'nope'; valid: mqar, passkey, ruler, lm, fidelity, selection, lengthgen"):
        tasks.get_task("nope")
    with pytest.raises(ValueError, match="mqar: unknown task parameter"):
        tasks.make_task("mqar", {"bogus": 1})


def test_the_figures_a_task_declares_are_the_ones_analysis_draws_its_rows_in():
    """Analysis keys figures by the task names rows carry (it may not import the accuracy harness): both sides agree."""
    from harness.analysis import figures as P

    names = [f.name for f in P.FIGURES]
    own = P.own_figures()
    assert own == {"mqar": "mqar", "ruler": "ruler", "selection": "selection"}
    for name in tasks.task_names():
        cls = tasks.get_task(name)
        assert set(cls.figures) <= set(names), (name, cls.figures)
        assert {f.name for f in P.FIGURES if name in f.tasks} <= set(cls.figures), name
        if cls.trains:  # drawn by the per-length figure unless a figure of its own draws it instead
            assert ("accuracy" in cls.figures) == (name not in own), name
