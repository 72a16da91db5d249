"""Accuracy harness: what each attention variant and position method can still do as length grows.

One file per task (``mqar``, ``passkey``, ``lm``, ``fidelity``, ``lengthgen``); ``train`` is the
training loop, ``stats`` the intervals, ``runner`` turns a job into rows, ``cli`` is
``attn-bench accuracy``, ``presets`` the named runs.
"""
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
