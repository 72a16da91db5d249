"""``attn-bench check``: prove a variant's fast backends equal its reference -- the same properties the
built-ins are held to (:mod:`attn.checks`), for a plugin author's own variant.

Exit status: 0 every check passed (or was skipped with a reason: a backend that cannot run here),
1 a mismatch (each one named with its figures), 2 bad input (unknown variant, bad parameter, a
--plugin that does not load).
"""
from __future__ import annotations

import re
from typing import Any

import click


def _specs(variants: tuple[str, ...], plugin_names: list[str]) -> list[tuple[str, dict[str, Any]]]:
    from attn.registry import ATTENTION, parse_spec

    specs = variants or tuple(plugin_names) or tuple(ATTENTION.names())
    out = []
    for spec in specs:
        name, params = parse_spec(spec)
        params.pop("backend", None)  # every backend is checked
        config = ATTENTION.make_config(name, params)  # bad input: one line, exit 2, before any work
        out.append((name, {k: getattr(config, k) for k in params}))
    return out


@click.command("check")
@click.option("--plugin", "plugins", multiple=True, help="File or module registering the variants to check. Repeatable.")
@click.option("--variant", "variants", multiple=True,
              help="NAME[:key=value,...] to check (default: the plugins' variants, else every registered one).")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--fp16", is_flag=True, help="Also check float16 where a backend declares it.")
def check_command(plugins: tuple[str, ...], variants: tuple[str, ...], device: str, fp16: bool) -> None:
    """Check every backend of a variant against its reference: forward, gradients, decoding, dtypes."""
    import torch

    import attn
    from attn.checks import check_variant

    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise click.UsageError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    before = {v["name"] for v in attn.list_attention()}
    for p in dict.fromkeys(plugins):
        if not attn.load_plugin(p):
            raise click.UsageError(f"plugin {p} failed to load: {attn.plugin_errors()[p]}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise click.UsageError(f"--device {device}: no CUDA device here")
    added = [v["name"] for v in attn.list_attention() if v["name"] not in before]
    dtypes = (torch.float32, torch.bfloat16) + ((torch.float16,) if fp16 else ())
    mismatches = 0
    for name, params in _specs(variants, added):
        label = name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
        findings = check_variant(name, params, device, dtypes)
        by_backend: dict[str, list] = {}
        for f in findings:
            by_backend.setdefault(f.backend, []).append(f)
        click.secho(label, bold=True)
        if all(b.name == "reference" for b in attn.build_attention(name, **params).backends):
            click.echo("  (only a reference backend: nothing to compare it with; the decoding state is still checked)")
        for backend, fs in by_backend.items():
            counts = {s: sum(f.status == s for f in fs) for s in ("ok", "mismatch", "skipped")}
            why = sorted({f.detail for f in fs if f.status == "skipped"})
            click.echo(f"  {backend:<12} {counts['ok']} ok, {counts['mismatch']} mismatch, {counts['skipped']} skipped"
                       + (f" ({'; '.join(why)[:160]})" if why and not counts["ok"] else ""))
            bad = [f for f in fs if f.status == "mismatch"]
            for f in bad[:6]:
                click.echo(f"    MISMATCH {f.check}: {f.detail}")
            if len(bad) > 6:
                click.echo(f"    ... and {len(bad) - 6} more mismatch(es) of {backend}")
            mismatches += counts["mismatch"]
    if mismatches:
        click.echo(f"{mismatches} mismatch(es): a fast backend differs from its reference", err=True)
        raise click.exceptions.Exit(1)
    click.echo("every backend that can run here equals its reference")


__all__ = ["check_command"]
