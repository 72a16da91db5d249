"""The accuracy tasks, one module each; importing this package registers the built-in ones, in the order below (the
order ``attn-bench list`` and a run's summary show them). A new task is one module here and one import line
below (or one file anywhere, imported: registering is all)."""
from harness.accuracy.tasks.base import AccuracyTask, BuiltOnTask, CheckpointTask, Metric, TaskOption, TrainedTask
from harness.accuracy.tasks.registry import (
    cell_columns,
    checkpoint_task_names,
    declared,
    declared_metric,
    get_checkpoint_task,
    get_task,
    listing,
    make_task,
    metric_of,
    register_task,
    table,
    task_names,
    task_options,
    trained_task,
    trained_task_names,
)

# isort: off
from harness.accuracy.tasks import mqar  # noqa: F401
from harness.accuracy.tasks import passkey  # noqa: F401
from harness.accuracy.tasks import ruler  # noqa: F401
from harness.accuracy.tasks import lm  # noqa: F401
from harness.accuracy.tasks import fidelity  # noqa: F401
from harness.accuracy.tasks import selection  # noqa: F401
from harness.accuracy.tasks import lengthgen  # noqa: F401
from harness.accuracy.tasks import continuation  # noqa: F401
# isort: on

__all__ = ["AccuracyTask", "BuiltOnTask", "CheckpointTask", "Metric", "TaskOption", "TrainedTask", "cell_columns",
           "checkpoint_task_names", "declared", "declared_metric", "get_checkpoint_task", "get_task", "listing",
           "make_task", "metric_of", "register_task", "table", "task_names", "task_options", "trained_task",
           "trained_task_names"]
