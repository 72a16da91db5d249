"""Every measured number README.md, results/README.md and docs/*.md quote, read back from its committed row.

Each quote is a template of the text with ``{}`` where the numbers go and, for each, the file, the row
selector, the column, how the rows are combined and how the number is written (``V``), or a number derived from
rows (``Calc``: a ratio of two rows, a difference, a count of rows). The test renders the template from the rows and
looks for the rendered text in the document (whitespace folded), so a re-run that changes a row, or an edit that
changes the text, fails here. What is quoted is what the runs measured (times, memory, accuracies, counts, fitted
slopes, speed-ups, each run's conditions); a run's settings (lengths, steps, widths) are its command's.

Covered: the quotes of README.md; results/README.md's text and every table (each table row with a number in it must be
one rendered quote); the measured figures of docs/*.md. A guard fails on any figure in results/README.md or docs/*.md
that no quote renders -- a number with a unit of time, memory, bandwidth, speed-up or share (ms, s, min, GiB, MiB, KiB,
GB/s, GFLOP/s, x, %) or with two or more decimals, outside code -- unless it lies in a phrase named in ``SETTINGS``
(settings, targets, facts about code or hardware). Bare
integers and numbers written in words are not guarded. Also: every committed file has its section in
results/README.md, and every link resolves. Pure file reads: well under a second.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README, RESULTS = "README.md", "results/README.md"


@cache
def rows(file: str) -> tuple[dict[str, Any], ...]:
    return tuple(derived(json.loads(line)) for line in (ROOT / "results" / file).read_text().splitlines() if line.strip())


def derived(row: dict[str, Any]) -> dict[str, Any]:
    """Two numbers prose reads off a row: the latency's IQR in percent of the median, and the memory bandwidth's
    change across the cell in percent, as its ``noisy_reason`` words it."""
    out = dict(row)
    if row.get("latency_ms") and row.get("latency_iqr_ms") is not None:
        out["iqr_pct"] = 100 * row["latency_iqr_ms"] / row["latency_ms"]
    m = re.search(r"memory bandwidth changed by (\d+)%", row.get("noisy_reason") or "")
    if m:
        out["bandwidth_change"] = float(m.group(1))
    return out


@cache
def text(doc: str) -> str:
    return " ".join((ROOT / doc).read_text().split())


def matches(row: dict[str, Any], key: str, want: Any) -> bool:
    if key == "row":  # a predicate on the whole row
        return want(row)
    return want(row.get(key)) if callable(want) else row.get(key) == want


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of log(y) on log(x): the fitted exponent the figures and the report draw."""
    xs, ys = [math.log(x) for x, _ in points], [math.log(y) for _, y in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def write(x: float, spec: str) -> str:
    """``spec`` as ``format`` takes it, plus ``n0`` (thousands apart by a space: 23 788) and ``#.3g`` without
    a trailing point (214, not 214.)."""
    if spec == "n0":
        return format(x, ",.0f").replace(",", " ")
    return format(x, spec).rstrip(".") if spec.startswith("#") else format(x, spec)


@dataclass(frozen=True)
class V:
    """One quoted number: the rows of ``file`` matching ``where`` (a value, a predicate on the value, or under
    the key ``row`` a predicate on the row), column ``col`` combined by ``agg``, times ``scale``, written with
    ``spec``. ``agg``: ``one`` (exactly one row), ``mean``, ``min``, ``max``, ``slope`` (log-log on seq_len);
    with ``by``, ``min``/``max`` of the means of the groups of rows sharing those columns. ``col="k/n"`` writes
    sum(round(value * n)) / sum(n): passes out of examples."""

    file: str
    where: dict[str, Any] = field(default_factory=dict, hash=False)
    col: str = "value"
    agg: str = "one"
    spec: str = ".2f"
    scale: float = 1.0
    by: tuple[str, ...] = ()

    def matching(self) -> list[dict[str, Any]]:
        hit = [r for r in rows(self.file) if all(matches(r, k, v) for k, v in self.where.items())]
        assert hit, f"no row of {self.file} matches {self.where}"
        if self.agg == "one":
            assert len(hit) == 1, f"{len(hit)} rows of {self.file} match {self.where}; quote one"
        return hit

    def number(self) -> float:
        hit = self.matching()
        if self.agg == "slope":
            return slope([(r["seq_len"], r[self.col]) for r in hit])
        if self.by:
            groups: dict[tuple, list[float]] = {}
            for r in hit:
                groups.setdefault(tuple(str(r.get(c)) for c in self.by), []).append(r[self.col])
            values = [statistics.mean(g) for g in groups.values()]
        else:
            values = [r[self.col] for r in hit]
        assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values), (self, values)
        return {"one": lambda xs: xs[0], "mean": statistics.mean, "min": min, "max": max}[self.agg](values)

    def render(self) -> str:
        if self.col in ("k/n", "k"):
            hit = self.matching()
            k = sum(round(r["value"] * r["n"]) for r in hit)
            return f"{k}/{sum(r['n'] for r in hit)}" if self.col == "k/n" else str(k)
        return write(self.number() * self.scale, self.spec)


@dataclass(frozen=True)
class Calc:
    """A number derived from rows: ``fn()`` (a ratio of two quoted numbers, a count of rows...) written with
    ``spec``."""

    fn: Callable[[], float] = field(hash=False)
    spec: str = ".1f"

    def render(self) -> str:
        return write(self.fn(), self.spec)


def count(file: str, **where: Any) -> Calc:
    """How many rows of ``file`` match ``where``."""
    return Calc(lambda: len(V(file, where, agg="mean").matching()), "n0")


def ratio(a: V, b: V, spec: str = ".1f") -> Calc:
    return Calc(lambda: a.number() / b.number(), spec)


@dataclass(frozen=True)
class Q:
    doc: str
    template: str
    values: tuple[V | Calc, ...]

    def render(self) -> str:
        return " ".join(self.template.format(*(v.render() for v in self.values)).split())


def committed() -> list[str]:
    return sorted(p.name for p in (ROOT / "results").glob("*.jsonl"))


MIB = 1 / 2**20


def ms(file: str, spec: str, agg: str = "one", **where: Any) -> V:
    return V(file, where, "latency_ms", agg, spec)


def pct(file: str, **where: Any) -> V:
    """A fraction of the matmul peak, written as percent without the sign."""
    return V(file, where, "peak_fraction", "one", ".0f", 100)


def sec(file: str, spec: str, **where: Any) -> V:
    return V(file, where, "latency_ms", "one", spec, 1e-3)


def mib(file: str, spec: str, agg: str = "one", **where: Any) -> V:
    return V(file, where, "peak_mem_bytes", agg, spec, MIB)


def val(file: str, spec: str = ".2f", agg: str = "one", **where: Any) -> V:
    return V(file, where, "value", agg, spec)


def kn(file: str, **where: Any) -> V:
    return V(file, where, "k/n", "sum")


def k(file: str, **where: Any) -> V:
    """Passes alone (the ``k`` of ``k/n``), for a table that states ``n`` once."""
    return V(file, where, "k", "sum")


# -- what the run's rows say about its conditions: written the same way for every committed file ------------------

def machine_label(row: dict[str, Any]) -> str:
    """The machine as readers see it: its name and, on CPU, its vector units (harness.analysis.frames)."""
    cap = row.get("cpu_capability")
    return f"{row['device_name']} {cap}" if cap and not str(row.get("device", "cpu")).startswith("cuda") else row["device_name"]


def cost_conditions(file: str) -> str:
    rs = rows(file)
    peaks = [r["peak_flops_per_s"] for r in rs if r.get("peak_flops_per_s")]
    ok = sum(r["status"] == "ok" for r in rs)
    noisy = sum(bool(r.get("noisy")) for r in rs)
    again = sum((r.get("attempts") or 1) > 1 for r in rs)
    machine = "/".join(sorted({machine_label(r) for r in rs}))
    torch = "/".join(sorted({r["torch_version"] for r in rs}))
    levels: dict[str, list[float]] = {}
    for r in rs:
        if r.get("bandwidth_peak_bytes_per_s"):
            levels.setdefault(r.get("bandwidth_level") or "", []).append(r["bandwidth_peak_bytes_per_s"])
    if not levels:
        memory = ""
    elif set(levels) == {""}:  # written before rows named their level: STREAM's memory-sized triad
        memory = f"; memory bandwidth {min(levels['']) / 1e9:.0f}–{max(levels['']) / 1e9:.0f} GB/s"
    else:
        memory = "; bandwidth at each working set's level " + ", ".join(
            f"{lv} {min(b) / 1e9:.0f}–{max(b) / 1e9:.0f} GB/s" for lv, b in sorted(levels.items()) if lv)
    return (f"{machine}, torch {torch}: {ok}/{len(rs)} cells ok, {noisy} noisy, {again} re-measured; matmul peak "
            f"{min(peaks) / 1e9:.0f}–{max(peaks) / 1e9:.0f} GFLOP/s{memory}; other processes took at most "
            f"{max(r.get('other_cpu') or 0 for r in rs):.2f} cores")


def accuracy_conditions(file: str) -> str:
    rs = rows(file)
    ok = sum(r["status"] == "ok" for r in rs)
    machine = "/".join(sorted({machine_label(r) for r in rs}))
    threads = "/".join(str(t) for t in sorted({r["num_threads"] for r in rs}))
    torch = "/".join(sorted({r["torch_version"] for r in rs}))
    return f"{machine}, torch {torch}, {threads} thread(s): {ok}/{len(rs)} rows ok"


# -- the quotes: README.md ------------------------------------------------------------------------------------------

QUOTES: list[Q] = []


def quote(doc: str, template: str, *values: V) -> None:
    QUOTES.append(Q(doc, template, values))


CS, BS, LONG, TG, BT, QK, DC = ("cpu-speed.jsonl", "cpu-speed-block-sparse-decode.jsonl", "long-cpu.jsonl",
                                "targets-cpu.jsonl", "blocked-train-cpu.jsonl", "quick-cpu.jsonl", "decode-cpu.jsonl")
SS, VR, HL, GQ = "sinks-softcap-cpu.jsonl", "variants-cpu.jsonl", "hf-llama-cpu.jsonl", "gqa-cpu.jsonl"
SM, GM = "accuracy-smollm2-cpu.jsonl", "accuracy-gemma3-cpu.jsonl"
MA, MR, MG = "accuracy-mqar-attention-cpu.jsonl", "accuracy-mqar-recurrent-cpu.jsonl", "accuracy-mqar-gdn-cpu.jsonl"
MS, SEL = "accuracy-mqar-selective-cpu.jsonl", "accuracy-selection-cpu.jsonl"
FL, LG = "accuracy-full-lm-cpu.jsonl", "accuracy-lengthgen-cpu.jsonl"
WP, FP = "accuracy-passkey-window-probe-cpu.jsonl", "accuracy-passkey-finetune-probe-cpu.jsonl"
RU, RW = "accuracy-ruler-cpu.jsonl", "accuracy-ruler-window-cpu.jsonl"

BSP = "block_sparse:block_size=64,local_blocks=2,global_blocks=1"
SW = "sliding_window:window=256"
FWD, DEC, TRAIN = {"mode": "forward"}, {"mode": "decode"}, {"mode": "train"}
K16, K64 = {"seq_len": 16384}, {"seq_len": 65536}

# The README's cost headline: re-measured on today's code (headline-cpu, long-headline-cpu), never a stale file's.
HL1, LH = "headline-cpu.jsonl", "long-headline-cpu.jsonl"
OP1 = {"scope": "op", "batch_size": 1}
quote(README, "one forward call at 16K tokens takes {} ms with `full` (SDPA), {} ms with `sliding_window` (window 256, "
      "Flex), {} ms with `block_sparse` (Flex) and {} ms with `linear` (chunked)",
      ms(HL1, ".0f", **FWD, **K16, variant_spec="full:backend=sdpa"),
      ms(HL1, ".1f", **FWD, **K16, variant_spec=f"{SW},backend=flex"),
      ms(HL1, ".1f", **FWD, **K16, variant_spec=f"{BSP},backend=flex"),
      ms(HL1, ".1f", **FWD, **K16, variant_spec="linear:backend=chunked"))
quote(README, "`full`'s KV cache grows from {} ms at 1K of context to {} ms at 128K (noisy: the memory bandwidth "
      "moved across that cell)", ms(HL1, ".3f", **DEC, **OP1, seq_len=1024, variant_spec="full"),
      ms(HL1, ".1f", **DEC, **OP1, seq_len=131072, variant_spec="full"))
for agg in ("min", "max"):  # "1.0 MiB" holds at every context
    quote(README, "`sliding_window` {}–{} ms in {} MiB", ms(HL1, ".3f", "min", **DEC, variant_spec=SW),
          ms(HL1, ".3f", "max", **DEC, variant_spec=SW), V(HL1, {**DEC, "variant_spec": SW}, "peak_mem_bytes", agg, ".1f", MIB))
quote(README, "`linear` {}–{} ms (its recurrent state)", ms(HL1, ".3f", "min", **DEC, variant_spec="linear"),
      ms(HL1, ".3f", "max", **DEC, variant_spec="linear"))
quote(README, "`block_sparse` {}–{} ms in {}–{} MiB", ms(HL1, ".2f", "min", **DEC, variant_spec=BSP),
      ms(HL1, ".2f", "max", **DEC, variant_spec=BSP), mib(HL1, ".1f", "min", **DEC, variant_spec=BSP),
      mib(HL1, ".1f", "max", **DEC, variant_spec=BSP))
quote(README, "each call timed at least {} times", V(LH, {}, "timing_samples", "min", ".0f"))
assert next(r for r in rows(HL1) if r["seq_len"] == 131072 and r["mode"] == "decode")["noisy"]
quote(README, "`full` takes {} s at 128K", sec(LH, ".0f", variant_spec="full", seq_len=131072))
quote(README, "`sliding_window` reaches 1M in {} s, `block_sparse` in {} s and `linear` in {} s (the last two noisy: the "
      "memory bandwidth moved across the cell)",
      *(sec(LH, ".1f", variant_spec=v, seq_len=2**20) for v in (SW, BSP, "linear")))
for spec, noisy in ((SW, False), (BSP, True), ("linear", True), ("full", False)):  # marked noisy where the row is
    assert next(r for r in rows(LH) if r["variant_spec"] == spec)["noisy"] is noisy, spec
quote(README, "to 1 full holds {} MiB of decoding state at 64K against all-full's {}, and decodes a token in {} ms "
      "against {}.", *(V(HL1, {"scope": "model", **DEC, "seq_len": 65536, "variant_spec": v}, "state_bytes", spec=".2f",
                         scale=MIB) for v in ("qwen3-next", "full")),
      *(ms(HL1, ".2f", scope="model", **DEC, seq_len=65536, variant_spec=v) for v in ("qwen3-next", "full")))
quote(README, "around 16K decodes a step of `full` in {} ms against {} ms for 32 of 16K",
      *(ms(HL1, ".2f", **K16, batch_size=32, ragged=r, variant_spec="full") for r in (0.5, None)))

HLD = {**DEC, **OP1, "variant_spec": "full"}
quote(RESULTS, "`full`'s step at 4K, whose 16 MiB cache sits in the 32 MiB L3, streams at {} of the L3 triad's bandwidth "
      "(judged against DRAM's triad, the same cell claimed {} in `cpu-speed-roofline-cpu.jsonl`), and at 8K, past the "
      "L3, at {} of DRAM's. No ok row exceeds its own roof: the largest `bandwidth_fraction` is {} and the largest "
      "`peak_fraction` {}.",
      V(HL1, {**HLD, "seq_len": 4096, "bandwidth_level": "L3"}, "bandwidth_fraction"),
      V("cpu-speed-roofline-cpu.jsonl", {**DEC, "variant_spec": "full", "seq_len": 4096}, "bandwidth_fraction"),
      V(HL1, {**HLD, "seq_len": 8192, "bandwidth_level": "DRAM"}, "bandwidth_fraction"),
      V(HL1, {"status": "ok"}, "bandwidth_fraction", "max"), V(HL1, {"status": "ok"}, "peak_fraction", "max"))


def noisy_change(file: str, **where: Any) -> V:
    """The change of the memory bandwidth across a noisy cell, in percent, as its ``noisy_reason`` says it."""
    return V(file, {**where, "row": lambda r: r["noisy"] and "memory bandwidth changed" in r["noisy_reason"]},
             "bandwidth_change", spec=".0f")


quote(RESULTS, "`full` at 128K is noisy after {} attempts (its memory bandwidth changed by {}% across the cell), and so "
      "is `sliding_window` at 1M ({}%)", V(HL1, {**HLD, "seq_len": 131072}, "attempts", spec=".0f"),
      noisy_change(HL1, **HLD, seq_len=131072), noisy_change(HL1, **DEC, variant_spec=SW, seq_len=2**20))
quote(RESULTS, "`full` takes {} s at 128K; `sliding_window` reaches 1M tokens in {} s, `block_sparse` in {} s and "
      "`linear` in {} s.", sec(LH, ".0f", variant_spec="full"),
      *(sec(LH, ".1f", variant_spec=v) for v in (SW, BSP, "linear")))
