"""Throw bad invocations at the subcommands and count how each ended.

    python scripts/fuzz_cli.py [--jobs 2] [--filter TEXT] [--show]

Every case runs ``attn-bench`` in a fresh scratch directory holding the same fixtures (a README
copy without a trailing newline, a binary file, JSON lines that are not objects, a regular file
used as a directory, broken plugins, bad TOML). A case passes when it ends as expected -- nearly
always exit status 2 with one ``attn-bench: error:`` line on stderr, no traceback, and no file in
the scratch directory created, modified or deleted; a few (a broken plugin given to ``list``) are
expected to warn once per plugin and go on. The summary counts exit 2 with a clear line,
tracebacks, and cases that wrote or modified files; ``--show`` prints each case's stderr.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = ["--lengths", "64", "--heads", "1", "--head-dim", "16"]
COST_ROW = ('{"run_id": "r", "variant": "full", "variant_params": {}, "backend_requested": "auto", "position": "none", '
            '"position_params": {}, "scope": "op", "mode": "forward", "device": "cpu", "dtype": "float32", '
            '"batch_size": 1, "num_heads": 1, "head_dim": 16, "seq_len": 64, "causal": true, "layers": null, '
            '"status": "ok", "error": null, "backend": "sdpa", "latency_ms": "fast", "peak_mem_bytes": 1}\n')


def fixtures(root: Path) -> None:
    """The files every case sees (in its own copy)."""
    (root / "notes.txt").write_text((REPO / "README.md").read_text().rstrip("\n"))
    (root / "binary.bin").write_bytes(bytes(range(256)) * 64)
    (root / "nonobj.jsonl").write_text('1\n[1, 2]\n"text"\n')
    (root / "badlatency.jsonl").write_text(COST_ROW)
    (root / "empty.jsonl").write_text("")
    (root / "existing_file").write_text("a regular file, not a directory\n")
    (root / "bad.toml").write_text("variant = [\n")
    (root / "unknown.toml").write_text('variant = "full"\nlenghts = [64]\n')
    (root / "typed.toml").write_text('variant = "full"\nlengths = [64]\nheads = "many"\n')
    (root / "grid_run_key.toml").write_text('variant = "full"\n[[grid]]\ndevice = "cpu"\n')
    (root / "plugin_syntax.py").write_text("def broken(:\n")
    (root / "plugin_raises.py").write_text("raise RuntimeError('plugin exploded on import')\n")
    (root / "plugin_exit.py").write_text("import sys\nsys.exit(0)\n")
    (root / "plugin_notattn.py").write_text(
        "import attn\nfrom dataclasses import dataclass\n\n@dataclass(frozen=True)\nclass Cfg:\n    x: int = 1\n\n"
        "@attn.register_attention('not_attention', config=Cfg)\nclass NotAttention:\n    pass\n")
    (root / "a_dir").mkdir()


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    expect: str = "reject"  # reject: exit 2, one error line; warn: exit 0 with a warning naming the plugin

    @property
    def label(self) -> str:
        text = " ".join(self.argv)
        return text if len(text) <= 110 else text[:107] + "..."


def cases() -> list[Case]:
    long_name = "x" * 100_000
    sweep = [
        ["--variant", "nope"], ["--variant", "ful"], ["--variant", "full:foo=1"],
        ["--variant", "sliding_window:window=abc"], ["--variant", "sliding_window:window=-1"],
        ["--variant", "sliding_window:window=0"], ["--variant", "full:backend=nope"],
        ["--variant", "block_sparse:block_size=0"], ["--variant", "linear:feature_map=tanh"],
        ["--variant", "linear:num_features=0"], ["--variant", ":window=3"], ["--variant", "full:window"],
        ["--variant", long_name], ["--variant", f"full:{long_name}=1"],
        ["--lengths", "0"], ["--lengths", "-5"], ["--lengths", "abc"], ["--lengths", "4K..1K"],
        ["--lengths", "1.5K"], ["--lengths", ""], ["--lengths", "1K..2Q"],
        ["--mode", "fly"], ["--dtype", "float8"], ["--scope", "planet"], ["--device", "tpu"],
        ["--device", "cuda"], ["--batch", "0"], ["--heads", "-1"], ["--head-dim", "x"], ["--time-limit", "0"],
        ["--mem-limit", "-1"], ["--retries", "-1"], ["--min-run-time", "0"], ["--max-run-time", "-2"],
        ["--layers", "0", "--scope", "model"], ["--position", "nope", "--scope", "model"],
        ["--position", "rope_yarn:factor=abc", "--scope", "model"], ["--mode", "decode", "--bidirectional"],
        ["--config", "missing.toml"], ["--config", "binary.bin"], ["--config", "bad.toml"], ["--config", "unknown.toml"],
        ["--config", "typed.toml"], ["--config", "grid_run_key.toml"], ["--preset", "nope"],
        ["--out", "notes.txt"], ["--out", "existing_file/o.jsonl"], ["--out", "a_dir"],
        ["--out", "nonobj.jsonl", "--resume"], ["--out", "binary.bin", "--resume"], ["--out", "notes.txt", "--resume"],
        ["--resume"], ["--executor", "nope"], ["--executor", "slurm"], ["--plugin", "missing.py", "--variant", "mine"],
        ["--threads", "0"], ["--threads", "x"], ["--base", "no-such-ref-xyz"], ["--at", "no-such-ref-xyz"],
        ["--base", "HEAD", "--at", "HEAD"], ["--base", "HEAD", "--executor", "slurm"], ["--check-tokens", "0"],
        ["--fail-over", "-1"],
    ]
    out: list[Case] = []
    for extra in sweep:
        argv = ["sweep", *extra]
        if "--variant" not in extra and "--config" not in extra and "--preset" not in extra:
            argv += ["--variant", "full"]
        for opt, value in zip(TINY[::2], TINY[1::2], strict=True):
            if opt not in extra and "--config" not in extra:
                argv += [opt, value]
        if "--out" not in extra and extra != ["--resume"]:
            argv += ["--out", "o.jsonl"]
        out.append(Case(tuple(argv)))
    accuracy = [
        ["--task", "nope"], ["--task", "mqar", "--variant", "nope"], ["--task", "lm", "--position", "nope"],
        ["--task", "mqar", "--train-len", "0"], ["--task", "mqar", "--train-len", "1000000000000", "--dry-run"],
        ["--task", "mqar", "--eval-lens", "abc"], ["--task", "mqar", "--eval-lens", "0,-1"],
        ["--task", "mqar", "--steps", "-1"], ["--task", "mqar", "--lr", "-1"], ["--task", "mqar", "--seeds", "x"],
        ["--preset", "nope"], ["--task", "mqar", "--model", "nope"], ["--task", "mqar", "--batch-size", "0"],
        ["--task", "mqar", "--out", "notes.txt"], ["--task", "mqar", "--out", "existing_file/a.jsonl"],
        ["--task", "mqar", "--out", "binary.bin", "--resume"], ["--task", "mqar", "--out", "nonobj.jsonl", "--resume"],
        ["--task", "mqar", "--ckpt-dir", "existing_file"], ["--task", "passkey", "--depths", "2"],
        ["--task", "passkey", "--digits", "0"], ["--task", "mqar", "--num-pairs", "-1"],
        ["--task", "lm", "--corpus", "missing_dir"], ["--task", "lm", "--corpus", "binary.bin"],
        ["--task", "fidelity", "--base-task", "nope"], ["--task", "mqar", "--variant", "sliding_window:window=0"],
        ["--task", "mqar", "--threads", "0"], ["--task", "mqar", "--variant", long_name],
        ["--task", "mqar", "--plugin", "plugin_notattn.py", "--variant", "not_attention"],
    ]
    for extra in accuracy:
        argv = ["accuracy", *extra]
        if "--out" not in extra:
            argv += ["--out", "acc.jsonl"]
        if "--dry-run" not in extra:
            argv += ["--steps", "1"] if "--steps" not in extra else []
        out.append(Case(tuple(argv)))
    inputs = ["missing.jsonl", "binary.bin", "notes.txt", "nonobj.jsonl", "empty.jsonl", "badlatency.jsonl", "a_dir"]
    out += [Case(("plot", f, "--out", "figs")) for f in inputs]
    out += [Case(("plot", "badlatency.jsonl", "--out", "existing_file")), Case(("plot", "--out", "figs")),
            Case(("plot", "badlatency.jsonl", "--out", "figs", "--format", "gif")),
            Case(("plot", "badlatency.jsonl", "--out", "figs", "--only", "nope"))]
    out += [Case(("report", f, "--out", "r.html")) for f in inputs]
    out += [Case(("report", "badlatency.jsonl", "--out", "existing_file/r.html")), Case(("report", "--out", "r.html")),
            Case(("report", "badlatency.jsonl", "--out", "a_dir"))]
    out += [Case(("compare", f, f)) for f in inputs]
    out += [Case(("compare", "badlatency.jsonl")), Case(("compare",)),
            Case(("compare", "badlatency.jsonl", "badlatency.jsonl", "--fail-if-regression", "-1")),
            Case(("compare", "badlatency.jsonl", "badlatency.jsonl", "--fail-if-regression", "abc")),
            Case(("compare", "badlatency.jsonl", "missing.jsonl"))]
    out += [Case(("list", "--plugin", p), expect="warn") for p in
            ("missing.py", "binary.bin", "plugin_syntax.py", "plugin_raises.py", "plugin_exit.py", "plugin_notattn.py",
             "no.such.module")]
    out += [Case(("list", "--bogus")), Case(("list", "extra")), Case(("nosuchcommand",))]
    out += [Case(("check", *extra)) for extra in (
        ["--variant", "nope"], ["--variant", "sliding_window:window=0"], ["--variant", "full:foo=1"],
        ["--variant", long_name], ["--plugin", "missing.py"], ["--plugin", "plugin_syntax.py"],
        ["--plugin", "plugin_notattn.py"], ["--device", "cuda"], ["--device", "tpu"], ["--bogus"])]
    out += [Case(("repro", f"{f}:1")) for f in inputs]
    out += [Case(("repro",)), Case(("repro", "badlatency.jsonl")), Case(("repro", "badlatency.jsonl", "--run-id", "r")),
            Case(("repro", "badlatency.jsonl:x"))]
    return out


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@dataclass
class Outcome:
    case: Case
    code: int
    stderr: str
    traceback: bool
    changed: list[str]

    @property
    def clear(self) -> bool:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        if self.case.expect == "warn":  # list prints what loaded, warns, and exits 1 (the listing lacks a plugin)
            return self.code == 1 and any("plugin" in ln for ln in lines) and not self.traceback
        return (self.code == 2 and len(lines) == 1 and lines[0].startswith("attn-bench: error:")
                and len(lines[0]) <= 1000)

    @property
    def ok(self) -> bool:
        return self.clear and not self.traceback and not self.changed


def run_case(case: Case, template: Path, exe: str, timeout: float) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="attn-fuzz-") as tmp:
        root = Path(tmp) / "w"
        shutil.copytree(template, root)
        before = snapshot(root)
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        try:
            p = subprocess.run([exe, *case.argv], cwd=root, capture_output=True, text=True, timeout=timeout, env=env)
            code, err = p.returncode, p.stderr + p.stdout if p.returncode else p.stderr
        except subprocess.TimeoutExpired:
            code, err = -1, f"did not finish within {timeout:g} s"
        after = snapshot(root)
        changed = sorted({k for k in before.keys() | after.keys() if before.get(k) != after.get(k)})
        return Outcome(case, code, err, "Traceback (most recent call last)" in err, changed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--filter", default="", help="only cases whose command line contains this text")
    ap.add_argument("--show", action="store_true", help="print every case's stderr")
    ap.add_argument("--timeout", type=float, default=180.0)
    args = ap.parse_args()
    exe = shutil.which("attn-bench") or sys.exit("attn-bench is not on PATH (activate the venv)")
    todo = [c for c in cases() if args.filter in " ".join(c.argv)]
    with tempfile.TemporaryDirectory(prefix="attn-fuzz-template-") as tmp:
        template = Path(tmp) / "fixtures"
        template.mkdir()
        fixtures(template)
        with ThreadPoolExecutor(args.jobs) as pool:
            outcomes = list(pool.map(lambda c: run_case(c, template, exe, args.timeout), todo))
    for o in outcomes:
        if args.show or not o.ok:
            mark = "ok  " if o.ok else "FAIL"
            first = o.stderr.strip().splitlines()[-1][:160] if o.stderr.strip() else "(no output)"
            extra = f" changed={o.changed}" if o.changed else ""
            print(f"{mark} rc={o.code:>3} {o.case.label}\n       {first}{' [traceback]' if o.traceback else ''}{extra}")
    by_cmd: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_cmd.setdefault(o.case.argv[0], []).append(o)
    print(f"\n{len(outcomes)} bad invocations")
    for cmd, group in by_cmd.items():
        print(f"  {cmd:14s} {len(group):3d} cases, {sum(o.ok for o in group):3d} as expected")
    rejected = [o for o in outcomes if o.case.expect == "reject"]
    print(f"exit 2 with one clear line: {sum(o.clear for o in rejected)} of {len(rejected)} expected rejections")
    print(f"warned and went on: {sum(o.clear for o in outcomes if o.case.expect == 'warn')} of "
          f"{sum(o.case.expect == 'warn' for o in outcomes)} broken plugins given to list")
    print(f"tracebacks: {sum(o.traceback for o in outcomes)}")
    print(f"files written or modified: {sum(bool(o.changed) for o in outcomes)} cases")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
