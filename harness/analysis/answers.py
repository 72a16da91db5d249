"""The answers' renderers: each question of :mod:`harness.analysis.questions` turns its files' rows into markdown
lines here -- tables, and claims each with its paired test (:mod:`harness.analysis.claims`). Nothing typed by hand."""
from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness import schema
from harness.analysis import claims as C
from harness.analysis import frontier as FR

AT = "1/8"
FAMILY = {"reference": "full", "oracle": "oracle", "press": "press", "variant": "variant", "quantized": "quantized",
          "retrieval": "retrieval", "prefill": "prefill-sparse"}


def _all(rows: dict[str, list[dict[str, Any]]], files: Sequence[str] | None = None) -> list[dict[str, Any]]:
    return [r for f in (files or rows) for r in rows[f]]


def probed(rows: dict[str, list[dict[str, Any]]]) -> set[tuple[str, int]]:
    """The (subject, length) pairs a probed frontier holds."""
    return {(schema.subject(r), int(r["eval_len"])) for f in PROBED_FILES for r in rows.get(f, ()) if r.get("eval_len")}


def frontier_rows(rows: dict[str, list[dict[str, Any]]], files: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of ``files``, where a probed frontier holds a subject at a length only the probed files' rows there:
    the other files asked that model other prompts at that length (passkey's keys shared a haystack), and the frontier
    pairs arms prompt by prompt -- pooled, one file's cells would replace the other's, not add draws."""
    there = probed(rows)
    return [r for f in files for r in rows.get(f, ())
            if f in PROBED_FILES or (schema.subject(r), int(r.get("eval_len") or 0)) not in there]


def _iv(score: float, lo: float, hi: float) -> str:
    return f"{score:.2f} [{lo:.2f}, {hi:.2f}]"


def _short(c: C.Claim | None, me: str) -> str:
    """``me`` against the other method of claim ``c``, in a table cell."""
    if c is None:
        return "-"
    if c.verdict.startswith("tie"):
        return c.verdict
    if c.verdict == "not resolved":
        return f"not resolved ({C.p_text(c.p_adj)})"
    higher = c.a if c.verdict == "above" else c.b
    return f"{'above' if higher == me else 'below'} ({C.p_text(c.p_adj)})"


def subject(rows: list[dict[str, Any]], model: str) -> str:
    """What the checkpoint is, from its rows: the file's name says the weights and their quantisation."""
    r = next(r for r in rows if r.get("model") == model and r.get("model_file"))
    name = Path(str(r["model_file"])).name
    quant = re.search(r"[.-](q\d\w*)\.gguf$", name, flags=re.I)
    what = name[: quant.start()] if quant else name
    chat = any(x.get("chat_template") is True for x in rows if x.get("model") == model)
    return (f"{what}, a 4-bit GGUF file ({quant[1].upper()}) dequantised on load" if quant else what) + (
        ", prompted with its chat template" if chat else ", prompted without a chat template")


def _order(rows: list[dict[str, Any]], models: Sequence[str]) -> list[str]:
    size = {r.get("model"): r.get("params") or 0 for r in rows}
    return sorted(models, key=lambda m: (size.get(m, 0), m))


# -- what each method keeps --------------------------------------------------------------------------------------------

# the frontiers on the tasks each model's probe chose (full half-solves them): where one holds a model at a length, it
# is the model's frontier there, and a subject that has one is summarised at its longest probed length
PROBED_FILES = ("frontier-qwen-probed-4k-cpu.jsonl", "frontier-qwen-probed-16k-cpu.jsonl",
                "frontier-qwen-8k-passkey-cpu.jsonl", "frontier-qwen-8k-ruler-cpu.jsonl",
                "frontier-gemma3-probed-cpu.jsonl", "frontier-smollm2-probed-cpu.jsonl")
KEEP_FILES = ("frontier-smollm2-cpu.jsonl", "frontier-qwen-cpu.jsonl", "frontier-gemma3-cpu.jsonl",
              "retrieval-smollm2-cpu.jsonl", "retrieval-smollm2-4k-cpu.jsonl", "retrieval-qwen-cpu.jsonl",
              "prefill-passkey-smollm2-cpu.jsonl", "prefill-ruler-smollm2-cpu.jsonl", *PROBED_FILES)
FRONTIER_COST_FILES = ("frontier-cost-cpu.jsonl", "frontier-cost-16k-prefill-cpu.jsonl")  # a decoded token's cost, per method


def keep_at(rows: list[dict[str, Any]], model: str,
            at: str = AT) -> tuple[int, pd.DataFrame, list[C.Claim], pd.DataFrame]:
    """A model's shortest length with a score at ``at``: the methods pooled over its ranked tasks there, best first
    (method, kind, score, lo, hi, draws, n_eff), every pair's claim, and the model's points."""
    pts = FR.points([r for r in rows if r.get("model") == model])
    rk = FR.ranking(pts, at)
    rk = rk.assign(s=rk["at"].fillna(rk["score"]), s_lo=rk["at_lo"].fillna(rk["score_lo"]),
                   s_hi=rk["at_hi"].fillna(rk["score_hi"]))
    L = int(min(rk[rk["s"].notna() & (rk["kind"] != "reference")]["eval_len"]))
    here = rk[(rk["eval_len"] == L) & rk["s"].notna()].sort_values(["s", "method"], ascending=[False, True])
    claims = C.pairwise(pts[pts["eval_len"] == L], at)
    return L, here, claims, pts


def _keep_model(rows: list[dict[str, Any]], model: str) -> list[str]:
    L, here, claims, pts = keep_at(rows, model)
    got = {frozenset((c.a, c.b)): c for c in claims}
    tasks, cells = C.cells_at(pts, model, L, AT)
    r0 = here.iloc[0]
    at1 = pts[(pts["eval_len"] == L) & (pts["status"] == "ok") & pts["task"].isin(tasks)
              & pts["method"].isin(set(cells)) & ((pts["budget"] == AT) | (pts["budget"] == ""))]
    top, floor = int((at1["score"] == 1.0).sum()), int((at1["score"] == 0.0).sum())
    lines = ["", f"#### {model} at {L} tokens, {AT} of the KV cache", "",
             f"{subject(rows, model)}. Ranked tasks (full scores at least 0.5): {', '.join(tasks)}; each method pooled "
             f"over them with equal weight: {r0['n']} examples, {r0['draws']} independent draws, n_eff "
             f"{r0['n_eff']:.1f}. Of its {len(at1)} task cells, {top} sit at 1.00 and {floor} at 0.00: pairs among those "
             "are ties, not rankings.", "",
             "| method | family | score at 1/8 [95% CI] | against full | against the oracle |", "|---|---|---|---|---|"]
    for r in here.itertuples():
        vs = [_short(got.get(frozenset((r.method, o))), r.method) if r.method != o else "" for o in ("full", "oracle")]
        lines.append(f"| {r.method} | {FAMILY[r.kind]} | {_iv(r.s, r.s_lo, r.s_hi)} | {vs[0]} | {vs[1]} |")
    order = list(here["method"])
    adjacent = [got[k] for k in (frozenset(p) for p in zip(order, order[1:], strict=False)) if k in got]
    resolved = [c for c in claims if c.verdict in ("above", "below")]
    ties = [c for c in claims if c.verdict.startswith("tie")]
    lines += ["", f"Of the {len(claims)} pairs, {len(resolved)} are resolved, {len(ties)} tie at a ceiling or floor and "
              f"{len(claims) - len(resolved) - len(ties)} are not resolved (Holm over the {len(claims)}). Each method "
              "against the next one down:", ""] + [f"- {c.sentence()}." for c in adjacent]
    missing = pts[(pts["eval_len"] == L) & (pts["status"] == "ok") & (pts["budget"] == AT)
                  & ~pts["method"].isin(set(cells)) & pts["task"].isin(tasks)]
    if len(missing):
        lines += ["", "Not pooled (no score at 1/8 on every ranked task): " + "; ".join(
            f"{m} ({', '.join(f'{t.task} {_iv(t.score, t.ci_low, t.ci_high)}, {t.draws:.0f} draws' for t in g.itertuples())})"
            for m, g in missing.groupby("method", sort=True)) + "."]
    return lines


def keep(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    flat = frontier_rows(rows, KEEP_FILES)
    lines = ["![What each method keeps at 1/8 of the KV cache, per model: score and 95 % interval, by family]"
             "(figures/frontier/frontier.png)", "",
             "Scores are pooled over the tasks full attention half-solves at that length; intervals are Wilson's at the "
             "effective number of independent draws; against full and the oracle: the paired test on the same draws "
             "(exact sign test on 0/1 draws, else the exact sign-flip test), Holm-adjusted over every pair of the "
             "model's table; a claim is stated only when resolved at 0.05."]
    for model in _order(flat, sorted({r["model"] for r in flat if r.get("model")})):
        lines += _keep_model(flat, model)
    return lines


def _versus(c: C.Claim | None, me: str, other: str) -> str:
    """``me`` against ``other`` in a few words, with the adjusted p where tested."""
    if c is None:
        return f"not paired with {other}"
    if c.verdict.startswith("tie"):
        return f"tied with {other} at the {c.verdict.split()[-1]}"
    if c.verdict == "not resolved":
        return f"not resolved from {other}, {C.p_text(c.p_adj)}"
    higher = c.a if c.verdict == "above" else c.b
    return f"{'above' if higher == me else 'below'} {other}, {C.p_text(c.p_adj)}"


def summary(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One line a model (in each dtype it ran): at its longest length with a score at 1/8 (its probed frontier's where it
    has one), full and the oracle, the three best methods with their intervals and their test against full, what one
    decoded token costs with each (against full's, from the frontier's cost runs), and the pairs among them that are
    ties."""
    from harness.analysis.frontier_cost import cost_frame

    flat, there = frontier_rows(rows, KEEP_FILES), probed(rows)
    pts_all, costs = FR.points(flat), cost_frame(_all(rows, FRONTIER_COST_FILES))
    size = {r.get("model"): r.get("params") or 0 for r in flat}
    lines = []
    who = pts_all[["model", "checkpoint", "dtype"]].drop_duplicates().itertuples(index=False)
    for subj, model, dtype in sorted(who, key=lambda s: (size.get(s.checkpoint, 0), s.model)):
        pts = pts_all[pts_all["model"] == subj]
        rk = FR.ranking(pts, AT)
        rk = rk.assign(s=rk["at"].fillna(rk["score"]), s_lo=rk["at_lo"].fillna(rk["score_lo"]),
                       s_hi=rk["at_hi"].fillna(rk["score_hi"]))
        scored = rk[rk["s"].notna() & (rk["kind"] != "reference")]
        if not len(scored):
            continue
        lens = set(scored["eval_len"])
        L = int(max({x for x in lens if (subj, x) in there} or lens))  # its probed frontier's longest, else its longest
        here = rk[(rk["eval_len"] == L) & rk["s"].notna()].sort_values(["s", "method"], ascending=[False, True])
        got = {frozenset((c.a, c.b)): c for c in C.pairwise(pts[pts["eval_len"] == L], AT)}
        row = {r.method: r for r in here.itertuples()}
        best = [m for m in here["method"] if row[m].kind not in ("reference", "oracle")][:3]
        train = next((r.get("train_len") for r in flat if r.get("model") == model and r.get("train_len")), None)
        r0 = here.iloc[0]
        parts = [f"full {_iv(row['full'].s, row['full'].s_lo, row['full'].s_hi)}"] if "full" in row else []
        if "oracle" in row:
            o = row["oracle"]
            parts.append(f"the oracle {_iv(o.s, o.s_lo, o.s_hi)} "
                         f"({_versus(got.get(frozenset(('oracle', 'full'))), 'oracle', 'full')})")
        parts.append("the three best: " + ", ".join(
            f"`{m}` {_iv(row[m].s, row[m].s_lo, row[m].s_hi)} ({_versus(got.get(frozenset((m, 'full'))), m, 'full')})"
            for m in best))
        mine = costs[(costs["model"] == subj) & (costs["mode"] == "decode")] if len(costs) else costs
        if len(mine):
            Lc = L if (mine["eval_len"] == L).any() else int(mine["eval_len"].max())
            ms = dict(zip(*(mine[mine["eval_len"] == Lc][c] for c in ("method", "latency_ms")), strict=True))
            step = [f"`{m}` " + (f"{ms[m] / ms['full']:.2f}x" if m in ms and "full" in ms else "not measured")
                    for m in best]
            parts.append(f"one decoded token at {Lc} tokens against full's: " + ", ".join(step))
        else:
            parts.append("one decoded token: not measured in this dtype")
        ties = []
        for level in ("ceiling", "floor"):  # a tie at 1.00 (or 0.00) on every draw: the methods that share it
            tied = sorted({m for k, c in got.items() if c.verdict == f"tie at {level}" and k <= {"full", "oracle", *best}
                           for m in k})
            ties += [f"{', '.join(f'`{m}`' for m in tied)} at the {level}"] if tied else []
        parts.append("ties (every draw at 1.00 or 0.00: untestable): " + ("; ".join(ties) if ties else "none"))
        end = " (the end of its trained context)" if train and L >= int(train) else ""
        ran = "" if dtype == "float32" else f", in {dtype}"
        lines.append(f"- {subject(flat, model)}{ran}, at {L} tokens{end}, with 1/8 of its KV cache ({r0['draws']} "
                     f"independent draws over {r0['tasks']} task{'s' if r0['tasks'] > 1 else ''}): " + "; ".join(parts)
                     + ".")
    return lines


# -- what retrieval does -------------------------------------------------------------------------------------------------

def retrieval(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    flat = _all(rows)
    pts = FR.points(flat)
    ok = pts[(pts["status"] == "ok")]
    where = ok[(ok["kind"] == "retrieval") & (ok["budget"] == AT)][["model", "eval_len", "task"]].drop_duplicates()
    lines = ["Retrieval keeps the context's chunks a retriever ranks best for the question, up to the budget's tokens, "
             "and the model reads only those: query-aware by nature. At 1/8 of the context, on the same prompts as "
             "full, the oracle and the best press there (each row's comparisons Holm-adjusted together):", "",
             "| model | length | task | full | oracle | best press | BM25 | dense |", "|---|---|---|---|---|---|---|---|"]
    sentences: list[str] = []
    for m, L, task in where.sort_values(["model", "eval_len", "task"]).itertuples(index=False):
        cells = C.task_cells(pts, m, L, task, AT)
        if "full" not in cells:
            continue  # nothing to pair with
        g = ok[(ok["model"] == m) & (ok["eval_len"] == L) & (ok["task"] == task)]
        score = {r.method: r for r in g[(g["budget"] == AT) | (g["budget"] == "")].itertuples()}
        presses = g[(g["kind"] == "press") & (g["budget"] == AT)].sort_values(["score", "method"], ascending=[False, True])
        best = presses["method"].iloc[0] if len(presses) else None
        mine = [x for x in ("retrieval (bm25)", "retrieval (dense)") if x in cells]
        fam = C.family(m, L, AT, (task,), cells, [(x, o) for x in mine for o in ("full", "oracle", best) if o])

        def cell(name: str | None, score: dict = score) -> str:
            r = score.get(name) if name else None
            return "-" if r is None else f"{_iv(r.score, r.ci_low, r.ci_high)}"
        lines.append(f"| {m} | {L} | {task} ({score['full'].draws} draws) | {cell('full')} | {cell('oracle')} | "
                     f"{best or '-'} {cell(best) if best else ''} | {cell('retrieval (bm25)')} | {cell('retrieval (dense)')} |")
        sentences += [f"- {m} at {L} on {task}: {c.sentence()}." for c in fam if c.verdict in ("above", "below")]
        for tie in ("tie at ceiling", "tie at floor"):
            pairs = [f"`{c.a}` = `{c.b}`" for c in fam if c.verdict == tie]
            if pairs:
                sentences.append(f"- {m} at {L} on {task}, {tie} (every draw {'1.00' if 'ceiling' in tie else '0.00'}: "
                                 f"untestable): {'; '.join(pairs)}.")
        unresolved = [c for c in fam if c.verdict == "not resolved"]
        if unresolved:
            sentences.append(f"- {m} at {L} on {task}, not resolved: " + "; ".join(
                f"`{c.a}` vs `{c.b}` ({c.a_score:.2f} vs {c.b_score:.2f}, {c.a_ahead + c.b_ahead} discordant, "
                f"{C.p_text(c.p_adj)})" for c in unresolved) + ".")
    return lines + ["", "Each comparison with its test:", ""] + sentences


# -- what each method keeps of the text --------------------------------------------------------------------------------

CONTINUATION_FILES = ("continuation-smollm2-4k-cpu.jsonl", "continuation-budgets-smollm2-4k-cpu.jsonl")


def text(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The continuation table per model and length (:mod:`harness.analysis.continuation`): not retrieval, the text."""
    from harness.analysis import continuation

    return ["Retrieval asks for one fact; this asks how well the model goes on reading real text after each method's "
            "cache of the context: bits per byte of the continuation (lower is better), each method against full on "
            "the same windows."] + continuation.lines(_all(rows), FR.arm, "####")


# -- what the prefill sparsity buys ------------------------------------------------------------------------------------

PREFILL_FILES = ("prefill-passkey-smollm2-cpu.jsonl", "prefill-ruler-smollm2-cpu.jsonl", "frontier-smollm2-cpu.jsonl")


def prefill(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    flat = _all(rows)
    pts = FR.points(flat)
    dyn = [r for r in _all(rows, PREFILL_FILES[:2]) if r.get("status") == "ok" and FR.task_of(r) and r.get("budget")
           and FR.arm(r)]
    meta: dict[tuple, dict[str, list[float]]] = {}
    for r in dyn:
        method, _, budget = FR.arm(r)
        key = (int(r["eval_len"]), FR.task_of(r), method, budget)
        d = meta.setdefault(key, {"density": [], "lo": [], "hi": [], "choose": [], "spec": []})
        for col, name in (("density", "density"), ("density_head_min", "lo"), ("density_head_max", "hi"),
                          ("choose_share", "choose")):
            if isinstance(r.get(col), (int, float)):
                d[name].append(float(r[col]))
        d["spec"].append(str(r["variant_spec"]))
    lines = ["A dynamic sparse prefill chooses, per head and prompt, the (query, key) pairs its prefill computes, then "
             "decodes against the whole cache. Density is the share of the prompt's causal pairs computed (mean over the "
             "rows of a cell, the per-head range beside it), from the rows; scores against full on the same prompts, "
             "each cell's comparisons Holm-adjusted together:", "",
             "| length | task | method | setting | density (per-head range) | score [95% CI] | against full |",
             "|---|---|---|---|---|---|---|"]
    choose: dict[int, list[float]] = {}
    for (L, task, method, budget), d in sorted(meta.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2],
                                                                                -float(Fraction(kv[0][3])))):
        cells = C.task_cells(pts, "smollm2-135m", L, task, budget)
        pt = pts[(pts["eval_len"] == L) & (pts["task"] == task) & (pts["method"] == method) & (pts["budget"] == budget)
                 & (pts["status"] == "ok")]
        if len(pt) == 0 or "full" not in cells or method not in cells:
            continue
        (c,) = C.family("smollm2-135m", L, budget, (task,), cells, [(method, "full")])
        r = pt.iloc[0]
        dens = (f"{np.mean(d['density']):.3f} ({min(d['lo']):.3f}–{max(d['hi']):.3f})" if d["density"] and d["lo"]
                else f"{np.mean(d['density']):.3f}" if d["density"] else "-")
        spec = sorted(set(d["spec"]))[0]
        lines.append(f"| {L} | {task} ({r['draws']} draws) | `{spec}` | {budget} | {dens} | "
                     f"{_iv(r['score'], r['ci_low'], r['ci_high'])} | {_short(c, method)} |")
        choose.setdefault(L, []).extend(d["choose"])
    full = pts[(pts["kind"] == "reference") & (pts["status"] == "ok") & pts["eval_len"].isin({k[0] for k in meta})
               & pts["task"].isin({k[1] for k in meta})]
    lines += ["", "Full on those prompts: " + "; ".join(
        f"{r.task} at {r.eval_len} {_iv(r.score, r.ci_low, r.ci_high)}" for r in full.sort_values(
            ["eval_len", "task"]).itertuples()) + "."]
    lines += ["", "Time spent choosing, as a share of the attention time of a prompt's prefill (`choose_share`): " + "; ".join(
        f"{min(v):.2f}–{max(v):.2f} at {L}" for L, v in sorted(choose.items()) if v) + "."]
    return lines


# -- what the chat template changes ----------------------------------------------------------------------------------

CHAT_FILES = ("chat-template-smollm2-cpu.jsonl",)


def chat(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Full attention with and without the checkpoint's chat template on the same examples: a paired claim a task."""
    from harness.analysis.paired import paired_test, wilson

    cells: dict[tuple, dict[bool, dict[str, Any]]] = {}
    for r in _all(rows):
        if r.get("status") == "ok" and isinstance(r.get("per_example"), list) and FR.task_of(r):
            cells.setdefault((r["model"], int(r["eval_len"]), FR.task_of(r)), {})[bool(r.get("chat_template"))] = r
    lines = ["| model | length | task | without the template | with it | claim |", "|---|---|---|---|---|---|"]
    for (model, L, task), by in sorted(cells.items()):
        if set(by) != {False, True}:
            continue
        a, b = (np.asarray(by[k]["per_example"], dtype=float) for k in (True, False))
        t = paired_test(a, b)
        c = C.claim(model, L, "", (task,), "with the template", "without", {"ex": [a], "clusters": [(1,) * len(a)]},
                    {"ex": [b], "clusters": [(1,) * len(b)]}, 0, 1, None, t)
        cell = [f"{x.mean():.2f} [{wilson(x.sum(), len(x))[0]:.2f}, {wilson(x.sum(), len(x))[1]:.2f}] (n {len(x)})"
                for x in (b, a)]
        lines.append(f"| {model} | {L} | {task} | {cell[0]} | {cell[1]} | {c.sentence()} |")
    return lines


# -- what each attention costs -------------------------------------------------------------------------------------------

CHECKPOINT_FILES = ("accuracy-headline-smollm2-cpu.jsonl", "accuracy-headline-gemma3-cpu.jsonl")
COST_FILES = ("headline-cpu.jsonl", "long-headline-cpu.jsonl")
CORE = ("full", "sliding_window", "block_sparse", "linear")


def _len(n: int) -> str:
    return f"{n // 2**20}M" if n >= 2**20 and n % 2**20 == 0 else f"{n // 1024}K" if n % 1024 == 0 else str(n)


def cost(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    df = pd.DataFrame([r for r in _all(rows) if r.get("status") == "ok" and r.get("scope", "op") == "op"
                       and r.get("variant") in CORE and int(r.get("batch_size") or 1) == 1 and not r.get("docs")])
    lines = ["The four core variants alone (op scope: B=1, H=8, D=64, fp32, causal), on one 2-core CPU in one run per "
             "file: the fastest backend's median at each length (its backend named), and a decoding step's peak "
             "memory; (n) marks a noisy cell.", "", "![latency and memory against length, forward and decode]"
             "(figures/headline/headline.png)"]
    for mode, what in (("forward", "one forward call"), ("decode", "one decoding step (KV cache or state)")):
        m = df[df["mode"] == mode]
        lengths = sorted(set(m["seq_len"].astype(int)))
        lines += ["", f"{what}:", "", "| variant | " + " | ".join(_len(L) for L in lengths) + " |",
                  "|---" * (len(lengths) + 1) + "|"]
        for v in CORE:
            cells = []
            for L in lengths:
                g = m[(m["variant"] == v) & (m["seq_len"] == L)].sort_values("latency_ms")
                if len(g) == 0:
                    cells.append("-")
                    continue
                r = g.iloc[0]
                ms = f"{r['latency_ms']:.3g} ms" if r["latency_ms"] < 1000 else f"{r['latency_ms'] / 1000:.3g} s"
                mem = f", {r['peak_mem_bytes'] / 2**20:.1f} MiB" if mode == "decode" and r.get("peak_mem_bytes") else ""
                cells.append(f"{ms} ({r['backend']}{mem}){' (n)' if r.get('noisy') is True else ''}")
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return lines


__all__ = ["AT", "CHAT_FILES", "CHECKPOINT_FILES", "CONTINUATION_FILES", "COST_FILES", "FRONTIER_COST_FILES",
           "KEEP_FILES", "PREFILL_FILES", "PROBED_FILES", "chat", "cost", "frontier_rows", "keep", "keep_at", "prefill",
           "probed", "retrieval", "subject", "summary", "text"]