quote(RESULTS, "(IQR {}% of the median); the others four times, with IQRs of {}%, {}% and {}%",
      *(V(LH, {"variant_spec": v}, "iqr_pct", spec=".1f") for v in ("full", SW, BSP, "linear")))
quote(RESULTS, "differed by {}% and {}%", *(noisy_change(LH, variant_spec=v) for v in (BSP, "linear")))
assert [r["timing_samples"] for r in rows(LH)] == [4, 4, 4, 2]  # "timed twice, not three times", "four times"

SM_PPL = {"task": "lm", "metric": "perplexity"}
SM_WIN, SM_SINK = "sliding_window:window=1024,backend=blocked", "sliding_window:sinks=4,window=1024,backend=blocked"
SM_BS = "block_sparse:block_size=128,global_blocks=1,local_blocks=8,backend=gathered"
GM_OWN, GM_LOCAL = "sliding_attention=sliding_window:backend=blocked", "sliding_window:window=512,backend=blocked"
PASSKEY = {"task": "passkey", "metric": "exact_match"}
# The README's accuracy headline: re-measured on today's code (the runs of 2 December stand in results/README.md)
SMH, GMH = "accuracy-headline-smollm2-cpu.jsonl", "accuracy-headline-gemma3-cpu.jsonl"
quote(README, "(perplexity {} against full attention's {}, over {} documents), and four attention sinks bring it back to {}",
      val(SMH, **SM_PPL, variant_spec=SM_WIN), val(SMH, **SM_PPL, variant_spec="full"),
      V(SMH, {**SM_PPL, "variant_spec": "full"}, "n", spec=".0f"), val(SMH, **SM_PPL, variant_spec=SM_SINK))
quote(README, "finds the passkey at 4K in {} (all but the keys placed first); lifting the sliding layers' window to full "
      "attention finds none ({})", kn(GMH, **PASSKEY, variant_spec=GM_OWN), kn(GMH, **PASSKEY, variant_spec="full"))
assert [r["value"] for r in rows(GMH) if r["variant_spec"] == GM_OWN and r["depth"] == 0.0] == [0.0]  # "placed first"

quote(RESULTS, "The window loses (perplexity {} against full attention's {}) and four sinks bring it back to {}. Today's "
      "`lm` task scores {} documents where the run of 2 December below scored {}",
      val(SMH, **SM_PPL, variant_spec=SM_WIN), val(SMH, **SM_PPL, variant_spec="full"),
      val(SMH, **SM_PPL, variant_spec=SM_SINK), V(SMH, {**SM_PPL, "variant_spec": "full"}, "n", spec=".0f"),
      V(SM, {**SM_PPL, "variant_spec": "full", "eval_len": 4096}, "n", spec=".0f"))
quote(RESULTS, "Its own pattern finds {}, missing the three keys placed first (depth 0), which the run of 2 December below "
      "found ({}, at depths 0, 0.5 and 1 then); all-global finds none ({})", kn(GMH, **PASSKEY, variant_spec=GM_OWN),
      kn(GM, **PASSKEY, variant_spec=GM_OWN, eval_len=4096, depth=0.0), kn(GMH, **PASSKEY, variant_spec="full"))

# the frontier (issue 48): the 1/8 column of the ranking `attn-bench frontier` renders; a decoded token's cost
FS, FQ, FC = "frontier-smollm2-cpu.jsonl", "frontier-qwen-cpu.jsonl", "frontier-cost-cpu.jsonl"
FG, QWEN = "frontier-gemma3-cpu.jsonl", "qwen2.5-coder-0.5b"
# files read with a frontier file (the same prompts, its rows paired with these): retrieval's arms (issue 51)
FRONTIER_WITH = {FS: ("retrieval-smollm2-cpu.jsonl", "retrieval-smollm2-4k-cpu.jsonl"), FQ: ("retrieval-qwen-cpu.jsonl",),
                 "frontier-qwen-probed-16k-cpu.jsonl": ("frontier-qwen-probed-4k-cpu.jsonl",),  # 16K beside 4K: lengths
                 # Qwen at 8K in float32: a split run's two files (passkey; the RULER task), one frontier
                 "frontier-qwen-8k-passkey-cpu.jsonl": ("frontier-qwen-8k-ruler-cpu.jsonl",),
                 "frontier-qwen-8k-ruler-cpu.jsonl": ("frontier-qwen-8k-passkey-cpu.jsonl",)}


# -- the quotes: results/README.md, run by run ----------------------------------------------------------------------

# the CPU kernel table at 16K, in cpu-speed.jsonl and in its quiet re-run (cpu-speed-roofline-cpu.jsonl)
KERNELS_16K = (("`full` / sdpa, forward", "full:backend=sdpa", FWD, ".0f"),
               ("`sliding_window(256)` / flex, forward", f"{SW},backend=flex", FWD, ".1f"),
               ("`block_sparse` / flex, forward", f"{BSP},backend=flex", FWD, ".1f"),
               ("`linear` elu1 / chunked, forward", "linear:backend=chunked", FWD, ".1f"),
               ("`sliding_window` / blocked, train", SW, TRAIN, ".0f"),
               ("`block_sparse` / gathered, train", BSP, TRAIN, ".0f"),
               ("`linear` / chunked, train", "linear", TRAIN, ".0f"))
for file in (CS, "cpu-speed-roofline-cpu.jsonl"):
    for label, spec, mode, fmt in KERNELS_16K:
        end = " |" if file != CS and ("full" in label or "flex" in label or "`linear` / chunked" in label) else ""
        quote(RESULTS, f"| {label} | {{}} ms | {{}}% |{end}", ms(file, fmt, **mode, **K16, variant_spec=spec),
              pct(file, **mode, **K16, variant_spec=spec))
for agg in ("min", "max"):
    quote(RESULTS, "`sliding_window` {}–{} ms (a ring buffer of the window written in place) in {} MiB at every context",
          ms(CS, ".3f", "min", **DEC, variant_spec=SW), ms(CS, ".3f", "max", **DEC, variant_spec=SW),
          V(CS, {**DEC, "variant_spec": SW}, "peak_mem_bytes", agg, ".1f", MIB))
quote(RESULTS, "`linear` {}–{} ms (the recurrent state)", ms(CS, ".3f", "min", **DEC, variant_spec="linear"),
      ms(CS, ".3f", "max", **DEC, variant_spec="linear"))
quote(RESULTS, "`full`'s KV cache at {} ms (1K), {} ms (4K), {} ms (16K) and {} ms (128K)",
      *(ms(CS, f, **DEC, seq_len=L, variant_spec="full") for f, L in ((".3f", 1024), (".3f", 4096), (".2f", 16384),
                                                                      (".1f", 131072))))
quote(RESULTS, "`linear`'s measured {}–{} MiB", mib(CS, ".2f", "min", **DEC, variant_spec="linear"),
      mib(CS, ".2f", "max", **DEC, variant_spec="linear"))
quote(RESULTS, "every token: {} MiB at 64K", mib(CS, ".0f", **DEC, **K64, variant_spec=BSP))
quote(RESULTS, "One token decodes in {}–{} ms and {}–{} MiB at every context from 1K to 1M (1M: {} ms)",
      ms(BS, ".2f", "min"), ms(BS, ".2f", "max"), mib(BS, ".1f", "min"), mib(BS, ".1f", "max"),
      ms(BS, ".3f", seq_len=2**20))

SPAN = {"seq_len": lambda n: 8192 <= n <= 131072}
quote(RESULTS, "(log-log slope {} over 8K–128K) and takes {} s at 128K",
      V(LONG, {**SPAN, "variant_spec": "full"}, "latency_ms", "slope"), sec(LONG, ".0f", variant_spec="full", seq_len=131072))
quote(RESULTS, "`sliding_window` (flex) in {} s, `block_sparse` (flex) in {} s and `linear` (chunked) in {} s, with "
      "slopes {}, {} and {} over 8K–128K",
      *(sec(LONG, ".1f", variant_spec=v, seq_len=2**20) for v in (SW, BSP, "linear")),
      *(V(LONG, {**SPAN, "variant_spec": v}, "latency_ms", "slope") for v in (SW, BSP, "linear")))
quote(RESULTS, "{} s at 256K, {} s at 512K, as its fraction of the matmul peak drops from {} to {}",
      sec(LONG, ".2f", variant_spec="linear", seq_len=2**18), sec(LONG, ".1f", variant_spec="linear", seq_len=2**19),
      V(LONG, {"variant_spec": "linear", "seq_len": 2**18}, "peak_fraction"),
      V(LONG, {"variant_spec": "linear", "seq_len": 2**19}, "peak_fraction"))

quote(RESULTS, "`full` (SDPA) {} ms, `sliding_window` flex {} ms (blocked {} ms), `block_sparse` flex {} ms (gathered "
      "{} ms), `linear` chunked {} ms (the recurrence {} ms)",
      *(ms(TG, f, **FWD, **K16, variant_spec=v) for f, v in (
          (".0f", "full:backend=sdpa"), (".1f", f"{SW},backend=flex"), (".0f", f"{SW},backend=blocked"),
          (".1f", f"{BSP},backend=flex"), (".0f", f"{BSP},backend=gathered"), (".1f", "linear:backend=chunked"),
          (".0f", "linear:backend=recurrent"))))
quote(RESULTS, "{} ms at 4K, {} ms at 8K, {} ms at 16K", *(ms(BT, ".0f", seq_len=L) for L in (4096, 8192, 16384)))
quote(RESULTS, "At 4K forward: `full` {} ms, `sliding_window` {} ms, `block_sparse` {} ms, `linear` {} ms",
      *(ms(QK, f, **FWD, seq_len=4096, variant_spec=v) for f, v in (
          (".0f", "full"), (".1f", SW), (".1f", BSP), (".1f", "linear"))))

quote(RESULTS, "`sliding_window` took {} ms a token at 64K here against {} ms in `cpu-speed.jsonl`",
      ms(DC, ".3f", **K64, variant_spec=SW), ms(CS, ".4f", **DEC, **K64, variant_spec=SW))
quote(RESULTS, "`block_sparse` {} ms (in {} MiB", ms(DC, ".1f", **K64, variant_spec=BSP), mib(DC, ".0f", **K64, variant_spec=BSP))
quote(RESULTS, "against {} ms in `cpu-speed-block-sparse-decode.jsonl`", ms(BS, ".3f", **K64))
quote(RESULTS, "`full` ({} ms at 1K, {} ms at 64K) and `linear` ({}–{} ms)",
      ms(DC, ".3f", seq_len=1024, variant_spec="full"), ms(DC, ".2f", **K64, variant_spec="full"),
      ms(DC, ".3f", "min", variant_spec="linear"), ms(DC, ".3f", "max", variant_spec="linear"))

SINKS, DIL = f"{SW},sinks=4", f"{SW},dilation=4"
quote(RESULTS, "`sliding_window:window=256,sinks=4` decodes at {}–{} ms a token in {}–{} MiB from 1K to 1M tokens of "
      "context (the plain window: {}–{} ms in {}–{} MiB)",
      *(f(SS, s, a, **DEC, variant_spec=v) for v in (SINKS, SW) for f, s, a in (
          (ms, ".3f", "min"), (ms, ".3f", "max"), (mib, ".2f", "min"), (mib, ".2f", "max"))))
quote(RESULTS, "decodes in {}–{} ms and {}–{} MiB.", *(f(SS, s, a, **DEC, variant_spec=DIL) for f, s, a in (
      (ms, ".3f", "min"), (ms, ".3f", "max"), (mib, ".2f", "min"), (mib, ".2f", "max"))))
quote(RESULTS, "Forward at 64K: `full` {} s (SDPA) vs {} s with `softcap=50`",
      sec(SS, ".1f", **FWD, **K64, variant_spec="full"), sec(SS, ".1f", **FWD, **K64, variant_spec="full:softcap=50"))
quote(RESULTS, "`sliding_window` {} ms, {} ms with 4 sinks, {} ms softcapped (both through Flex), {} ms dilated",
      *(ms(SS, ".0f", **FWD, **K64, variant_spec=v) for v in (SW, SINKS, f"{SW},softcap=50", DIL)))

VARIANTS = ("full", "full:alibi=true", "full:sink_logit=true", "full:prefix=512", SW, SINKS, BSP, "linear", "retention",
            "gla", "gated_deltanet")
quote(RESULTS, "| forward |" + " {} |" * len(VARIANTS), *(ms(VR, "n0", **FWD, **K64, variant_spec=v) for v in VARIANTS))
quote(RESULTS, "| decode one token |" + " {} |" * len(VARIANTS),
      *(ms(VR, "#.3g", **DEC, **K64, variant_spec=v) for v in VARIANTS))
quote(RESULTS, "({} and {} s at 64K against SDPA's {} s)",
      *(sec(VR, ".1f", **FWD, **K64, variant_spec=v) for v in ("full:alibi=true", "full:prefix=512", "full")))
quote(RESULTS, "ALiBi ({} ms at 64K: each step", ms(VR, ".1f", **DEC, **K64, variant_spec="full:alibi=true"))
quote(RESULTS, "sink logits ({} ms at 64K: each step", ms(VR, ".0f", **DEC, **K64, variant_spec="full:sink_logit=true"))
quote(RESULTS, "`block_sparse` decodes with its bounded cache here too ({}–{} MiB at every context)",
      mib(VR, ".1f", "min", **DEC, variant_spec=BSP), mib(VR, ".1f", "max", **DEC, variant_spec=BSP))

for label, spec in (("`full`", "full"), ("`sliding_window:window=1024`", "sliding_window:window=1024"),
                    ("`block_sparse` (64 / 2 local / 1 global)", "block_sparse"), ("`linear`", "linear")):
    quote(RESULTS, f"| prefill, {label} | {{}} ms | {{}} s | {{}} s |", ms(HL, ".0f", **FWD, seq_len=1024, variant_spec=spec),
          sec(HL, ".1f", **FWD, **K16, variant_spec=spec), sec(HL, ".1f", **FWD, **K64, variant_spec=spec))
for spec in ("full", "linear"):
    quote(RESULTS, f"| one decoded token, `{spec}` | {{}} ms | {{}} ms | {{}} ms |",
          *(ms(HL, ".1f", **DEC, seq_len=L, variant_spec=spec) for L in (1024, 16384, 65536)))
quote(RESULTS, "`full`'s prefill runs at {}–{}% of the matmul peak at 32K–64K",
      *(pct(HL, **FWD, seq_len=L, variant_spec="full") for L in (32768, 65536)))

HF, OP = {"scope": "hf"}, {"scope": "op"}
quote(RESULTS, "takes {} ms with 8 key/value heads and {} ms with its own 2, and needs {} vs {} MiB",
      ms(GQ, ".1f", **HF, **DEC, num_kv_heads=None), ms(GQ, ".1f", **HF, **DEC, num_kv_heads=2),
      mib(GQ, ".0f", **HF, **DEC, num_kv_heads=None), mib(GQ, ".0f", **HF, **DEC, num_kv_heads=2))
quote(RESULTS, "decodes in {} ms with 8 key/value heads, {} ms with 2 and {} ms with 1, in {}, {} and {} MiB",
      *(ms(GQ, ".2f", **OP, **DEC, num_kv_heads=h) for h in (None, 2, 1)),
      *(mib(GQ, ".1f", **OP, **DEC, num_kv_heads=h) for h in (None, 2, 1)))
quote(RESULTS, "({} s / {} s / {} s forward, {} s / {} s / {} s train)",
      *(sec(GQ, ".2f", **OP, **FWD, num_kv_heads=h) for h in (None, 2, 1)),
      *(sec(GQ, ".1f", **OP, **TRAIN, num_kv_heads=h) for h in (None, 2, 1)))


def smol_cell(spec: str, length: int, position: str = "checkpoint", ppl: bool = True) -> tuple[str, list[V]]:
    """A SmolLM2 table cell: passkey at depths 0 / 0.5 / 1 · niah_single_1 · perplexity."""
    at = {"variant_spec": spec, "position_spec": position, "eval_len": length}
    vals = [kn(SM, **PASSKEY, **at, depth=d) for d in (0.0, 0.5, 1.0)]
    vals.append(kn(SM, task="ruler", subtask="niah_single_1", metric="string_match", **at))
    if ppl:
        vals.append(val(SM, **SM_PPL, **at))
    return "{} {} {} · {}" + (" · {}" if ppl else ""), vals


def table_row(doc: str, label: str, cells: list[tuple[str, list[V]] | str]) -> None:
    texts = [c if isinstance(c, str) else c[0] for c in cells]
    quote(doc, f"| {label} | " + " | ".join(texts) + " |",
          *(v for c in cells if not isinstance(c, str) for v in c[1]))


for label, spec in (("`full`", "full"), ("`sliding_window:window=1024`", SM_WIN),
                    ("`sliding_window:sinks=4,window=1024`", SM_SINK),
                    ("`block_sparse:block_size=128,local_blocks=8,global_blocks=1`", SM_BS)):
    last = smol_cell(spec, 16384, ppl=False) if spec == "full" else "--"
    table_row(RESULTS, label, [smol_cell(spec, L) for L in (2048, 4096, 8192)] + [last])
