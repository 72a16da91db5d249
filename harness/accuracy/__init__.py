"""Accuracy harness: tasks (a registry, harness/accuracy/tasks/: mqar, passkey, ruler, lm, fidelity, lengthgen),
training, intervals, jobs, runner, cli, presets, checkpoint evaluations.
May import harness.results, harness.messages, harness.plugins, harness.environment, harness.memory,
harness.executors and attn; never harness.cost, harness.analysis or harness.cli."""
from harness.accuracy.common import Task, split_of
from harness.accuracy.stats import Measure, mean_ci, summarize, wilson
from harness.accuracy.tasks import get_task, register_task, task_names
from harness.accuracy.train import TrainConfig, train

__all__ = ["Measure", "Task", "TrainConfig", "get_task", "mean_ci", "register_task", "split_of", "summarize",
           "task_names", "train", "wilson"]
