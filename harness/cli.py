"""The ``attn-bench`` command line. Subcommands load lazily so ``attn-bench list`` stays fast.

Bad input ends with one line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import click

from harness.messages import one_error_line
from harness.plugins import load_plugins, warn_plugin

COMMANDS = {
    "list": "harness.cli:list_command",
    "check": "harness.check:check_command",
    "sweep": "harness.cost.command:sweep_command",
    "repro": "harness.cost.command:repro_cli",
    "accuracy": "harness.accuracy.cli:accuracy_command",
    "plot": "harness.analysis.figures:plot_command",
    "report": "harness.analysis.report:report_command",
    "compare": "harness.analysis.compare:compare_command",
    "stale": "harness.analysis.freshness:stale_command",
    "frontier": "harness.analysis.frontier:frontier_command",
    "probe": "harness.analysis.probe:probe_command",
    "answers": "harness.analysis.questions:answers_command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, _, attr = COMMANDS[name].partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except Exception as e:  # noqa: BLE001 -- a broken optional install raises anything: costs this command only
            reason = f"{type(e).__name__}: {one_error_line(e)}"

            @click.command(name, help=f"(unavailable: {reason})")
            def unavailable() -> None:
                raise click.UsageError(f"'{name}' is not available in this build: {reason}")
            return unavailable


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attn-bench")
def cli() -> None:
    """Benchmark long-context attention variants: speed, memory and accuracy across lengths."""


def _fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "-"


@click.command("list")
@click.option("--plugin", "plugins", multiple=True, help="File or module registering extra variants.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_command(plugins: tuple[str, ...], as_json: bool) -> None:
    """List attention variants, position methods, accuracy tasks, checkpoints, checkpoint evaluations and presets."""
    import attn

    reported = load_plugins(plugins)
    variants, positions = attn.list_attention(), attn.list_positions()
    for label, err in attn.plugin_errors().items():  # entry points: the --plugin ones were reported above
        if label not in reported:
            warn_plugin(label, err)
    presets = _presets()
    evaluations = _accuracy_presets()
    checkpoints = _checkpoints()
    tasks = _tasks()
    presses, install = _presses()
    if as_json:
        click.echo(json.dumps({"attention": variants, "patterns": attn.list_patterns(), "positions": positions,
                               "tasks": tasks, "presets": presets, "accuracy_presets": evaluations,
                               "checkpoints": checkpoints, "presses": presses, "presses_install": install},
                              default=str, indent=1))
    else:
        _print_listing(variants, positions, presets)
        _print_patterns(attn.list_patterns())
        _print_tasks(tasks)
        _print_checkpoints(checkpoints)
        _print_accuracy_presets(evaluations)
        _print_presses(presses, install)
    if reported:  # the listing lacks the variants asked for: the exit status says so too
        raise click.exceptions.Exit(1)


def _print_listing(variants: list[dict[str, Any]], positions: list[dict[str, Any]], presets: dict[str, str]) -> None:
    click.secho("Attention variants", bold=True)
    for v in variants:
        caps = [c for c in ("causal", "bidirectional", "decode") if v.get(c)] + ["exact" if v.get("exact") else "approximate"]
        caps.append("GQA" if v.get("gqa") == "native" else "GQA by repeated keys")
        click.echo(f"  {v['name']:<16} {v.get('doc', '')}")
        click.echo(f"    params:       {_fmt_params(v['params'])}")
        click.echo(f"    capabilities: {', '.join(caps)}")
        if v.get("token_inputs"):
            click.echo(f"    token inputs: {', '.join(v['token_inputs'])} (projected by the backbone, drawn by op sweeps)")
        if v.get("documents"):
            click.echo(f"    documents:    {v['documents']}")
        for b in v.get("backends", []):
            where = "; ".join(f"{d}: {'/'.join(m)}" for d, m in b["devices"].items())
            avail = f"  [unavailable: {b['available']}]" if b["available"] else ""
            click.echo(f"    backend {b['name']:<11} {where}{avail}")
        for line in _auto_lines(v.get("auto_order", {})):
            click.echo(f"    auto tries   {line}")
        if v["source"] != "builtin":
            click.echo(f"    from {v['source']}")
    click.secho("Position methods", bold=True)
    for p in positions:
        click.echo(f"  {p['name']:<16} [{p.get('kind')}] {p.get('doc', '')}")
        click.echo(f"    params: {_fmt_params(p['params'])}")
    if presets:
        click.secho("Sweep presets", bold=True)
        for name, text in presets.items():
            click.echo(f"  {name:<8} {text}")


def _print_patterns(patterns: list[dict[str, Any]]) -> None:
    click.secho("Layer patterns (--pattern; or write one: 'SPEC*N; SPEC')", bold=True)
    for p in patterns:
        click.echo(f"  {p['name']:<16} {p['unit']}  ({p['layers']} layers a unit, {p['full_fraction']:.0%} full)")


def _auto_lines(orders: dict[str, list[str]]) -> list[str]:
    """One line per device: modes that try the same backends share it ("cpu forward/decode: a > b")."""
    by_device: dict[str, dict[str, list[str]]] = {}
    for key, order in orders.items():
        device, _, mode = key.partition("/")
        by_device.setdefault(device, {}).setdefault(" > ".join(order), []).append("train" if mode == "backward" else mode)
    return [f"{device} {'/'.join(modes)}: {order}" for device, groups in by_device.items() for order, modes in groups.items()]


def _tasks() -> list[dict[str, Any]]:
    """The registered accuracy tasks (harness/accuracy/tasks/)."""
    from harness.accuracy.tasks import listing

    return listing()


def _print_tasks(tasks: list[dict[str, Any]]) -> None:
    click.secho("Accuracy tasks (accuracy --task NAME)", bold=True)
    for t in tasks:
        click.echo(f"  {t['name']:<16} {t['doc']}")
        if t["params"]:
            click.echo(f"    params:       {_fmt_params(t['params'])}")
        click.echo(f"    evaluates at: {t['default_eval_lens']} (L: the training length"
                   + (")" if t["trains"] else "; models of --base-task)"))
        if t["main_metric"]:
            click.echo(f"    main metric:  {t['main_metric']}")
        for what, key in (("columns", "columns"), ("options", "options"), ("figures", "figures")):
            if t[key]:
                click.echo(f"    {what + ':':<13} {', '.join(t[key])}")
        if not t["source"].startswith("harness.accuracy.tasks."):
            click.echo(f"    from {t['source']}")


def _checkpoints() -> list[dict[str, Any]]:
    """The named checkpoints (attn/checkpoints.py: no transformers needed to list them)."""
    from attn.checkpoints import listing

    return listing()


def _print_checkpoints(checkpoints: list[dict[str, Any]]) -> None:
    if not checkpoints:
        return
    click.secho("Checkpoints (accuracy --hf-model NAME; sweep --scope hf --hf-config NAME)", bold=True)
    for c in checkpoints:
        state = "installed" if c["installed"] else f"not installed: {c['install']}"
        click.echo(f"  {c['name']:<16} {c['title']}, {c['context']} positions, licence: {c['licence']} [{state}]")
        click.echo(f"    {c['architecture']}")


def _accuracy_presets() -> dict[str, dict[str, str]]:
    """The named checkpoint evaluations: each one's checkpoint and what it runs, with its expected hours where known."""
    from harness.accuracy.checkpoint_presets import CHECKPOINT_PRESETS

    return {name: {"model": p.model, "doc": p.doc} for name, p in CHECKPOINT_PRESETS.items()}