for pos in ("rope_yarn:factor=2", "rope_ntk:factor=2", "rope_dynamic:factor=2"):
    table_row(RESULTS, f"`full` + `{pos}`", ["--", "--", "--", smol_cell("full", 16384, pos, ppl=False)])
quote(RESULTS, "perplexity on {} tokens of held-out Python source",
      V(SM, {**SM_PPL, "variant_spec": "full", "eval_len": 2048}, "scored_tokens", "one", ".0f"))
quote(RESULTS, "its perplexity goes from full attention's {} to {}",
      *(val(SM, **SM_PPL, variant_spec=v, eval_len=4096) for v in ("full", SM_WIN)))
quote(RESULTS, "(the key before the question {}, perplexity {})",
      kn(SM, **PASSKEY, variant_spec=SM_SINK, position_spec="checkpoint", eval_len=4096, depth=1.0),
      val(SM, **SM_PPL, variant_spec=SM_SINK, eval_len=4096))
MK = {"task": "ruler", "subtask": "niah_multikey_1", "metric": "string_match", "eval_len": 2048}
quote(RESULTS, "`niah_multikey_1` gives `full`, the sinks and block-sparse {} and the bare window {}",
      kn(SM, **MK, variant_spec="full"), kn(SM, **MK, variant_spec=SM_WIN))
quote(RESULTS, "beyond this model for every variant ({})",
      kn(SM, task="ruler", subtask="vt", metric="string_match", variant_spec="full"))


def gemma_cell(spec: str, length: int) -> tuple[str, list[V]]:
    at = {"variant_spec": spec, "eval_len": length}
    vals = [kn(GM, **PASSKEY, **at, depth=d) for d in (0.0, 0.5, 1.0)]
    return "{} {} {} · {}", vals + [kn(GM, task="ruler", subtask="niah_single_1", metric="string_match", **at)]


for label, spec in (("own 5 sliding (512) : 1 global", GM_OWN), ("`full` (all-global)", "full"),
                    ("`sliding_window:window=512` (all-local)", GM_LOCAL)):
    table_row(RESULTS, label, [gemma_cell(spec, L) for L in (4096, 8192, 16384)])

MQAR = (("`full`", MA, "full"), ("`block_sparse:block_size=16`", MA, "block_sparse:block_size=16"), ("`gla`", MR, "gla"),
        ("`retention`", MR, "retention"), ("`gated_deltanet`, Mamba-2's decay", MG, "gated_deltanet"),
        ("`gated_deltanet`, first decay (sigmoid gate)", MR, "gated_deltanet"), ("`linear`", MA, "linear"),
        ("`sliding_window:window=16`", MA, "sliding_window:window=16"),
        ("`moba:block_size=16,topk=3`", MS, "moba:block_size=16,topk=3"))
for label, file, spec in MQAR:
    acc = {"metric": "accuracy", "variant_spec": spec}
    quote(RESULTS, f"| {label} | {{}} | {{}} | {{}} | {{}} | {{}} / {{}} |",
          *(val(file, ".3f", "mean", **acc, d_model=w, eval_len=L) for L in (64, 128) for w in (32, 64)),
          *(V(file, {**acc, "d_model": w, "eval_len": 128}, "state_numbers", "max", "n0") for w in (32, 64)))
SELECTORS = (("`sliding_window:window=256`", "sliding_window:window=256"),
             ("`block_sparse` (64, 1 global + 3 local)", "block_sparse:block_size=64,global_blocks=1,local_blocks=3"),
             ("`moba`", "moba"), ("`quest`", "quest"))
for label, spec in SELECTORS:
    quote(RESULTS, f"| {label} |" + " {} |" * 5,
          *(val(SEL, ".3f", "mean", metric="mass_trained", variant_spec=spec, eval_len=L) for L in (1024, 4096, 16384)),
          val(SEL, ".3f", "mean", metric="kept_trained", variant_spec=spec, eval_len=16384),
          val(SEL, ".3f", "mean", metric="mass_random", variant_spec=spec, eval_len=4096))
quote(RESULTS, "at 16K, {} and {} against {} for the window), and their recall of full attention's top 16 keys is {} "
      "and {} against {}",
      *(val(SEL, ".3f", "mean", metric=m, variant_spec=s, eval_len=16384) for m in ("mass_trained", "recall_trained")
        for s in ("moba", "quest", "sliding_window:window=256")))
SSM = "accuracy-selective-smollm2-cpu.jsonl"


def answered(spec: str) -> list[V]:
    """Passkey k/n at depths 0, 0.5, 1 and RULER's niah_single_1, as the SmolLM2 selection table writes them."""
    return [*(kn(SSM, variant_spec=spec, task="passkey", metric="exact_match", depth=d) for d in (0.0, 0.5, 1.0)),
            kn(SSM, variant_spec=spec, task="ruler", metric="string_match")]


quote(RESULTS, "| `full` | 1 (all keys) | 1 | 1 | {} {} {} · {} |", *answered("full"))
for label, spec, asked in (
        ("`sliding_window:window=512`", "sliding_window:window=512,backend=blocked", True),
        ("`sliding_window:sinks=4,window=508`", "sliding_window:sinks=4,window=508,backend=blocked", False),
        ("`block_sparse` (64, 1 global + 7 local)",
         "block_sparse:block_size=64,global_blocks=1,local_blocks=7,backend=gathered", True),
        ("`moba:block_size=64,topk=8`", "moba:block_size=64,topk=8", True),
        ("`quest:page_size=16,token_budget=512`", "quest:page_size=16,token_budget=512", True),
        ("`sliding_window:window=256`", "sliding_window:window=256,backend=blocked", False),
        ("`moba` (default, 256 keys)", "moba", False), ("`quest` (default, 256 keys)", "quest", False)):
    quote(RESULTS, f"| {label} | {{}} | {{}} | {{}} | " + ("{} {} {} · {} |" if asked else "-- |"),
          *(val(SSM, ".3f", "mean", variant_spec=spec, metric=m, eval_len=L)
            for m, L in (("mass_checkpoint", 4096), ("mass_checkpoint", 8192), ("recall_checkpoint", 4096))),
          *(answered(spec) if asked else []))
SC = "selective-cpu.jsonl"
for label, spec, sel in (("`full`", "full", "0"), ("`moba`", "moba", "{} M"), ("`quest`", "quest", "{} M")):
    quote(RESULTS, f"| {label} | {{}} ms | {{}} ms | {{}} ms | {{}} ms | {{}} → {{}} MiB | {sel} |",
          ms(SC, ".1f", **FWD, seq_len=4096, variant_spec=spec), ms(SC, ".1f", **FWD, **K64, variant_spec=spec),
          ms(SC, ".2f", **DEC, seq_len=1024, variant_spec=spec), ms(SC, ".2f", **DEC, **K64, variant_spec=spec),
          mib(SC, ".1f", **DEC, seq_len=1024, variant_spec=spec), mib(SC, ".1f", **DEC, **K64, variant_spec=spec),
          *([V(SC, {**DEC, **K64, "variant_spec": spec}, "selection_flops", spec=".2f", scale=1e-6)] if sel != "0" else []))
SL, LS = "accuracy-selection-learned-cpu.jsonl", "accuracy-lm-selective-cpu.jsonl"
for label, source, spec in (("`sliding_window:window=256`", "trained", SW),
                            ("`nsa:topk=4`", "trained (mean pooling)", "nsa:topk=4"), ("`nsa:topk=4`", "own", "nsa:topk=4"),
                            ("`dsa:topk=256,kl_weight=1`", "own", "dsa:kl_weight=1.0,topk=256")):
    src = source.split()[0]
    quote(RESULTS, f"| {label} | {source} | {{}} | {{}} | {{}} | {{}} | {{}} |",
          *(val(SL, ".3f", "mean", variant_spec=spec, metric=f"mass_{src}", eval_len=L) for L in (1024, 4096, 16384)),
          val(SL, ".3f", "mean", variant_spec=spec, metric=f"kept_{src}", eval_len=16384),
          val(SL, ".3f", "mean", variant_spec=spec, metric=f"recall_{src}", eval_len=16384))
quote(RESULTS, "(0.558 at 4K against MoBA's {} in the same run; Quest {})",
      *(val(SL, ".3f", "mean", variant_spec=v, metric="mass_trained", eval_len=4096) for v in ("moba", "quest")))
for label, spec in (("`full`", "full"), ("`moba`", "moba"), ("`nsa:topk=4`", "nsa:topk=4"),
                    ("`dsa:topk=256,kl_weight=1`", "dsa:kl_weight=1.0,topk=256")):
    quote(RESULTS, f"| {label} | {{}} | {{}} | {{}} |",
          *(val(LS, ".3f", metric="bpb", variant_spec=spec, eval_len=L) for L in (256, 1024, 4096)))
RM = "selective-remeasure-cpu.jsonl"
for label, spec, mode, L, fmt in (("`full` forward 16K", "full", FWD, 16384, ".1f"),
                                  ("`full` forward 32K", "full", FWD, 32768, ".1f"),
                                  ("`sliding_window:window=256` forward 4K", SW, FWD, 4096, ".1f"),
                                  ("`dsa:topk=256` forward 1K", "dsa:topk=256", FWD, 1024, ".1f"),
                                  ("`dsa:topk=256` forward 4K", "dsa:topk=256", FWD, 4096, ".1f"),
                                  ("`full` decode 8K", "full", DEC, 8192, ".2f"),
                                  ("`moba` decode 64K", "moba", DEC, 65536, ".2f")):
    quote(RESULTS, f"| {label} | {{}} ms | {{}} |", ms(RM, fmt, **mode, seq_len=L, variant_spec=spec),
          V(RM, {**mode, "seq_len": L, "variant_spec": spec}, "peak_fraction", "one", ".2f"))
SN = "selective-nsa-cpu.jsonl"
for label, spec in (("`full`", "full"), ("`sliding_window:window=256`", SW), ("`nsa:topk=4`", "nsa:topk=4")):
    sel = "0" if spec != "nsa:topk=4" else "{} M"
    quote(RESULTS, f"| {label} | {{}} ms | {{}} ms | {{}} ms | {{}} ms | {{}} ms | {{}} MiB | {sel} |",
          *(ms(SN, ".1f", **FWD, seq_len=L, variant_spec=spec) for L in (4096, 16384, 65536)),
          ms(SN, ".2f", **DEC, seq_len=1024, variant_spec=spec), ms(SN, ".2f", **DEC, **K64, variant_spec=spec),
          mib(SN, ".1f", **DEC, **K64, variant_spec=spec),
          *([V(SN, {**DEC, **K64, "variant_spec": spec}, "selection_flops", spec=".2f", scale=1e-6)] if sel != "0" else []))
quote(RESULTS, "NSA's forward peak at 64K, {} MiB", mib(SN, ".0f", **FWD, **K64, variant_spec="nsa:topk=4"))
for label, file, spec in (("`nsa`", "accuracy-mqar-nsa-cpu.jsonl", "nsa:block_len=8,select_block=16,stride=4,topk=3,window=16"),
                          ("`dsa:topk=48,kl_weight=1`", "accuracy-mqar-dsa-cpu.jsonl", "dsa:kl_weight=1.0,topk=48")):
    quote(RESULTS, f"| {label} | {{}} | {{}} | {{}} | {{}} |",
          *(val(file, ".3f", metric="accuracy", variant_spec=spec, d_model=w, eval_len=L)
            for w, L in ((32, 64), (64, 64), (32, 128), (64, 128))))
MB16 = "moba:block_size=16,topk=3"
quote(RESULTS, "at 128 (0.855 at width 32, {} at 64): NSA 0.970 and {}, DSA 0.993 and {} with 48 raw keys a query, beside "
      "`full`'s 0.997 and {}",
      val(MS, ".3f", "mean", metric="accuracy", variant_spec=MB16, d_model=64, eval_len=128),
      val("accuracy-mqar-nsa-cpu.jsonl", ".3f", metric="accuracy", d_model=64, eval_len=128),
      val("accuracy-mqar-dsa-cpu.jsonl", ".3f", metric="accuracy", d_model=64, eval_len=128),
      val(MA, ".3f", "mean", metric="accuracy", variant_spec="full", d_model=64, eval_len=128))
quote(RESULTS, "(GLA {} -> {} at 128 from width 32 to 64)",
      *(val(MR, ".3f", "mean", metric="accuracy", variant_spec="gla", d_model=w, eval_len=128) for w in (32, 64)))

LENS = (256, 512, 1024, 2048, 4096)
BPB = {"task": "lm", "metric": "bpb"}
for pos in ("none", "rope", "rope_linear", "rope_ntk", "rope_dynamic", "rope_llama3", "rope_yarn"):
    quote(RESULTS, f"| `{pos}` |" + " {} |" * 7,
          *(val(FL, ".2f", "mean", **BPB, position=pos, stage="zero_shot", eval_len=L) for L in LENS),
          *(val(FL, ".2f", "mean", **BPB, position=pos, stage="finetune", eval_len=L) for L in (256, 4096)))
quote(RESULTS, "worse than plain RoPE at 2x ({} vs {})",
      *(val(FL, ".2f", "mean", **BPB, position=p, stage="zero_shot", eval_len=512) for p in ("rope_linear", "rope")))
quote(RESULTS, "(at 2x: RoPE {}, YaRN {}, NTK {}, PI {})",
      *(val(FL, ".2f", "mean", **PASSKEY, position=p, stage="zero_shot", eval_len=512)
        for p in ("rope", "rope_yarn", "rope_ntk", "rope_linear")))
NOT_PI = {**PASSKEY, "stage": "finetune", "eval_len": 512, "position": lambda p: p != "rope_linear"}
quote(RESULTS, "every method but PI does at 2x ({}–{}; PI {})", V(FL, NOT_PI, agg="min", by=("position",)),
      V(FL, NOT_PI, agg="max", by=("position",)),
      val(FL, ".2f", "mean", **PASSKEY, position="rope_linear", stage="finetune", eval_len=512))
quote(RESULTS, "at 4x or more none gets past {}",
      V(FL, {**PASSKEY, "eval_len": lambda n: n >= 1024}, agg="max", by=("position", "stage", "eval_len")))
quote(RESULTS, "not after fine-tuning at 256: passkey {} (dynamic) vs {} (NTK), bits per byte {} vs {}",
      *(val(FL, ".2f", "mean", **m, position=p, stage="finetune", eval_len=256)
        for m in (PASSKEY, BPB) for p in ("rope_dynamic", "rope_ntk")))
quote(RESULTS, "PI fine-tuned for 100 steps stays at {}",
      val(FL, ".2f", "mean", **PASSKEY, position="rope_linear", stage="finetune", eval_len=512))

PROBE = {"metric": "swap_exact_match"}
WIN = {**PROBE, "variant_spec": SW}
FULLP = {**PROBE, "variant_spec": "full"}
quote(RESULTS, "At 512 the window scores {} at depth 0.75 (full attention: {})",
      val(WP, **WIN, eval_len=512, depth=0.75), val(WP, **FULLP, eval_len=512, depth=0.75))
quote(RESULTS, "but {} at depth 1.0 (full: {})", val(WP, **WIN, eval_len=512, depth=1.0),
      val(WP, **FULLP, eval_len=512, depth=1.0))
quote(RESULTS, "depth 1.0 scores {} and {} (full: {} and {}), and every key outside the window scores {}",
      *(val(WP, **w, eval_len=L, depth=1.0) for w in (WIN, FULLP) for L in (1024, 2048)),
      V(WP, {**WIN, "row": lambda r: (r["eval_len"] >= 512 and r["depth"] <= 0.5)
             or (r["eval_len"] >= 1024 and r["depth"] <= 0.75)}, agg="max", spec=".0f"))
quote(RESULTS, "PI reaches {} and YaRN {}",
      *(val(FP, ".3f", "mean", **PASSKEY, position_spec=p, stage="finetune", eval_len=512) for p in ("rope_linear", "rope_yarn")))

for label, spec, pos in (("`full` · `none`", "full", "none"), ("`full` · `rope`", "full", "rope"),
                         ("`full` · `rope_yarn`", "full", "rope_yarn"), ("`full` · `alibi`", "full", "alibi"),
                         ("`retention` (RetNet)", "retention", "none"), ("`gla`", "gla", "none")):
    at = {**BPB, "variant_spec": spec, "position_spec": pos}
    quote(RESULTS, f"| {label} |" + " {} |" * 6, *(val(LG, ".2f", "mean", **at, stage="zero_shot", eval_len=L) for L in LENS),
          val(LG, ".2f", "mean", **at, stage="finetune", eval_len=4096))

quote(RESULTS, "(the best `string_match` of the 24 cells: {} for `full`, {} for the window)",
      *(val(f, ".3f", "max", metric="string_match") for f in (RU, RW)))


