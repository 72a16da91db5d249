"""Accuracy harness: tasks (mqar, passkey, lm, fidelity, lengthgen), training, intervals, jobs, runner, cli, presets.
May import harness.results, harness.messages, harness.plugins, harness.environment, harness.memory,
harness.executors and attn; never harness.cost, harness.analysis or harness.cli."""
from harness.accuracy.common import Task, split_of
from harness.accuracy.lm import LM, LMConfig
from harness.accuracy.mqar import MQAR, MQARConfig
from harness.accuracy.passkey import Passkey, PasskeyConfig
from harness.accuracy.stats import Measure, mean_ci, summarize, wilson
from harness.accuracy.train import TrainConfig, train

__all__ = [
    "LM", "LMConfig", "MQAR", "MQARConfig", "Measure", "Passkey", "PasskeyConfig", "Task", "TrainConfig", "mean_ci",
    "split_of", "summarize", "train", "wilson",
]