def _print_accuracy_presets(evaluations: dict[str, dict[str, str]]) -> None:
    click.secho("Checkpoint evaluations (accuracy --preset NAME; --eval-lens picks some of its lengths)", bold=True)
    for name, p in evaluations.items():
        click.echo(f"  {name:<27} {p['doc']}")


def _presses() -> tuple[dict[str, dict[str, Any]], str | None]:
    """(press name -> its parameters, None) when kvpress imports, else ({}, why not: missing or broken, with how to
    install it). A broken kvpress (an import raising anything) costs the presses only, never the listing."""
    from attn.hf.presses import press_catalog

    try:
        return press_catalog(), None
    except ImportError as e:  # attn.optional.Unavailable: kvpress missing, or its import failed
        return {}, str(e)


def _print_presses(presses: dict[str, dict[str, Any]], install: str | None) -> None:
    click.secho("KV presses (sweep --scope hf / accuracy --hf-model: --press NAME[(PRESS)][:key=value,...];"
                " press=<press>: the press it wraps, adakv(snapkv))", bold=True)
    if install is not None:
        click.echo(f"  unavailable: {install}")
    for name, params in presses.items():
        click.echo(f"  {name:<26} {_fmt_params(params)}")


def _presets() -> dict[str, str]:
    try:
        from harness.cost.presets import describe_presets
    except ImportError:
        return {}
    return describe_presets()


def main(argv: list[str] | None = None) -> int:
    try:
        rc = cli.main(args=argv, prog_name="attn-bench", standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("attn-bench: aborted", err=True)
        return 130
    except click.ClickException as e:
        click.echo(f"attn-bench: error: {one_error_line(e.format_message())}", err=True)
        return 2
    except ValueError as e:  # bad input detected by our own validation
        click.echo(f"attn-bench: error: {one_error_line(str(e))}", err=True)
        return 2
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