KD = "kvpress-decode-cpu.jsonl"
KD_PRESSES = (("`none`", "none"), *((f"`{p}` 0.5", f"{p}:compression_ratio=0.5") for p in (
    "streaming_llm", "snapkv", "tova", "knorm", "expected_attention", "pyramidkv")), ("`quantized:nbits=4`", "quantized:nbits=4"))
for label, spec in KD_PRESSES:
    quote(RESULTS, f"| {label} | {{}} ms | {{}} ms | {{}} MiB | {{}} ms |",
          *(V(KD, {"press_spec": spec, "mode": "decode", "seq_len": L}, "latency_ms") for L in (4096, 16384)),
          V(KD, {"press_spec": spec, "mode": "decode", "seq_len": 16384}, "kv_cache_bytes", scale=2**-20, spec=".0f"),
          V(KD, {"press_spec": spec, "mode": "forward", "seq_len": 16384}, "latency_ms"))

HY = "hybrid-cpu.jsonl"
for label, spec, kv, full_layers in (
        ("`full`", "full", None, 12), ("`full`, 2 key/value heads (GQA)", "full", 2, 12),
        ("`full`, 1 key/value head (MQA)", "full", 1, 12), ("`mla`", "mla", None, 12),
        ("`gpt-oss` (128-window with sinks; full)", "gpt-oss", None, 6),
        ("`gated_deltanet; full` (1 : 1)", "gated_deltanet; full", None, 6),
        ("`qwen3-next` (`gated_deltanet*3; full`, 3 : 1)", "qwen3-next", None, 3),
        ("`gemma3` (`sliding_window:window=512*5; full`)", "gemma3", None, 2),
        ("`sliding_window:window=512`", "sliding_window:window=512", None, 0),
        ("`gated_deltanet`", "gated_deltanet", None, 0), ("`mamba2`", "mamba2", None, 0)):
    at = {"variant_spec": spec, "num_kv_heads": kv, "num_heads": 4}
    quote(RESULTS, f"| {label} | {full_layers} | {{}} ms | {{}} ms | {{}} ms | {{}} MiB |",
          ms(HY, ".1f", **at, **FWD, seq_len=16384), ms(HY, ".2f", **at, **DEC, seq_len=1024),
          ms(HY, ".2f", **at, **DEC, seq_len=65536), V(HY, {**at, **DEC, "seq_len": 65536}, "state_bytes", spec=".2f", scale=MIB))
H4, H16 = {"num_heads": 4, "num_kv_heads": None}, {"num_heads": 16}
quote(RESULTS, "holds {} MiB at 64K against all-full's {}, a quarter",
      *(V(HY, {**H4, **DEC, "seq_len": 65536, "variant_spec": v}, "state_bytes", spec=".2f", scale=MIB)
        for v in ("qwen3-next", "full")))
quote(RESULTS, "decodes a token in {} ms against {} and prefills 16K in {} s against {} s",
      *(ms(HY, ".2f", **H4, **DEC, seq_len=65536, variant_spec=v) for v in ("qwen3-next", "full")),
      *(V(HY, {**H4, **FWD, "seq_len": 16384, "variant_spec": v}, "latency_ms", spec=".2f", scale=1e-3)
        for v in ("qwen3-next", "full")))
quote(RESULTS, "Its prefill is {}x `full`'s", ratio(ms(HY, "", **H4, **FWD, seq_len=16384, variant_spec="mla"),
                                                  ms(HY, "", **H4, **FWD, seq_len=16384, variant_spec="full")))
quote(RESULTS, "Gemma 3's 5 : 1 holds {} MiB",
      V(HY, {**H4, **DEC, "seq_len": 65536, "variant_spec": "gemma3"}, "state_bytes", spec=".2f", scale=MIB))
quote(RESULTS, "`gpt-oss`'s at 64K ({} ms, 8x its 32K step of {} ms)",
      *(ms(HY, ".2f", **H4, **DEC, seq_len=L, variant_spec="gpt-oss") for L in (65536, 32768)))
quote(RESULTS, "between MHA and GQA ({} MiB at 64K)",
      V(HY, {**H4, **DEC, "seq_len": 65536, "variant_spec": "mla"}, "state_bytes", spec=".2f", scale=MIB))
quote(RESULTS, "at 16 heads of 32 it holds {} MiB at 16K against {} (MHA), {} (4 key/value heads) and {} (MQA)",
      *(V(HY, {**H16, **DEC, "seq_len": 16384, "variant_spec": v, "num_kv_heads": kv}, "state_bytes", spec=".2f", scale=MIB)
        for v, kv in (("mla", None), ("full", None), ("full", 4), ("full", 1))))
quote(RESULTS, "the slowest step ({} ms at 64K), with 16 heads it matches MHA ({} ms against {} at 16K) and takes 1.9x "
      "GQA's {} ms", ms(HY, ".2f", **H4, **DEC, seq_len=65536, variant_spec="mla"),
      *(ms(HY, ".2f", **H16, **DEC, seq_len=16384, variant_spec=v, num_kv_heads=kv)
        for v, kv in (("mla", None), ("full", None), ("full", 4))))
quote(RESULTS, "MQA's decode at 64K ({} ms, no faster than MHA while GQA takes {})",
      *(ms(HY, ".2f", num_heads=4, **DEC, seq_len=65536, variant_spec="full", num_kv_heads=kv) for kv in (1, 2)))

HM = {32: "accuracy-hybrid-mqar-w32-cpu.jsonl", 64: "accuracy-hybrid-mqar-w64-cpu.jsonl"}
MQ = {"metric": "accuracy"}
for label, spec, full_layers, seeds in (
        ("`full`", "full", 8, (2, 1)), ("`gated_deltanet; full` (1 : 1)", "gated_deltanet; full", 4, (1, 0)),
        ("`gated_deltanet*3; full` (3 : 1)", "gated_deltanet*3; full", 2, (1, 0)),
        ("`gated_deltanet*7; full` (7 : 1)", "gated_deltanet*7; full", 1, (1, 1)),
        ("`gated_deltanet`", "gated_deltanet", 0, (1, 1)), ("`mamba2; full` (1 : 1)", "mamba2; full", 4, (2, 1)),
        ("`mamba2*3; full` (3 : 1)", "mamba2*3; full", 2, (2, 1)), ("`mamba2*7; full` (7 : 1)", "mamba2*7; full", 1, (2, 1)),
        ("`mamba2`", "mamba2", 0, (2, 1)), ("`mla`", "mla", 8, (1, 1))):
    widths = [w for w, n in zip((32, 64), seeds, strict=True) if n]
    cells = " | ".join(f"{{}} ({n})" if n else "not run" for n in seeds)
    state = " / ".join("{}" if n else "--" for n in seeds)
    quote(RESULTS, f"| {label} | {full_layers} | {cells} | {state} |",
          *(val(HM[w], ".3f", "mean", **MQ, variant_spec=spec) for w in widths),
          *(V(HM[w], {**MQ, "variant_spec": spec}, "state_numbers", "max", "n0") for w in widths))
quote(RESULTS, "`full` ({} at width 32, {} at 64) and `mla` ({} and {})",
      val(HM[32], ".3f", "mean", **MQ, variant_spec="full"), val(HM[64], ".3f", **MQ, variant_spec="full"),
      *(val(HM[w], ".3f", **MQ, variant_spec="mla") for w in (32, 64)))
GDN_ROWS = {**MQ, "variant_spec": lambda v: "gated_deltanet" in v}
quote(RESULTS, "over the 256 values ({}–{} at width 32, {}–{} at 64)",
      *(V(HM[w], GDN_ROWS, "train_loss", agg, ".3f") for w in (32, 64) for agg in ("min", "max")))
quote(RESULTS, "(width 32: `mamba2` {} and {}, `mamba2*3; full` {} and {})",
      *(val(HM[32], ".3f", **MQ, variant_spec=v, seed=seed) for v in ("mamba2", "mamba2*3; full") for seed in (0, 1)))

HG = {32: "accuracy-hybrid-gdn-mqar-w32-cpu.jsonl", 64: "accuracy-hybrid-gdn-mqar-w64-cpu.jsonl"}
HG_SEEDS = {32: (0, 1, 2), 64: (0, 1, 2)}
# the gated_deltanet : full ratios of the re-run (label, spec, full-attention layers of 8)
GDN_RATIOS = (
        ("`full`", "full", 8), ("`gated_deltanet; full` (1 : 1)", "gated_deltanet; full", 4),
        ("`gated_deltanet*3; full` (3 : 1)", "gated_deltanet*3; full", 2),
        ("`gated_deltanet*7; full` (7 : 1)", "gated_deltanet*7; full", 1), ("`gated_deltanet`", "gated_deltanet", 0))
for label, spec, full_layers in GDN_RATIOS:
    cells = " | ".join("{} (" + ", ".join("{}" for _ in HG_SEEDS[w]) + ")" for w in (32, 64))
    quote(RESULTS, f"| {label} | {full_layers} | {cells} | {{}} / {{}} |",
          *(v for w in (32, 64) for v in (val(HG[w], ".3f", "mean", **MQ, variant_spec=spec),
                                          *(val(HG[w], ".3f", **MQ, variant_spec=spec, seed=s) for s in HG_SEEDS[w]))),
          *(V(HG[w], {**MQ, "variant_spec": spec}, "state_numbers", "max", "n0") for w in (32, 64)))

HLM = "accuracy-hybrid-gdn-lm-cpu.jsonl"
for label, spec, full_layers in GDN_RATIOS:
    quote(RESULTS, f"| {label} | {full_layers} | {{}} | {{}} | {{}} |",
          *(val(HLM, ".3f", "mean", metric="bpb", variant_spec=spec, eval_len=L) for L in (128, 512)),
          val(HLM, ".3f", "mean", metric="bpb_tail", variant_spec=spec, eval_len=512))

quote(RESULTS, "({} for 3 : 1 against {})",
      *(val(HLM, ".3f", "mean", metric="bpb", variant_spec=v, eval_len=128) for v in ("gated_deltanet*3; full", "full")))
quote(RESULTS, "all-full breaks ({}; {} past 128", val(HLM, ".3f", "mean", metric="bpb", variant_spec="full", eval_len=512),
      val(HLM, ".3f", "mean", metric="bpb_tail", variant_spec="full", eval_len=512))
quote(RESULTS, "the 1 : 1 hybrid included ({})", val(HLM, ".3f", "mean", metric="bpb", variant_spec="gated_deltanet; full",
                                                     eval_len=512))
quote(RESULTS, "only all-full does ({} and {})", *(val(HG[w], ".3f", "mean", **MQ, variant_spec="full") for w in (32, 64)))
quote(RESULTS, "two seeds of three ({} and {}, the best mean, {})",
      *(val(HG[64], ".3f", **MQ, variant_spec="gated_deltanet*3; full", seed=s) for s in (0, 1)),
      V(HG[64], GDN_ROWS, "value", "max", ".3f", by=("variant_spec",)))
quote(RESULTS, "pure Gated DeltaNet in none (best {})", val(HG[64], ".3f", "max", **MQ, variant_spec="gated_deltanet"))
quote(RESULTS, "reaches it (best {})", V(HG[32], GDN_ROWS, "value", "max", ".3f"))
quote(RESULTS, "strongest recurrence at width 64 ({} at 128,", val(MG, ".3f", "mean", metric="accuracy", d_model=64,
                                                                  eval_len=128))
quote(RESULTS, "two seeds of three ({} above)", val(MG, ".3f", "mean", metric="accuracy", d_model=32, eval_len=128))

DV = "decode-variants-cpu.jsonl"
DV_SPECS = ("full", "full:alibi=true", "full:sink_logit=true", SW, SINKS, BSP, "linear", "retention", "gla",
            "gated_deltanet", "mamba2", "moba", "quest", "nsa", "dsa")
for spec in DV_SPECS:
    at = {**K16, "variant_spec": spec}
    quote(RESULTS, f"| `{spec}` | {{}} | {{}} | {{}} | {{}} |", ms(DV, "#.3g", **at), V(DV, at, "bytes", spec=".2f", scale=MIB),
          V(DV, at, "bandwidth_fraction"), V(DV, at, "bandwidth_peak_bytes_per_s", spec=".0f", scale=1e-9))
quote(RESULTS, "(`arithmetic_intensity` {}–{})", V(DV, {}, "arithmetic_intensity", "min"),
      V(DV, {}, "arithmetic_intensity", "max", ".1f"))
quote(RESULTS, "against the matmul peak every row is {}–{}%", V(DV, K16, "peak_fraction", "min", ".0f", 100),
      V(DV, K16, "peak_fraction", "max", ".0f", 100))
quote(RESULTS, "`full`'s 64 MiB cache streams at {} of the triad, the window's 1 MiB ring at {}",
      V(DV, {**K16, "variant_spec": "full"}, "bandwidth_fraction"), V(DV, {**K16, "variant_spec": SW}, "bandwidth_fraction"))
quote(RESULTS, "at 64K `full` {} ms, ALiBi {} ms, sink logits {} ms",
      *(ms(DV, ".2f", **K64, variant_spec=v) for v in ("full", "full:alibi=true", "full:sink_logit=true")))
quote(RESULTS, "(ALiBi {} ms against {}:", *(ms(DV, ".3f", seq_len=1024, variant_spec=v) for v in ("full:alibi=true", "full")))

SV, GIB = "serving-cpu.jsonl", {"budget_bytes": 2**30}
CAP_LENS = {"moba": 4, "quest": 4, "nsa": 4, "dsa": 2}  # lengths each ran to, of 8K..128K
for spec in ("full", SW, BSP, "linear", "gla", "gated_deltanet", "mamba2", "moba", "quest", "nsa", "dsa"):
    lens = [8192 * 2**i for i in range(CAP_LENS.get(spec, 5))]
    cells = [v for L in lens for v in (V(SV, {**GIB, "variant_spec": spec, "seq_len": L}, "capacity_batch", spec=".0f"),
                                       V(SV, {**GIB, "variant_spec": spec, "seq_len": L}, "tokens_per_s", spec=".0f"))]
    quote(RESULTS, f"| `{spec}` | " + " | ".join(["{}, {}"] * len(lens) + ["–"] * (5 - len(lens))) + " |", *cells)
ONE = {"budget_bytes": None, "seq_len": 16384}
for spec in ("full", SW, "linear", "gated_deltanet"):
    quote(RESULTS, f"| `{spec}` | {{}} | {{}} | {{}} | {{}} |", *(
        V(SV, {**ONE, "variant_spec": spec, "batch_size": b, "queries": q}, "tokens_per_s", spec=".0f")
        for b, q in ((1, None), (1, 4), (8, None), (8, 4))))
AT = {**GIB, "seq_len": 131072}
quote(RESULTS, "`full` holds {} sequences at 128K and decodes {} tokens/s; the 256-token window holds {} at every "
      "context and decodes {} tokens/s at 128K",
      V(SV, {**AT, "variant_spec": "full"}, "capacity_batch", spec=".0f"),
      V(SV, {**AT, "variant_spec": "full"}, "tokens_per_s", spec=".0f"),
      V(SV, {**AT, "variant_spec": SW}, "capacity_batch", spec=".0f"),
      V(SV, {**AT, "variant_spec": SW}, "tokens_per_s", spec=".0f"))
quote(RESULTS, "its gathered step at that batch is slow ({} ms)", ms(SV, ".0f", **AT, variant_spec=BSP))
quote(RESULTS, "`full`'s cells peaked at {} GiB", V(SV, {**GIB, "variant_spec": "full"}, "peak_mem_bytes", "min", ".1f", 2**-30))
quote(RESULTS, "{} ms for one token and {} ms for four at 16K",
      *(ms(SV, ".2f", **ONE, variant_spec="full", batch_size=1, queries=q) for q in (None, 4)))
quote(RESULTS, "eight sequences of one token take {} ms", ms(SV, ".1f", **ONE, variant_spec="full", batch_size=8, queries=None))

CR = "cpu-speed-roofline-cpu.jsonl"  # its kernel table is quoted with cpu-speed.jsonl's (KERNELS_16K)
quote(RESULTS, "`full` forward at 64K, {} s", sec(CR, ".1f", **FWD, **K64, variant_spec="full:backend=sdpa"))
quote(RESULTS, "`linear`'s forward is at {}% (target 20%", pct(CR, **FWD, **K16, variant_spec="linear:backend=chunked"))
quote(RESULTS, "`sliding_window` trains at {}% (target 30%", pct(CR, **TRAIN, **K16, variant_spec=SW))
quote(RESULTS, "`block_sparse` trains at {}% (target 25%", pct(CR, **TRAIN, **K16, variant_spec=BSP))
for spec in ("full", SW, BSP, "linear"):
    at = {**DEC, **K16, "variant_spec": spec}
    quote(RESULTS, f"| `{spec}` | {{}} | {{}} | {{}} |", ms(CR, "#.3g", **at), V(CR, at, "bytes", spec=".2f", scale=MIB),
          V(CR, at, "bandwidth_fraction"))
quote(RESULTS, "at {}, {} and {} of the measured bandwidth at 16K, 32K and 64K, and {} at 128K", *(
    V(CR, {**DEC, "variant_spec": "full", "seq_len": L}, "bandwidth_fraction") for L in (16384, 32768, 65536, 131072)))
