"""The analysis half of the harness: results files -> frames, derived numbers, figures, the report and ``compare``.
It may import harness.results, harness.messages and attn (labels, registered defaults) only; never harness.cost,
harness.accuracy, harness.executors or harness.cli: analysis reads results, it does not measure."""