quote(RESULTS, "the fraction passes 1 ({} at 4K)", V(CR, {**DEC, "variant_spec": "full", "seq_len": 4096}, "bandwidth_fraction"))
LL = "linear-long-cpu.jsonl"
quote(RESULTS, "| `linear` (s) | {} | {} | {} | {} | {} |", *(sec(LL, f, seq_len=L) for f, L in (
    (".3f", 65536), (".3f", 131072), (".3f", 262144), (".2f", 524288), (".2f", 1048576))))
quote(RESULTS, "The fitted slope over 64K–1M is {} (target ≤ 1.2; {} in `long-cpu.jsonl`",
      V(LL, {}, "latency_ms", "slope"),
      V(LONG, {"variant_spec": "linear", "seq_len": lambda n: n >= 65536}, "latency_ms", "slope"))
quote(RESULTS, "(the peak memory reaches {} GiB at 1M)", V(LL, {"seq_len": 2**20}, "peak_mem_bytes", spec=".1f", scale=2**-30))

HD = "hf-decode-cpu.jsonl"
LLAMA, SMOL = {"hf_config": "llama"}, {"hf_config": "smollm2-135m"}
for label, spec in (("`full` (DynamicCache)", "full"), ("`sliding_window:window=1024`", "sliding_window:window=1024"),
                    ("`block_sparse` (64 / 2 local / 1 global)", "block_sparse"), ("`linear`", "linear")):
    state = "grows" if spec == "full" else "{} MiB"
    quote(RESULTS, f"| {label} | {{}} | {{}} | {{}} | {state} |",
          *(ms(HD, ".2f", **LLAMA, variant_spec=spec, seq_len=L) for L in (1024, 8192, 65536)),
          *([] if spec == "full" else [V(HD, {**LLAMA, "variant_spec": spec, "seq_len": 1024}, "state_bytes", spec=".2f",
                                         scale=MIB)]))
for spec in ("full", "sliding_window:window=1024", "linear"):
    quote(RESULTS, f"| `{spec}` | {{}} | {{}} |", *(ms(HD, ".1f", **SMOL, variant_spec=spec, seq_len=L) for L in (1024, 4096)))
quote(RESULTS, "(the rows' `bandwidth_fraction` counts their weights once a step: {}–{} of the triad)",
      V(HD, {}, "bandwidth_fraction", "min"), V(HD, {}, "bandwidth_fraction", "max"))


VR = "variants-roofline-cpu.jsonl"
VR_SPECS = ("full", "full:alibi=true", "full:sink_logit=true", "full:prefix=512", SW, SINKS, BSP, "linear", "retention",
            "gla", "gated_deltanet")
quote(RESULTS, "| forward | " + " | ".join(["{}"] * len(VR_SPECS)) + " |",
      *(ms(VR, "n0", **FWD, **K64, variant_spec=v) for v in VR_SPECS))
quote(RESULTS, "| decode one token | " + " | ".join(["{}"] * len(VR_SPECS)) + " |",
      *(ms(VR, "#.3g", **DEC, **K64, variant_spec=v) for v in VR_SPECS))
quote(RESULTS, "faster than the window with sinks ({} against {} ms at 64K;",
      *(ms(VR, ".0f", **FWD, **K64, variant_spec=v) for v in (SW, SINKS)))

SR = "serving-ragged-cpu.jsonl"
EVEN, RAG = {"queries": None, "ragged": None}, {"queries": None, "ragged": 0.5}
for spec in ("full", SW, "linear", "gated_deltanet"):
    cells = [(EVEN, 1), (EVEN, 8), (EVEN, 32), (RAG, 8), (RAG, 32)]
    oom = spec == "gated_deltanet"  # its even batch of 32 ran out of memory in the prefill
    values = [V(SR, {**K16, **at, "variant_spec": spec, "batch_size": b}, "tokens_per_s", spec="n0")
              for at, b in cells if not (oom and at is EVEN and b == 32)]
    quote(RESULTS, f"| `{spec}` | {{}} | {{}} | {'oom' if oom else '{}'} | {{}} | {{}} |", *values)
B32 = {"batch_size": 32, "queries": None}
quote(RESULTS, "took {} ms for 32 sequences drawn around 16K", ms(SR, ".2f", **K16, **B32, ragged=0.5, variant_spec="full"))
quote(RESULTS, "against {} ms for 32 of 16K, and read its memory at {} of the bandwidth, against {},",
      ms(SR, ".2f", **K16, **B32, ragged=None, variant_spec="full"),
      V(SR, {**K16, **B32, "ragged": 0.5, "variant_spec": "full"}, "bandwidth_fraction", spec=".3f"),
      V(SR, {**K16, **B32, "ragged": None, "variant_spec": "full"}, "bandwidth_fraction", spec=".3f"))
quote(RESULTS, "64K in {} ms against {} ms for 32 of 64K",
      *(ms(SR, ".3f", **K64, **B32, ragged=r, variant_spec="linear") for r in (0.5, None)))
quote(RESULTS, "at B=32 takes {} ms against {} ms for one",
      ms(SR, ".2f", **K16, batch_size=32, queries=4, variant_spec=SW),
      ms(SR, ".3f", **K16, **B32, ragged=None, variant_spec=SW))

KC = "kernels-cpu.jsonl"
for label, spec, f in (("`block_sparse` / split", f"{BSP},backend=split", ".0f"),
                       ("`block_sparse` / gathered", f"{BSP},backend=gathered", ".0f"),
                       ("`sliding_window(256)` / blocked", f"{SW},backend=blocked", ".0f"),
                       ("`sliding_window(256)` / split", f"{SW},backend=split", ".0f"),
                       ("`sliding_window(1024)` / split", "sliding_window:window=1024,backend=split", ".0f"),
                       ("`sliding_window(1024)` / blocked", "sliding_window:window=1024,backend=blocked", ".0f")):
    at = {**TRAIN, **K16, "variant_spec": spec}
    target = {f"{BSP},backend=split": "25%", f"{SW},backend=blocked": "30%"}.get(spec, "")  # issue 34's targets
    quote(RESULTS, f"| {label} | {{}} | {{}}% | {target} |", ms(KC, f, **at), pct(KC, **at))
LIN = {**FWD, **K16, "variant_spec": "linear:backend=chunked"}
quote(RESULTS, "| `linear` / chunked, forward | {} | {}% | 20% |", ms(KC, ".1f", **LIN), pct(KC, **LIN))
quote(RESULTS, "`block_sparse` trains at {}% of the peak with `split` (target 25%)",
      pct(KC, **TRAIN, **K16, variant_spec=f"{BSP},backend=split"))
quote(RESULTS, "`blocked` reaches {}% (target 30%) and `split` {}%",
      *(pct(KC, **TRAIN, **K16, variant_spec=f"{SW},backend={b}") for b in ("blocked", "split")))
quote(RESULTS, "`split` wins ({}% against {}%)",
      *(pct(KC, **TRAIN, **K16, variant_spec=f"sliding_window:window=1024,backend={b}") for b in ("split", "blocked")))
quote(RESULTS, "`linear`'s forward stays short at {}% (target 20%)", pct(KC, **LIN))

HF = "hf-decode-full-cpu.jsonl"
quote(RESULTS, "| `VariantCache` (in place) | {} | {} | {} | {} |",
      *(ms(HF, ".2f", seq_len=L) for L in (8192, 16384, 32768, 65536)))
quote(RESULTS, "64K took {} ms through `DynamicCache` in `hf-decode-cpu.jsonl` and takes {} ms here",
      ms(HD, ".2f", **LLAMA, variant_spec="full", seq_len=65536), ms(HF, ".2f", seq_len=65536))


# -- issue 46: one evaluation pipeline (float32 against bfloat16, n arms sharing a prefill) -------------------------
DT, AS, BF = "dtype-smollm2-cpu.jsonl", "arms-sharing-cpu.jsonl", "accuracy-smollm2-bf16-cpu.jsonl"
SINKS_1K = "sliding_window:sinks=4,window=1024,backend=blocked"


def bf16_cells(spec: str) -> list[V]:
    """Passkey k/n at depths 0, 0.5, 1, niah_single_1 and perplexity at 2K: float32 (the committed run), bfloat16."""
    out = []
    for file in (SM, BF):
        out += [kn(file, variant_spec=spec, eval_len=2048, metric="exact_match", depth=d) for d in (0.0, 0.5, 1.0)]
    out += [kn(f, variant_spec=spec, eval_len=2048, metric="string_match", subtask="niah_single_1") for f in (SM, BF)]
    out += [val(f, ".3f", variant_spec=spec, eval_len=2048, metric="perplexity") for f in (SM, BF)]
    return out


quote(RESULTS, "| `full` | {} {} {} → {} {} {} | {} → {} | {} → {} |", *bf16_cells("full"))
quote(RESULTS, "| `sliding_window:sinks=4,window=1024` | {} {} {} → {} {} {} | {} → {} | {} → {} |", *bf16_cells(SINKS_1K))
quote(RESULTS, "perplexity moves by less than 0.1 % ({} → {} for `full`)",
      *(val(f, ".3f", variant_spec="full", eval_len=2048, metric="perplexity") for f in (SM, BF)))
quote(RESULTS, "bfloat16 takes a 4K prefill of SmolLM2 in {} ms against {} ms in float32",
      *(ms(DT, ".0f", seq_len=4096, dtype=d) for d in ("bfloat16", "float32")))
quote(RESULTS, "| float32 | {} ms | {} ms |", *(ms(DT, ".0f", seq_len=L, dtype="float32") for L in (2048, 4096)))
quote(RESULTS, "| bfloat16 | {} ms | {} ms |", *(ms(DT, ".0f", seq_len=L, dtype="bfloat16") for L in (2048, 4096)))


def arms(dtype: str, col: str = "eval_seconds", n: tuple[int, ...] = (1, 5, 10, 20), spec: str = ".1f") -> list[V]:
    return [V(AS, {"dtype": dtype, "n_arms": k}, col, "one", spec) for k in n]


for d in ("float32", "bfloat16"):
    t, r = arms(d), arms(d, "ratio_to_one", (5, 10, 20), ".2f")
    quote(RESULTS, f"| {d} | {{}} s | {{}} s ({{}}x) | {{}} s ({{}}x) | {{}} s ({{}}x) |",
          t[0], t[1], r[0], t[2], r[1], t[3], r[2])
quote(RESULTS, "Ten arms cost {}x one in float32 and {}x in bfloat16",
      *(V(AS, {"dtype": d, "n_arms": 10}, "ratio_to_one", "one", ".2f") for d in ("float32", "bfloat16")))


# -- issue 61: every arm's answer in one batch --------------------------------------------------------------------
AB = "arms-batch-cpu.jsonl"


def batch(dtype: str, col: str, n: int, decode: str = "batch", spec: str = ".1f") -> V:
    return V(AB, {"dtype": dtype, "n_arms": n, "decode": decode}, col, "one", spec)


for d in ("float32", "bfloat16"):
    quote(RESULTS, f"| {d} | {{}} s | {{}} s ({{}}x) | {{}} s ({{}}x) | {{}} s ({{}}x) | {{}} s ({{}}x) |",
          batch(d, "eval_seconds", 1), *(v for n, dec in ((5, "batch"), (10, "batch"), (20, "batch"), (20, "alone"))
                                         for v in (batch(d, "eval_seconds", n, dec),
                                                   batch(d, "ratio_to_one", n, dec, ".2f"))))
quote(RESULTS, "Twenty arms cost {}x one in float32 and {}x in bfloat16 (one at a time, in the same run: {}x and {}x)",
      batch("float32", "ratio_to_one", 20, spec=".2f"), batch("bfloat16", "ratio_to_one", 20, spec=".2f"),
      batch("float32", "ratio_to_one", 20, "alone", ".2f"), batch("bfloat16", "ratio_to_one", 20, "alone", ".2f"))
quote(RESULTS, "the bfloat16 run answers {} arm-examples an hour ({} one at a time)",
      *(batch("bfloat16", "arm_examples_per_hour", 20, dec, ".0f") for dec in ("batch", "alone")))
quote(RESULTS, "this one's float32 prefill is slower, {} s against {} s",
      batch("float32", "eval_seconds", 1), V(AS, {"dtype": "float32", "n_arms": 1}, "eval_seconds", "one", ".1f"))


# -- results/README.md: the text beside the tables, and docs/*.md --------------------------------------------------
VRC = "variants-cpu.jsonl"  # the earlier run of variants-roofline-cpu.jsonl's grid
quote(RESULTS, "the earlier run had them the other way round, {} against {} ms",
      *(ms(VRC, "n0", **FWD, **K64, variant_spec=v) for v in (SW, SINKS)))
FULL_FAMILY = ("full:alibi=true", "full:sink_logit=true", "full:prefix=512")
quote(RESULTS, "forward at 64K within {} s of plain `full`", Calc(lambda: max(
    abs(ms(VR, "", **FWD, **K64, variant_spec=v).number() - ms(VR, "", **FWD, **K64, variant_spec="full").number())
    for v in FULL_FAMILY) / 1e3, ".0f"))
quote(RESULTS, "ALiBi and the prefix took {} and {} s through Flex), and decode at {}–{} ms against its {}:",
      *(sec(VRC, ".1f", **FWD, **K64, variant_spec=v) for v in ("full:alibi=true", "full:prefix=512")),
      V(VR, {**DEC, **K64, "variant_spec": lambda v: v in FULL_FAMILY}, "latency_ms", "min"),
      V(VR, {**DEC, **K64, "variant_spec": lambda v: v in FULL_FAMILY}, "latency_ms", "max"),
      ms(VR, ".2f", **DEC, **K64, variant_spec="full"))
NOISY = {"noisy": True, "status": "ok"}
quote(RESULTS, "The {} noisy rows are `full`'s family forward at 32K and 64K ({} rows, one timed call each, {}–{} s a call) "
      "and ALiBi's decode at 64K (the triad changed by {}%",
      count(VR, **NOISY), count(VR, **NOISY, **FWD),
      V(VR, {**NOISY, **FWD}, "latency_ms", "min", ".0f", 1e-3), V(VR, {**NOISY, **FWD}, "latency_ms", "max", ".0f", 1e-3),
      Calc(lambda: 100 * (1 - V(VR, {**NOISY, **DEC}, "bandwidth_before_bytes_per_s").number()
                          / V(VR, {**NOISY, **DEC}, "bandwidth_after_bytes_per_s").number()), ".0f"))

KD16 = {"mode": "decode", "seq_len": 16384}
quote(RESULTS, "(`snapkv` {} ms against `none`'s {} ms) and little at 4K ({} against {} ms)",
      *(V(KD, {"press_spec": p, "mode": "decode", "seq_len": L}, "latency_ms")
        for L in (16384, 4096) for p in ("snapkv:compression_ratio=0.5", "none")))
PRESSED = {"mode": "forward", "seq_len": 16384, "press_spec": lambda p: p != "none"}
quote(RESULTS, "every press's prefill is within {}% of `none`'s ({}-{} s)",
      Calc(lambda: 100 * (V(KD, PRESSED, "latency_ms", "max").number()
                          / V(KD, {**PRESSED, "press_spec": "none"}, "latency_ms").number() - 1), ".0f"),
      V(KD, {"mode": "forward", "seq_len": 16384}, "latency_ms", "min", ".1f", 1e-3),
      V(KD, {"mode": "forward", "seq_len": 16384}, "latency_ms", "max", ".1f", 1e-3))
quote(RESULTS, "holds every token in {} MiB instead of {} MiB but is the slowest decoder here, {} ms at 16K",
      *(V(KD, {**KD16, "press_spec": p}, "kv_cache_bytes", spec=".0f", scale=MIB) for p in ("quantized:nbits=4", "none")),
      V(KD, {**KD16, "press_spec": "quantized:nbits=4"}, "latency_ms"))

SC_BSP = "block_sparse:block_size=64,local_blocks=3,global_blocks=1"
for label, spec in (("`sliding_window:window=256`", SW), ("`block_sparse` (64, 1 global + 3 local)", SC_BSP)):
    quote(RESULTS, f"| {label} | {{}} ms | {{}} ms | {{}} ms | {{}} ms | {{}} → {{}} MiB | 0 |",
          ms(SC, ".1f", **FWD, seq_len=4096, variant_spec=spec), ms(SC, ".1f", **FWD, **K64, variant_spec=spec),
          ms(SC, ".2f", **DEC, seq_len=1024, variant_spec=spec), ms(SC, ".2f", **DEC, **K64, variant_spec=spec),
          mib(SC, ".1f", **DEC, seq_len=1024, variant_spec=spec), mib(SC, ".1f", **DEC, **K64, variant_spec=spec))
quote(RESULTS, "| `nsa:topk=4` | {} ms | not run (16K timed out) | {} ms | out of memory | {} MiB → -- | -- |",
      ms(SC, ".1f", **FWD, seq_len=4096, variant_spec="nsa:topk=4"),
      ms(SC, ".2f", **DEC, seq_len=1024, variant_spec="nsa:topk=4"),
      mib(SC, ".1f", **DEC, seq_len=1024, variant_spec="nsa:topk=4"))
quote(RESULTS, "| `dsa:topk=256` | {} ms | not in the grid | {} ms | timed out | {} MiB → -- | -- |",
      ms(SC, ".1f", **FWD, seq_len=4096, variant_spec="dsa:topk=256"),
      ms(SC, ".2f", **DEC, seq_len=1024, variant_spec="dsa:topk=256"),
      mib(SC, ".1f", **DEC, seq_len=1024, variant_spec="dsa:topk=256"))
quote(RESULTS, "`full`'s forward at 32K claims {} of the matmul peak",
      V(SC, {**FWD, "seq_len": 32768, "variant_spec": "full"}, "peak_fraction"))
quote(RESULTS, "({} ms at 1K and at 64K, where `full` takes {} ms)", ms(SC, ".2f", "max", **DEC, variant_spec="moba",
      seq_len=lambda n: n in (1024, 65536)), ms(SC, ".1f", **DEC, **K64, variant_spec="full"))
quote(RESULTS, "Quest's is flat to 16K and {} ms at 64K, where its bound products over L/16 pages ({} MFLOP)",
      ms(SC, ".1f", **DEC, **K64, variant_spec="quest"),
      V(SC, {**DEC, **K64, "variant_spec": "quest"}, "selection_flops", spec=".1f", scale=1e-6))
quote(RESULTS, "({} and {} MiB at 64K against {})",
      *(mib(SC, ".0f", **DEC, **K64, variant_spec=v) for v in ("moba", "quest", "full")))
quote(RESULTS, "where the window holds {} MiB", mib(SC, ".1f", **DEC, **K64, variant_spec=SW))
quote(RESULTS, "is {}x faster than `full` at 64K ({} s against {} s) but {}-{}x slower than the fixed patterns",
      ratio(ms(SC, "", **FWD, **K64, variant_spec="full"), ms(SC, "", **FWD, **K64, variant_spec="moba")),
      *(sec(SC, ".1f", **FWD, **K64, variant_spec=v) for v in ("moba", "full")),
      *(ratio(ms(SC, "", **FWD, **K64, variant_spec="moba"), ms(SC, "", **FWD, **K64, variant_spec=v), ".0f")
        for v in (SW, SC_BSP)))
quote(RESULTS, "forward timed out at 16K ({} s) and its 64K decoding state (a 64K prefill) ran out of memory ({} GB)",
      V(SC, {**FWD, "seq_len": 16384, "variant_spec": "nsa:topk=4"}, "time_limit_s", spec=".0f"),
      Calc(lambda: int(re.search(r"allocate (\d+) bytes", V(SC, {**DEC, **K64, "variant_spec": "nsa:topk=4"}).matching()[0][
          "error"])[1]) / 1e9, ".0f"))
quote(RESULTS, "pair: {} s at 16K", sec(SC, ".1f", **FWD, seq_len=16384, variant_spec="dsa:topk=256"))

NSA4 = "nsa:topk=4"
quote(RESULTS, "now takes {}x `full`'s time there and {}x at 64K (in the first sweep it took {}x `full`'s at 4K; now {}x)",
      ratio(ms(SN, "", **FWD, **K16, variant_spec=NSA4), ms(SN, "", **FWD, **K16, variant_spec="full")),
      ratio(ms(SN, "", **FWD, **K64, variant_spec=NSA4), ms(SN, "", **FWD, **K64, variant_spec="full"), ".2f"),
      ratio(ms(SC, "", **FWD, seq_len=4096, variant_spec=NSA4), ms(SC, "", **FWD, seq_len=4096, variant_spec="full")),
      ratio(ms(SN, "", **FWD, seq_len=4096, variant_spec=NSA4), ms(SN, "", **FWD, seq_len=4096, variant_spec="full")))
quote(RESULTS, "one timed sample at {} of the matmul peak timed beside it; `selective-remeasure-cpu.jsonl`'s quiet sample "
      "of the same cell, {} ms, makes it {}x",
      V(SN, {**FWD, **K16, "variant_spec": "full", "timing_samples": 1}, "peak_fraction"),
      ms("selective-remeasure-cpu.jsonl", ".0f", **FWD, **K16, variant_spec="full"),
      ratio(ms(SN, "", **FWD, **K16, variant_spec=NSA4), ms("selective-remeasure-cpu.jsonl", "", **FWD, **K16,
                                                            variant_spec="full")))
quote(RESULTS, "NSA's forward grows as L^{} over this range against `full`'s L^{}",
      V(SN, {**FWD, "variant_spec": NSA4}, "latency_ms", "slope", ".1f"),
      V(SN, {**FWD, "variant_spec": "full"}, "latency_ms", "slope", ".2f"))
quote(RESULTS, "Decoding at 64K is {}x faster than `full`'s ({} against {} ms), but {}x the window's",
      ratio(ms(SN, "", **DEC, **K64, variant_spec="full"), ms(SN, "", **DEC, **K64, variant_spec=NSA4)),
      ms(SN, ".2f", **DEC, **K64, variant_spec=NSA4), ms(SN, ".2f", **DEC, **K64, variant_spec="full"),
      ratio(ms(SN, "", **DEC, **K64, variant_spec=NSA4), ms(SN, "", **DEC, **K64, variant_spec=SW), ".0f"))
quote(RESULTS, "{} MiB at 64K against `full`'s {}.", *(mib(SN, ".1f", **DEC, **K64, variant_spec=v) for v in (NSA4, "full")))
quote(RESULTS, "`full`'s forward at 16K (drawn hollow) claims {} of the matmul peak",
      V(SN, {**FWD, **K16, "variant_spec": "full"}, "peak_fraction"))
quote(RESULTS, "(the {} and {} above were a peak timed under load), and MoBA's 64K decoding step is {} ms.",
      V(SC, {**FWD, "seq_len": 32768, "variant_spec": "full"}, "peak_fraction"),
      V(SN, {**FWD, **K16, "variant_spec": "full"}, "peak_fraction"), ms(RM, ".2f", **DEC, **K64, variant_spec="moba"))

RECURRENT = ("linear", "retention", "gla", "gated_deltanet", "mamba2")
SELECTING = ("moba", "quest", "nsa", "dsa")
quote(RESULTS, "move a few hundred KiB to a few MiB in {}–{} ms",
      V(DV, {**K16, "variant_spec": lambda v: v in RECURRENT + SELECTING}, "latency_ms", "min"),
      V(DV, {**K16, "variant_spec": lambda v: v in RECURRENT + SELECTING}, "latency_ms", "max", ".1f"))
LOW, HIGH = (lambda b: b < 60e9), (lambda b: b >= 60e9)  # the two levels: none of the rows lies between 55 and 65 GB/s
quote(RESULTS, "The triad itself measured two levels from cell to cell on this VM, {}–{} and {}–{} GB/s",
      *(V(DV, {"bandwidth_peak_bytes_per_s": level}, "bandwidth_peak_bytes_per_s", agg, ".0f", 1e-9)
        for level in (LOW, HIGH) for agg in ("min", "max")))
quote(RESULTS, "(were {}, {} and {} ms in `variants-cpu.jsonl`, on another machine)",
      *(ms(VRC, ".1f" if v == "full:alibi=true" else ("#.3g"), **DEC, **K64, variant_spec=v)
        for v in ("full", "full:alibi=true", "full:sink_logit=true")))
quote(RESULTS, "(ALiBi {} ms against {}: a fixed ~{} µs per step for the bias)",
      *(ms(DV, ".3f", seq_len=1024, variant_spec=v) for v in ("full:alibi=true", "full")),
      Calc(lambda: 1e3 * (ms(DV, "", seq_len=1024, variant_spec="full:alibi=true").number()
                          - ms(DV, "", seq_len=1024, variant_spec="full").number()), ".0f"))

RECURRENCES = {**GIB, "variant_spec": lambda v: v in ("linear", "gla", "gated_deltanet", "mamba2")}
quote(RESULTS, "a recurrent step writes a new state beside the old one and the one-step undo the harness rewinds with ({}–{} "
      "GiB for 1 GiB of state)", V(SV, RECURRENCES, "peak_mem_bytes", "min", ".1f", 2**-30),
      V(SV, RECURRENCES, "peak_mem_bytes", "max", ".1f", 2**-30))

for label, spec, mode, fmt, target in (("`linear` elu1 / chunked, forward", "linear:backend=chunked", FWD, ".1f", 20),
                                       ("`sliding_window` / blocked, train", SW, TRAIN, ".0f", 30),
                                       ("`block_sparse` / gathered, train", BSP, TRAIN, ".0f", 25)):
    quote(RESULTS, f"| {label} | {{}} ms | {{}}% | {target}%, was {{}}% |", ms(CR, fmt, **mode, **K16, variant_spec=spec),
          pct(CR, **mode, **K16, variant_spec=spec), pct(CS, **mode, **K16, variant_spec=spec))
quote(RESULTS, "batched chunk steps raised it from {}%", pct(CS, **FWD, **K16, variant_spec="linear:backend=chunked"))
quote(RESULTS, "where 256K → 512K went from {} to {} s)", *(sec(LONG, ".2f" if L == 2**18 else ".1f", variant_spec="linear",
                                                                  seq_len=L) for L in (2**18, 2**19)))
quote(RESULTS, "measured `linear` at {} ms at 64K through", ms(HL, ".1f", **DEC, **K64, variant_spec="linear"))

SP = {"task": "passkey", "metric": "exact_match"}
QUEST512 = "quest:page_size=16,token_budget=512"
quote(RESULTS, "where Quest selects: {} s for 8 examples at depth 0, {}x full attention's time",
      V(SSM, {**SP, "variant_spec": QUEST512, "depth": 0.0}, "eval_seconds", spec=".0f"),
      ratio(V(SSM, {**SP, "variant_spec": QUEST512, "depth": 0.0}, "eval_seconds"),
            V(SSM, {**SP, "variant_spec": "full", "depth": 0.0}, "eval_seconds"), ".0f"))


def mass(spec: str, L: int, metric: str = "mass_checkpoint") -> V:
    return val(SSM, ".3f", "mean", variant_spec=spec, metric=metric, eval_len=L)


quote(RESULTS, "At 512 keys Quest keeps {} of full attention's mass at 4K and {} at 8K, more than any fixed pattern, and "
      "at 256 keys ({}) it still beats every 512-key pattern. MoBA keeps {} at 4K, more than the plain window ({}) but "
      "less than block-sparse ({}) or 4 sinks beside the window ({})",
      mass(QUEST512, 4096), mass(QUEST512, 8192), mass("quest", 4096), mass("moba:block_size=64,topk=8", 4096),
      mass("sliding_window:window=512,backend=blocked", 4096),
      mass("block_sparse:block_size=64,global_blocks=1,local_blocks=7,backend=gathered", 4096),
      mass("sliding_window:sinks=4,window=508,backend=blocked", 4096))
quote(RESULTS, "Quest finds the passkey in {}, {} and {} of 8 at the three depths and the needle in {} of 8",
      *(k(SSM, **SP, variant_spec=QUEST512, depth=d) for d in (0.0, 0.5, 1.0)),
      k(SSM, task="ruler", metric="string_match", variant_spec=QUEST512))
quote(RESULTS, "Full attention finds {}, {} and {} of 8", *(k(SSM, **SP, variant_spec="full", depth=d) for d in (0.0, 0.5, 1.0)))
quote(RESULTS, "MoBA solves MQAR at 64 tokens ({} at width 32, where the first block holds every pair) and loses some of it "
      "at 128 ({} / {})", val(MS, ".3f", "mean", metric="accuracy", d_model=32, eval_len=64),
      *(val(MS, ".3f", "mean", metric="accuracy", d_model=w, eval_len=128) for w in (32, 64)))


def sel(spec: str, L: int, metric: str = "mass_trained") -> V:
    return val(SEL, ".3f", "mean", metric=metric, variant_spec=spec, eval_len=L)


quote(RESULTS, "the two selectors keep {}-{}x the window's mass at 4K and {}-{}x at 16K",
      *(ratio(sel(v, L), sel(SW, L)) for L in (4096, 16384) for v in ("moba", "quest")))
quote(RESULTS, "at 16K a query reads {}% of its keys", V(SEL, {"metric": "kept_trained", "variant_spec": SW, "eval_len": 16384},
                                                         "value", "mean", ".0f", 100))
quote(RESULTS, "(0.558 at 4K against MoBA's", val(SL, ".3f", "mean", variant_spec="nsa:topk=4", metric="mass_trained",
                                                      eval_len=4096))
quote(RESULTS, "its own model's q and k give {} and {}",
      *(val(SL, ".3f", "mean", variant_spec="nsa:topk=4", metric="mass_own", eval_len=L) for L in (4096, 16384)))
DSA1 = "dsa:kl_weight=1.0,topk=256"
quote(RESULTS, "barely beats its budget at length: {} at 4K with {} of the keys, {} at 16K with {}",
      *(val(SL, ".3f", "mean", variant_spec=DSA1, metric=m, eval_len=L) for L in (4096, 16384) for m in ("mass_own", "kept_own")))
quote(RESULTS, "DSA is {} worse with the same attention at 256", Calc(
    lambda: val(LS, metric="bpb", variant_spec=DSA1, eval_len=256).number()
    - val(LS, metric="bpb", variant_spec="full", eval_len=256).number(), ".2f"))
quote(RESULTS, "RoPE breaks `full`, MoBA and DSA alike ({} to {} at 4x), while NSA stays at {} and {}",
      V(LS, {"metric": "bpb", "eval_len": 1024, "variant_spec": lambda v: v != "nsa:topk=4"}, agg="min", spec=".1f"),
      V(LS, {"metric": "bpb", "eval_len": 1024, "variant_spec": lambda v: v != "nsa:topk=4"}, agg="max", spec=".1f"),
      *(val(LS, metric="bpb", variant_spec="nsa:topk=4", eval_len=L) for L in (1024, 4096)))
quote(RESULTS, "Every task scores {} at 1K, 2K and 4K for both variants",
      Calc(lambda: max(V(f, {"metric": "string_match"}, agg="max").number() for f in (RU, RW)), ".3f"))

KP = "accuracy-kvpress-smollm2-cpu.jsonl"
KV_ARMS = (("`none` (4086 tokens)", {"press_spec": "none"}), *((f"`{p}`", {"press_spec": f"{p}:compression_ratio=0.5"}) for p in (
    "streaming_llm", "snapkv", "tova", "knorm", "expected_attention", "pyramidkv")),
           ("`sliding_window:window=2048`", {"variant_spec": "sliding_window:window=2048,backend=blocked"}),
           ("`sliding_window:sinks=4,window=2044`", {"variant_spec": "sliding_window:sinks=4,window=2044,backend=blocked"}),
           ("`block_sparse` (1 global + 15 local blocks)",
            {"variant_spec": "block_sparse:block_size=128,global_blocks=1,local_blocks=15,backend=gathered"}))
for label, arm in KV_ARMS:
    quote(RESULTS, f"| {label} | {{}} {{}} {{}} · {{}} |", *(k(KP, **arm, **SP, depth=d) for d in (0.0, 0.5, 1.0)),
          k(KP, **arm, task="ruler", metric="string_match"))
TOVA, KNORM = "tova:compression_ratio=0.5", "knorm:compression_ratio=0.5"
quote(RESULTS, "(`tova` {}), as the window does; only block-sparse's global first block keeps it ({})",
      kn(KP, **SP, press_spec=TOVA, depth=0.0), kn(KP, **SP, **dict(KV_ARMS[-1][1]), depth=0.0))
quote(RESULTS, "lose the middle key too and every RULER needle ({})",
      kn(KP, press_spec="snapkv:compression_ratio=0.5", task="ruler", metric="string_match"))
quote(RESULTS, "`tova` and `knorm` keep the middle key and {} needles, beating the window with the same memory ({})",
      kn(KP, press_spec=TOVA, task="ruler", metric="string_match"),
      kn(KP, **dict(KV_ARMS[-3][1]), task="ruler", metric="string_match"))


PYR = {"press_spec": "pyramidkv:compression_ratio=0.5", "seq_len": 16384}
quote(RESULTS, "(the matmul peak moved {}% and {}% across the cell after every retry)", *(Calc(
    lambda m=m: int(re.search(r"changed by (\d+)%", V(KD, {**PYR, "mode": m}).matching()[0]["noisy_reason"])[1]), ".0f")
    for m in ("forward", "decode")))
quote(RESULTS, "(DSA to 16K: its quadratic prefill made the 16K cell take {} s)",
      V(DV, {**K16, "variant_spec": "dsa"}, "cell_wall_s", spec=".0f"))
quote(RESULTS, "(a {} KiB state each)", Calc(lambda: V(SV, {**AT, "variant_spec": "gla"}, "state_bytes").number()
                                             / V(SV, {**AT, "variant_spec": "gla"}, "capacity_batch").number() / 2**10, ".0f"))
quote(RESULTS, "`train_seconds` ({}) include the time it was stopped",
      V(HM[32], {"variant_spec": "gated_deltanet", "seed": 0}, "train_seconds", "max", ".0f"))

quote(RESULTS, "`block_sparse`'s band fits {} sequences", V(SV, {**AT, "variant_spec": BSP}, "capacity_batch", spec=".0f"))
quote(RESULTS, "at {}–{} thousand tokens/s, whatever the context",
      V(SV, RECURRENCES, "tokens_per_s", "min", ".0f", 1e-3), V(SV, RECURRENCES, "tokens_per_s", "max", ".0f", 1e-3))
quote(RESULTS, "Of the {} noisy cells, two are single-sample calls", count(CR, noisy=True))
SW512 = "sliding_window:window=512,backend=blocked"
quote(RESULTS, "where the window finds none of them ({}, {}, {}, {}). MoBA finds the key at depth 0 in every example ({})",
      *(kn(SSM, **SP, variant_spec=SW512, depth=d) for d in (0.0, 0.5, 1.0)),
      kn(SSM, task="ruler", metric="string_match", variant_spec=SW512),
      kn(SSM, **SP, variant_spec="moba:block_size=64,topk=8", depth=0.0))

# -- docs/*.md -------------------------------------------------------------------------------------------------------
MEAS, ACC, VARS = "docs/measurement.md", "docs/accuracy.md", "docs/variants.md"


def cost_files() -> list[str]:
    return [f for f in committed() if "task" not in rows(f)[0]]


def noisy_rows(file: str) -> int:
    return sum(r.get("noisy") is True and r["status"] == "ok" for r in rows(file))


quote(MEAS, "Committed results hold {} noisy rows (of {} cost rows, in {} files)",
      Calc(lambda: sum(noisy_rows(f) for f in cost_files()), "n0"),
      Calc(lambda: sum(len(rows(f)) for f in cost_files()), "n0"),
      Calc(lambda: sum(noisy_rows(f) > 0 for f in cost_files()), "n0"))
quote(ACC, "`--preset quick` wrote its rows over {} minutes on the 2-core CPU", Calc(lambda: (
    max(datetime.fromisoformat(r["timestamp"]) for r in rows("accuracy-quick-cpu.jsonl"))
    - min(datetime.fromisoformat(r["timestamp"]) for r in rows("accuracy-quick-cpu.jsonl"))).total_seconds() / 60))
quote(ACC, "its RULER models alone took {}-{} min each on 1 thread here",
      Calc(lambda: min(V(f, {}, "train_seconds", "max").number() for f in (RU, RW)) / 60, ".0f"),
      Calc(lambda: max(V(f, {}, "train_seconds", "max").number() for f in (RU, RW)) / 60, ".0f"))


def faster(slow: str, fast: str, agg: str, **where: Any) -> Calc:
    """The smallest or largest ratio, over the lengths where both ran, of ``slow``'s latency to ``fast``'s."""
    def fn() -> float:
        at = {**FWD, **where}
        a = {r["seq_len"]: r["latency_ms"] for r in V(TG, {**at, "variant_spec": slow}, agg="mean").matching()}
        b = {r["seq_len"]: r["latency_ms"] for r in V(TG, {**at, "variant_spec": fast}, agg="mean").matching()}
        return {"min": min, "max": max}[agg](a[L] / b[L] for L in a.keys() & b.keys())
    return Calc(fn, ".2f" if slow.startswith("sliding") else ".1f")


quote(VARS, "`sliding_window` flex ({}–{}× faster than blocked at 4K–32K;",
      *(faster(f"{SW},backend=blocked", f"{SW},backend=flex", a, seq_len=lambda n: 4096 <= n <= 32768) for a in ("min", "max")))
quote(VARS, "`block_sparse` flex ({}–{}× faster than gathered), `linear` chunked ({}× faster than the recurrence at 16K)",
      *(faster(f"{BSP},backend=gathered", f"{BSP},backend=flex", a) for a in ("min", "max")),
      ratio(ms(TG, "", **FWD, **K16, variant_spec="linear:backend=recurrent"),
            ms(TG, "", **FWD, **K16, variant_spec="linear:backend=chunked")))


# -- issue 49: the dynamic sparse prefills' cost (results/README.md, prefill-cost-cpu.jsonl) ---------------------------
PC = "prefill-cost-cpu.jsonl"


def prefill_specs(L: int) -> list[tuple[str, str]]:
    """(label, spec) of the table's rows at length L: full, block_sparse with a band of L/16 keys (~1/8 of the causal
    pairs), each method's ~1/8 setting."""
    return [("`full`", "full:backend=sdpa"),
            ("`block_sparse` (L/16 band)", f"block_sparse:block_size=64,local_blocks={L // 1024},global_blocks=1,backend=flex"),
            ("`xattention:threshold=0.1`", "xattention:threshold=0.1"),
            ("`flexprefill:gamma=0.3`", "flexprefill:gamma=0.3,min_budget=128"),
            ("`vertical_slash` (L/16 columns)", f"vertical_slash:vertical_size={L // 16},slash_size={100 + L // 512}")]


for L in (4096, 8192, 16384, 32768):
    full_at = {**FWD, "seq_len": L, "variant_spec": "full:backend=sdpa"}
    for label, spec in prefill_specs(L):
        at = {**FWD, "seq_len": L, "variant_spec": spec}
        here = ms(PC, ".1f", **at)
        if spec.startswith("full"):
            quote(RESULTS, f"| {L // 1024}K | {label} | 1 | {{}} ms | 1 | 1 | 0 |", here)
            continue
        flops = ratio(V(PC, at, "flops", "one"), V(PC, full_at, "flops", "one"), ".2f")
        speed = ratio(ms(PC, "", **full_at), here, ".2f")
        if spec.startswith("block"):  # a fixed layout: its pairs are its FLOPs, nothing to choose
            quote(RESULTS, f"| {L // 1024}K | {label} | {{}} | {{}} ms | {{}}× | {{}} | 0 |",
                  ratio(V(PC, at, "flops", "one"), V(PC, full_at, "flops", "one"), ".3f"), here, speed, flops)
            continue
        quote(RESULTS, f"| {L // 1024}K | {label} | {{}} | {{}} ms | {{}}× | {{}} | {{}}% |",
              V(PC, at, "density", "one", ".3f"), here, speed, flops, V(PC, at, "choose_share", "one", ".0f", 100))


K16_AT = {**FWD, **K16}
quote(RESULTS, "at 16K `flexprefill` computes {} of `full`'s FLOPs and runs {}× faster, XAttention {} and {}×, "
      "`block_sparse` {} and {}×",
      *(c for spec in ("flexprefill:gamma=0.3,min_budget=128", "xattention:threshold=0.1",
                       "block_sparse:block_size=64,local_blocks=16,global_blocks=1,backend=flex")
        for c in (ratio(V(PC, {**K16_AT, "variant_spec": spec}, "flops", "one"),
                        V(PC, {**K16_AT, "variant_spec": "full:backend=sdpa"}, "flops", "one"), ".2f"),
                  ratio(ms(PC, "", **K16_AT, variant_spec="full:backend=sdpa"), ms(PC, "", **K16_AT, variant_spec=spec),
                        ".2f"))))
quote(RESULTS, "(at 16K {} % of the matmul peak, where `full`'s SDPA runs at {} %)",
      pct(PC, **K16_AT, variant_spec="vertical_slash:vertical_size=1024,slash_size=132"),
      pct(PC, **K16_AT, variant_spec="full:backend=sdpa"))


# -- issue 49: the dynamic sparse prefills in SmolLM2 at 8K (results/README.md, prefill-*-smollm2-cpu.jsonl) ----------
PP, PR = "prefill-passkey-smollm2-cpu.jsonl", "prefill-ruler-smollm2-cpu.jsonl"
PREFILL_ROWS = (  # (label, variant_spec as rows hold it, budget setting)
    ("`xattention:threshold=0.5`", "xattention:threshold=0.5", "1/8"),
    ("`xattention:threshold=0.85`", "xattention:threshold=0.85", "1/4"),
    ("`flexprefill:gamma=0.6,min_budget=128`", "flexprefill:gamma=0.6,min_budget=128", "1/8"),
    ("`flexprefill:gamma=0.85,min_budget=256`", "flexprefill:gamma=0.85,min_budget=256", "1/4"),
    ("`vertical_slash:vertical_size=100,slash_size=180`", "vertical_slash:slash_size=180,vertical_size=100", "1/8"),
    ("`vertical_slash:vertical_size=200,slash_size=300`", "vertical_slash:slash_size=300,vertical_size=200", "1/4"),
)


@cache
def prefill_points() -> Any:
    """The frontier's points of SmolLM2's frontier file and the two prefill files together (the same prompts)."""
    from harness.analysis import frontier as FR

    return FR.points(list(rows(FS)) + list(rows(PP)) + list(rows(PR)))


def point(method: str, task: str, budget: str, col: str, length: int = 8192) -> Calc:
    def fn() -> float:
        p = prefill_points()
        got = p[(p["eval_len"] == length) & (p["method"] == method) & (p["task"] == task) & (p["budget"] == budget)]
        return float(got[col].iloc[0])
    return Calc(fn, ".2f")


def scored(method: str, task: str, budget: str) -> list[Calc]:
    return [point(method, task, budget, c) for c in ("score", "ci_low", "ci_high")]


def ran(file: str, **where: Any) -> bool:
    return any(all(r.get(k) == v for k, v in where.items()) for r in rows(file)) if file in committed() else False


# -- issue 51: retrieval beside the frontier's arms (results/README.md, retrieval-*-cpu.jsonl) ------------------------
RS, RQ, RT = "retrieval-smollm2-cpu.jsonl", "retrieval-qwen-cpu.jsonl", "retrieval-time-cpu.jsonl"
RETRIEVED = ("bm25", "dense", "keys")


@dataclass(frozen=True)
class Text:
    """Words derived from rows (the best press's name and score): ``fn()`` as it returns them."""

    fn: Callable[[], str] = field(hash=False)

    def render(self) -> str:
        return self.fn()


@cache
def retrieval_points(file: str) -> Any:
    """The frontier's points of a frontier file with its retrieval file (the same prompts)."""
    from harness.analysis import frontier as FR

    return FR.points([r for f in (file, *FRONTIER_WITH[file]) if f in committed() for r in rows(f)])


def retrieval_point(file: str, L: int, task: str, method: str, budget: str) -> Any:
    """The ok point of one method on one task at one budget (full and quantized caches: at every token), or none."""
    p = retrieval_points(file)
    hit = p[(p["eval_len"] == L) & (p["task"] == task) & (p["method"] == method) & (p["status"] == "ok")
            & (p["budget"] == ("" if method in ("full", "quantized 4-bit") else budget))]
    assert len(hit) <= 1, (file, L, task, method)
    return hit


def cell(file: str, L: int, task: str, method: str, budget: str = "1/8") -> Text:
    """``0.70 [0.48, 0.85]``: the method's score on the task with its interval, or ``-`` where it did not run."""
    def fn() -> str:
        hit = retrieval_point(file, L, task, method, budget)
        if not len(hit):
            return "-"
        score, lo, hi = (float(hit[c].iloc[0]) for c in ("score", "ci_low", "ci_high"))
        return f"{score:.2f} [{lo:.2f}, {hi:.2f}]"
    return Text(fn)


def best(file: str, L: int, task: str, kind: str, budget: str = "1/8") -> Text:
    """The best-scoring method of a kind on the task at the budget (ties named together), and its score."""
    def fn() -> str:
        p = retrieval_points(file)
        hit = p[(p["eval_len"] == L) & (p["task"] == task) & (p["kind"] == kind) & (p["budget"] == budget)
                & (p["status"] == "ok") & ~p["method"].str.contains("query-aware")]
        if not len(hit):
            return "-"
        top = hit[hit["score"] == hit["score"].max()].sort_values("method")
        return ", ".join(f"`{m}`" for m in top["method"]) + " " + cell(file, L, task, top["method"].iloc[0], budget).fn()
    return Text(fn)


def recall(file: str, L: int, retriever: str, task: str, budget: str = "1/8") -> V:
    ratio_ = {"1/4": 0.75, "1/8": 0.875, "1/16": 0.9375}[budget]
    return V(file, {"eval_len": L, "task": "passkey" if task == "passkey" else "ruler", "metric": METRIC_OF[task],
                    "press_spec": f"retrieval:retriever={retriever},compression_ratio={ratio_}",
                    **({} if task == "passkey" else {"subtask": task})}, "needle_recall", "mean", ".2f")


METRIC_OF = {"passkey": "exact_match", "niah_single_1": "string_match", "niah_multikey_1": "string_match",
             "fwe": "string_match"}


def score(file: str, L: int, task: str, method: str, budget: str = "1/8", col: str = "score") -> Calc:
    def fn() -> float:
        hit = retrieval_point(file, L, task, method, budget)
        assert len(hit) == 1, (file, L, task, method)
        return float(hit[col].iloc[0])
    return Calc(fn, ".2f")


# issue 60: what independent passkey haystacks cost (two runs of one cell, beside other work)
PD = "passkey-draws-smollm2-cpu.jsonl"
quote(RESULTS, "the same depth-0 cell took {} s in the first run and {} s in the second",
      *(V(PD, {"press_spec": "none", "depth": 0.0, "draws": d}, "eval_seconds", "one", ".0f") for d in (None, 4)))

GC = "frontier-cost-gemma3-cpu.jsonl"  # Gemma 3's decode step in its own pattern, float32, at 8K
PRUNED = {"press": lambda p: p in ("snapkv", "keydiff", "expected_attention", "tova")}  # one cache shape
quote(RESULTS, "took {} to {} ms, each close to its own samples (KeyDiff's interquartile range {} ms)",
      V(GC, PRUNED, "latency_ms", "min", ".0f"), V(GC, PRUNED, "latency_ms", "max", ".0f"),
      V(GC, {"press": "keydiff"}, "latency_iqr_ms", "one", ".1f"))
quote(RESULTS, "a ratio under {}x between two cells is not resolved",
      Calc(lambda: V(GC, PRUNED, "latency_ms", "max").number() / V(GC, PRUNED, "latency_ms", "min").number(), ".1f"))
quote(RESULTS, "below full's {} ms", V(GC, {"press": "none"}, "latency_ms", "one", ".0f"))

TIMED = (("`none` (every key)", "none"), ("SnapKV at 1/8", "snapkv:compression_ratio=0.875"),
         *((f"`retrieval:retriever={r}` at 1/8", f"retrieval:retriever={r},compression_ratio=0.875") for r in RETRIEVED))


def time_table() -> None:
    """Seconds a prompt of each arm alone at 8K (median over the prompts), retrieval's parts, the ratio to SnapKV's."""
    for label, spec in TIMED:
        at = {"press_spec": spec}
        parts = ("{} s | {} s" if spec.startswith("retrieval") else "- | -")
        quote(RESULTS, f"| {label} | {{}} s | {parts} | {{}}x |", V(RT, at, "value", "one", ".2f"),
              *((V(RT, at, "retrieval_seconds", "one", ".2f"), V(RT, at, "prefill_seconds", "one", ".2f"))
                if spec.startswith("retrieval") else ()), V(RT, at, "ratio_to_press", "one", ".2f"))


if RT in committed():
    time_table()
    BM, DN, KY = (f"retrieval:retriever={r},compression_ratio=0.875" for r in RETRIEVED)
    quote(RESULTS, "Retrieval at 1/8 answers a prompt in {} s with BM25 against SnapKV's {} s at the same budget ({}x) and "
          "`none`'s {} s: it never prefills the 8K context, which a press must before it compresses. Scoring the chunks "
          "takes {} s with BM25, {} s with MiniLM and {} s with the model's first layer",
          V(RT, {"press_spec": BM}, "value", "one", ".2f"), V(RT, {"press_spec": TIMED[1][1]}, "value", "one", ".2f"),
          V(RT, {"press_spec": BM}, "ratio_to_press", "one", ".2f"), V(RT, {"press_spec": "none"}, "value", "one", ".2f"),
          V(RT, {"press_spec": BM}, "retrieval_seconds", "one", ".3f"),
          V(RT, {"press_spec": DN}, "retrieval_seconds", "one", ".2f"),
          V(RT, {"press_spec": KY}, "retrieval_seconds", "one", ".2f"))


# -- the kernel engineer's loop: sweep --base against the commit before linear's rebuild, and one profile -----------

KB, KP, CSR = "base-linear-chunked-cpu.jsonl", "profile-sliding-window-cpu.jsonl", "cpu-speed-roofline-cpu.jsonl"
SWF, SWB, FULL_SDPA = f"{SW},backend=flex", f"{SW},backend=blocked", "full:backend=sdpa"
BS128, BS64 = ("block_sparse:block_size=128,local_blocks=3,global_blocks=0,backend=flex",
               "block_sparse:block_size=64,local_blocks=5,global_blocks=0,backend=flex")


def base_speedups() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    from harness.cost.versus import pairs, speedups

    return speedups(pairs(list(rows(KB))))


def implied(length: int) -> float:
    """linear's chunked forward in the two committed files of the cpu-speed grid: before its rebuild / after."""
    at = {"variant": "linear", "backend": "chunked", "mode": "forward", "seq_len": length}
    return V(CS, at, "latency_ms").number() / V(CSR, at, "latency_ms").number()


def profiled(spec: str) -> dict[str, Any]:
    (row,) = V(KP, {"variant_spec": spec}, "latency_ms").matching()
    return row


def share(spec: str, op: str) -> Calc:
    return Calc(lambda: 100 * next(t["share"] for t in profiled(spec)["profile_top"] if t["op"].startswith(op)))


def ns_per_pair(spec: str) -> float:
    """Nanoseconds per (query, key) pair the variant's FLOP count holds (4 x head_dim FLOPs a pair, every head)."""
    row = profiled(spec)
    return row["latency_ms"] * 1e6 / (row["flops"] / (4 * row["head_dim"]))


if KB in committed():
    cells_kb, means_kb = base_speedups()
    for c in cells_kb:
        n = int(c["label"].rsplit("L=", 1)[1])
        quote(RESULTS, f"| {n // 1024}K | {{}} ms | {{}} ms | {{}}x [{{}}, {{}}] | {c['check']} |",
              V(KB, {"side": "base", "seq_len": n}, "latency_ms", "one", ".1f"),
              V(KB, {"side": "head", "seq_len": n}, "latency_ms", "one", ".1f"),
              *(Calc(lambda c=c, k=k: c[k], ".2f") for k in ("speedup", "low", "high")))
    (mean_kb,) = means_kb.values()
    quote(RESULTS, "geometric mean over the three lengths {}x [{}, {}]",
          *(Calc(lambda k=k: mean_kb[k], ".2f") for k in ("geomean", "low", "high")))
    peaked = {"row": lambda r: bool(r.get("peak_flops_per_s"))}
    quote(RESULTS, "matmul peaks differ ({}–{} against {}–{} GFLOP/s in their sections)",
          *(V(f, peaked, "peak_flops_per_s", agg, ".0f", 1e-9) for f in (CS, CSR) for agg in ("min", "max")))
    quote(RESULTS, "imply {}x, {}x and {}x (geometric mean {}x)",
          *(Calc(lambda n=n: implied(n), ".2f") for n in (4096, 16384, 65536)),
          Calc(lambda: math.exp(statistics.mean(math.log(implied(n)) for n in (4096, 16384, 65536))), ".2f"))
    quote(RESULTS, "`linear` reaches {} of the matmul peak at 64K and {} at 16K",
          V(KB, {"side": "head", "seq_len": 65536}, "peak_fraction"), V(KB, {"side": "head", "seq_len": 16384}, "peak_fraction"))

if KP in committed():
    quote(RESULTS, "`sliding_window`'s Flex forward at 16K takes {} ms, {} of the matmul peak; {}% of its profiled "
          "self time is one generated C++ kernel",
          V(KP, {"variant_spec": SWF}, "latency_ms", "one", ".0f"), V(KP, {"variant_spec": SWF}, "peak_fraction"),
          share(SWF, "graph_0_kernel"))
    quote(RESULTS, "{} ns per pair the window keeps, against {} ns for `full`'s SDPA kernel in the same run ({} of the "
          "peak)", Calc(lambda: ns_per_pair(SWF), ".2f"), Calc(lambda: ns_per_pair(FULL_SDPA), ".2f"),
          V(KP, {"variant_spec": FULL_SDPA}, "peak_fraction"))
    quote(RESULTS, "64 key tiles (`block_sparse`, five local blocks of 64: 320 keys a query) take {} ms, {} of the peak; "
          "three tiles of 128 with one partial instead of two take {} ms",
          V(KP, {"variant_spec": BS64}, "latency_ms", "one", ".0f"), V(KP, {"variant_spec": BS64}, "peak_fraction"),
          V(KP, {"variant_spec": BS128}, "latency_ms", "one", ".0f"))
    quote(RESULTS, "The `blocked` backend ({} ms) spends {}% in ATen's flash kernel and {}% in `fill_` and {}% in "
          "`copy_`", V(KP, {"variant_spec": SWB}, "latency_ms", "one", ".0f"),
          share(SWB, "aten::_scaled_dot_product_flash"), share(SWB, "aten::fill_"), share(SWB, "aten::copy_"))
    band_ms = lambda: ns_per_pair(FULL_SDPA) * profiled(SWF)["seq_len"] * 384 * profiled(SWF)["num_heads"] / 1e6  # noqa: E731
    quote(RESULTS, "at `full`'s cost per pair the window's tiles would take about {} ms, {} of the matmul peak counted "
          "on the window's own pairs", Calc(band_ms, ".0f"),
          Calc(lambda: profiled(SWF)["peak_fraction"] * profiled(SWF)["latency_ms"] / band_ms(), ".2f"))


# -- the tests -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("file", committed())
def test_every_committed_run_has_its_section_with_the_conditions_its_rows_hold(file):
    doc = text(RESULTS)
    assert f"### `{file}`" in doc, f"results/README.md has no section for {file}"
    cost = "task" not in rows(file)[0]
    assert (cost_conditions if cost else accuracy_conditions)(file) in doc, file


@pytest.mark.parametrize("q", QUOTES, ids=lambda q: f"{q.doc}: {q.template[:60]}")
def test_the_quoted_number_is_the_committed_rows(q):
    rendered = q.render()
    assert rendered in text(q.doc), f"{q.doc} should say: {rendered!r}"


def test_every_quote_is_checked_and_reads_a_committed_file():
    assert {q.doc for q in QUOTES} <= {README, *GUARDED} and {README, RESULTS} <= {q.doc for q in QUOTES}
    assert all(v.file in committed() for q in QUOTES for v in q.values if isinstance(v, V))


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", [README, RESULTS, *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))])
def test_every_link_and_image_path_exists(doc):
    body = re.sub(r"```.*?```", "", (ROOT / doc).read_text(), flags=re.S)
    body = re.sub(r"`[^`]*`", "", body)
    for target in LINK.findall(body):
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        path = (ROOT / doc).parent / target.split("#", 1)[0]
        assert path.exists(), f"{doc} links to {target}, which does not exist"


def test_the_readme_stays_short_and_keeps_its_two_commands():
    readme = (ROOT / README).read_text()
    assert len(readme.splitlines()) <= 250
    assert "bash scripts/main.sh" in readme and "bash scripts/test.sh" in readme


# -- the guard: a measured-looking figure in a doc that no quote above renders ---------------------------------------
# A figure: a number with a unit of time, memory, bandwidth, throughput, speed-up or share (12 ms, 1.5 s, 3 GiB,
# 45 GB/s, 4.5x, 17%), or a number with two or more decimals (0.935). Code (fenced or in backticks) and link targets
# are not read. A figure passes when a rendered quote holds it, when it lies in a phrase of SETTINGS below (a run's
# settings, a target, a fact about code or hardware, a number this test cannot derive). A table row of
# results/README.md with a number in it must be rendered whole by one quote.
FIGURE = re.compile(r"(?<![\w.:])(?:\d{1,3}(?: \d{3})+|\d+(?:\.\d+)?)(?:[x×]|\s?(?:ms|s|min|minutes|µs|GiB|MiB|KiB|GB/s|GB|MB"
                    r"|GFLOP/s|MFLOP|%))(?![\w/])|(?<![\w.:])\d+\.\d{2,}(?![\w.])")
GUARDED = (RESULTS, *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
SETTINGS: dict[str, tuple[str, ...]] = {
    RESULTS: (
        "can reach p < 0.05 (five draws cannot: at best p = 0.0625)",  # the exact sign test's smallest p on 5 draws
        "(at most 1.5x; at least 6,000 an hour)",  # issue 61's targets
        "(44M parameters, 176 MB in fp32,",  # the llama preset's size
        "L3 is 32 MiB", "its cache fits in the 32 MiB L3", "a fresh 64 MiB allocation", "calls moving 64 MiB or more",
        "fits 1 GiB", "| at 1 GiB: sequences", "What a 1 GiB budget buys", "the 15 % limit",
        "a layer's keys are 32 MiB", "cannot exceed 32 MiB), so every step page-faulted 8 fresh 32 MiB tensors",
        "between 16 MiB and 32 MiB", "at ratios 0.5, 0.25, 0.75", "the target (2x for ten)", "time: ratio 0.75",
        "a fresh layer keeps 0.99 a token",  # Mamba-2's initial decay, not a result
        "hold 16 KiB of state",  # a Gated DeltaNet layer's state at 4 heads of 32: a count, not a measurement
        "`max_run_time` 100 s", "took longer than 100 s",  # long-headline's setting
        "(loss ln 256 = 5.55)", "At 4x the length", "llama3 is best at 2x–4x and YaRN from 8x on",
        "barely better at 16x", "steps at 2x every", "a 4x longer fine-tune",
    ),
    ACC: ("a memory cap (80 % of what is free)",),
    "docs/gpu.md": (
        "lent for 15 minutes", "(Python 3.12, torch 2.11+cu130,", "budgeted at 330 s", "the budget + 60 s",
        "has 25 s to stop", "against the 15 minutes", "| machine start | - | ≤ 60 s |", "| install | 30 s | ≤ 30 s |",
        "a 90 s hang guard", "| equivalence | 110 s | ≤ 110 s |", "at most 4x the error", "| sweep | 170 s | ≤ 170 s |",
        "| report | 20 s | ≤ 20 s |", "| ≤ 10 s |", "| total | 330 s | ≤ 400 s (6.7 min) | 8 of the 15 minutes",
        "the larger of 80% of the memory",
    ),
    "docs/hf.md": ("past 32 MiB a layer",),
    "docs/frontier.md": ("keeps at least 85% of `full`'s score", "both at 1.00 (or 0.00)",
                         "full scores between 0.5 and 0.95",  # the probe's bounds: settings, not results
                         "minus 0.85 x `full`'s", "Keeping 85% of a",  # the tested effective length's line
                         "an adjusted p of 0.05 or more"),  # the continuation table's level
    MEAS: (
        "A call slower than 50 ms", "= 20 ms (a 0.2 ms decoding step", "one 4 KiB page",
        "an extra 64 MiB buffer during its call is reported 64 MiB (within 4 MiB)",
        "overstated a step 255× at 512",  # the old count's ratio, (L + 1) keys against one read of the state
        "arrays of 64 MiB (512 MiB on CUDA)", "moves at least 64 MiB",
        "(its `bytes`, at least 48 KiB)", "a 0.2 s window resolves about 0.05 cores",
        "more than 15 %", "exceeds 20 % of the median", "plus 0.25 cores", "reached 90 % of the limit",
        "under 5 % of its memory", "(Python ≥ 3.11;", "on 3.10)",
    ),
    "docs/plugins.md": ("at most 4x what the",),
    "docs/scaling.md": ("a 128 MiB object store", "plus 10 minutes"),
    "docs/sweep.md": ("~20 ms per sample", "3 × 64 MiB on CPU, 3 × 512 MiB on CUDA", "15 % apart, the peak 15 % below",
                      "left free + 0.25, a latency IQR above 20 %"),
    VARS: ("a fresh layer's step at 0.01",),
}


# -- the frontier's tables: `attn-bench frontier FILE --heading-level 4`, pasted whole under the file's section ---------

def frontier_files() -> list[str]:
    return [f for f in committed() if f.startswith("frontier-") and "task" in rows(f)[0]]


@cache
def frontier_markdown(file: str) -> str:
    from harness.analysis import frontier as FR
    from harness.analysis.frontier_cost import cost_lines

    pts = FR.points([r for f in (file, *FRONTIER_WITH.get(file, ())) for r in rows(f)])
    cost = cost_lines(list(rows(FRONTIER_COST[file])), pts, "1/8", "#####") if file in FRONTIER_COST else []
    return " ".join((FR.markdown(pts, FR.FrontierConfig(level=4)) + "\n".join(cost)).split())


FC16 = "frontier-cost-16k-prefill-cpu.jsonl"  # the prefill and decode step at 16K, one machine's run
FRONTIER_COST = {FS: FC, FQ: FC, "frontier-qwen-probed-4k-cpu.jsonl": FC16,
                 "frontier-qwen-probed-16k-cpu.jsonl": FC16, "frontier-gemma3-cpu.jsonl": GC,  # a section's --cost file
                 "frontier-qwen-8k-passkey-cpu.jsonl": FC, "frontier-qwen-8k-ruler-cpu.jsonl": FC}


@pytest.mark.parametrize("file", frontier_files())
def test_the_frontier_tables_are_rendered_from_their_rows(file):
    """Every number of the ranking, effective-length and did-not-run tables is the command's output on the rows."""
    assert frontier_markdown(file) in text(RESULTS), (
        f"paste `attn-bench frontier results/{file} {' '.join(f'results/{f}' for f in FRONTIER_WITH.get(file, ()))} "
        "--heading-level 4`")


# -- the task probe: `attn-bench probe FILE --heading-level 4`, pasted whole under the file's section ------------------

def probe_files() -> list[str]:
    return [f for f in committed() if f.startswith("probe-")]


@cache
def probe_markdown(file: str) -> str:
    from harness.analysis.probe import lines, probe

    return " ".join("\n".join(lines(probe(list(rows(file))), head="####")).split())


@pytest.mark.parametrize("file", probe_files())
def test_the_probe_tables_are_rendered_from_their_rows(file):
    """Each task's score, interval, draws and verdict, and the tasks kept, are the command's output on the rows."""
    assert probe_markdown(file) in text(RESULTS), f"paste `attn-bench probe results/{file} --heading-level 4`"


# -- the answers: `attn-bench answers DOC`, every block rendered from today's rows ------------------------------------

@cache
def answer_blocks(doc: str) -> tuple[str, ...]:
    """The doc's answer blocks as the renderer makes them from the committed rows (whitespace folded)."""
    from harness.analysis.questions import BLOCK, answer

    body = (ROOT / doc).read_text()
    return tuple(" ".join(answer(m[2], ROOT / "results", body).split()) for m in BLOCK.finditer(body))


@pytest.mark.parametrize("doc", [README, RESULTS])
def test_the_answers_are_rendered_from_todays_rows(doc):
    """What a block says (its tables, claims, files and their freshness) is what the renderer makes of today's rows and
    today's history: a claim no test supports, or a file called fresh whose code has changed, fails here."""
    from harness.analysis.questions import BLOCK

    body = (ROOT / doc).read_text()
    committed_blocks = [" ".join(m[0].split("-->", 1)[1].rsplit("<!--", 1)[0].split()) for m in BLOCK.finditer(body)]
    assert committed_blocks and committed_blocks == list(answer_blocks(doc)), f"run `attn-bench answers {doc}`"


def spans(pattern: str, body: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(pattern, body, flags=re.S)]


def covered(doc: str) -> list[tuple[int, int]]:
    """Where the rendered quotes, the conditions lines, the allowed phrases, code and links lie."""
    body = text(doc)
    out = spans(r"```.*?```", body) + spans(r"`[^`]*`", body) + spans(r"\]\([^)]*\)", body)
    rendered = [q.render() for q in QUOTES if q.doc == doc] + list(SETTINGS.get(doc, ()))
    rendered += list(answer_blocks(doc)) if doc in (README, RESULTS) else []
    if doc == RESULTS:
        rendered += [(cost_conditions if "task" not in rows(f)[0] else accuracy_conditions)(f) for f in committed()]
        rendered += [frontier_markdown(f) for f in frontier_files()] + [probe_markdown(f) for f in probe_files()]
    for r in rendered:
        out += [(m.start(), m.start() + len(r)) for m in re.finditer(re.escape(r), body)]
    return out


def uncovered(doc: str) -> list[str]:
    body, cover = text(doc), covered(doc)
    return [body[max(0, m.start() - 50):m.end() + 10] for m in FIGURE.finditer(body)
            if not any(a <= m.start() and m.end() <= b for a, b in cover)]


@pytest.mark.parametrize("doc", GUARDED)
def test_every_measured_figure_in_a_doc_is_a_quote_or_a_named_setting(doc):
    assert not uncovered(doc), f"{doc}: figures no quote renders (quote them, or name the phrase in SETTINGS)"


def test_every_table_row_of_results_readme_with_a_number_is_a_quote():
    lines = [" ".join(line.split()) for line in (ROOT / RESULTS).read_text().splitlines()]
    body, cover = text(RESULTS), covered(RESULTS)
    pos, missing = 0, []
    for i, line in enumerate(lines):
        start = body.find(line, pos) if line else pos
        pos = start + len(line)
        if not line.startswith("|") or set(line) <= set("|- ") or (i + 1 < len(lines) and lines[i + 1].startswith("|-")):
            continue
        if re.search(r"\d", re.sub(r"`[^`]*`", "", line)) and not any(a <= start and pos <= b for a, b in cover):
            missing.append(line)
    assert not missing, missing


def test_every_named_setting_is_in_its_doc():
    for doc, phrases in SETTINGS.items():
        assert not [p for p in phrases if p not in text(doc)], doc
