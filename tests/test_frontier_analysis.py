"""The memory-quality frontier analysis (harness/analysis/frontier.py) on synthetic rows: no model runs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.accuracy.stats import wilson as harness_wilson
from harness.analysis import frontier as FR
from harness.analysis import paired
from harness.analysis.effective import effective_length, kept_tests
from harness.cli import main

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
BUDGETS = ("1/2", "1/4", "1/8", "1/16")
FULL_BYTES = 1_000_000.0


def press_row(press: str, per_example: list[float], *, task: str = "passkey", depth: float | None = 0.5,
              subtask: str | None = None, budget: str | None = None, model: str = "m", eval_len: int = 4096,
              status: str = "ok", error: str | None = None, nbits: int | None = None) -> dict:
    """One accuracy row as `attn-bench accuracy --preset frontier-*` writes it."""
    spec = press if budget is None else f"{press}:compression_ratio={1 - eval(budget)}"
    if nbits is not None:
        spec = f"quantized:nbits={nbits}"
    frac = eval(budget) if budget else None
    kv = FULL_BYTES * (frac or (nbits / 16 if nbits else 1.0))
    row = {"model": model, "task": task, "eval_len": eval_len, "variant": "full", "variant_spec": "full",
           "press": press, "press_spec": spec, "budget": budget, "budget_fraction": frac, "kv_bytes": kv,
           "metric": "exact_match" if task == "passkey" else "string_match", "status": status, "error": error}
    if depth is not None and task == "passkey":
        row["depth"] = depth
    if subtask is not None:
        row["subtask"] = subtask
    if status == "ok":
        row |= {"value": float(np.mean(per_example)), "n": len(per_example), "per_example": list(per_example)}
    else:
        row |= {"value": None, "n": 0}
    return row


def variant_row(spec: str, per_example: list[float], **kw) -> dict:
    row = press_row("x", per_example, budget="1/8", **kw)
    del row["press"], row["press_spec"]
    return row | {"variant": spec.split(":")[0], "variant_spec": spec}


def passkey_rows(press: str, outcomes: list[float], **kw) -> list[dict]:
    """20 examples as 5 depths x 4, in depth order."""
    return [press_row(press, outcomes[4 * i:4 * i + 4], depth=d, **kw) for i, d in enumerate(DEPTHS)]


def grid(scores: dict[str, dict[str, list[float]]], full: list[float], task: str = "passkey", **kw) -> list[dict]:
    """Passkey (or one RULER subtask) rows: full, and each press at each budget."""
    def cell(press: str, outcomes: list[float], **more) -> list[dict]:
        if task == "passkey":
            return passkey_rows(press, outcomes, **more, **kw)
        return [press_row(press, outcomes, task="ruler", subtask=task, depth=None, **more, **kw)]

    rows = cell("none", full)
    for press, per_budget in scores.items():
        for b, outcomes in per_budget.items():
            rows += cell(press, outcomes, budget=b)
    return rows


def ones(k: int, n: int = 20) -> list[float]:
    return [1.0] * k + [0.0] * (n - k)


# -- points -------------------------------------------------------------------------------------------

def test_passkey_depths_pool_in_ascending_depth_order():
    per_depth = {d: [1.0 if (i + j) % 3 == 0 else 0.0 for j in range(4)] for i, d in enumerate(DEPTHS)}
    rows = [press_row("none", per_depth[d], depth=d) for d in reversed(DEPTHS)]  # written out of order
    pt = FR.points(rows).iloc[0]
    expect = [v for d in DEPTHS for v in per_depth[d]]
    assert list(pt["per_example"]) == expect and pt["n"] == 20
    assert pt["score"] == pytest.approx(np.mean(expect))
    assert pt["method"] == "full" and pt["kind"] == "reference"


def test_wilson_of_a_fractional_count_is_the_formula_scipy_computes_for_whole_ones():
    assert paired.wilson(16 + 1e-9, 20) == pytest.approx(harness_wilson(16, 20))  # the formula, against scipy
    lo, hi = paired.wilson(2.5, 5)
    assert paired.wilson(2, 5)[0] < lo < 0.5 < hi < paired.wilson(3, 5)[1]


def ruler_row(press: str, outcomes: list[float], **kw) -> dict:
    return press_row(press, outcomes, task="ruler", subtask="niah_single_1", depth=None, **kw)


def test_wilson_interval_on_binary_points_matches_the_harness():
    pt = FR.points([ruler_row("none", ones(13))]).iloc[0]
    lo, hi = harness_wilson(13, 20)
    assert (pt["ci_low"], pt["ci_high"]) == pytest.approx((lo, hi))
    assert 0.0 < pt["ci_low"] < 0.65 < pt["ci_high"] < 1.0
    # a point at 100 % still has an interval below 1, where a normal approximation would collapse
    top = FR.points([ruler_row("none", ones(20))]).iloc[0]
    assert top["ci_low"] == pytest.approx(harness_wilson(20, 20)[0]) and top["ci_low"] < 1.0


def test_fractional_points_get_a_bootstrap_interval_not_wilson():
    frac = [0.5, 0.25, 1.0, 0.75] * 5
    pt = FR.points([press_row("none", frac, task="ruler", subtask="niah_multivalue", depth=None)]).iloc[0]
    assert not pt["binary"] and pt["score"] == pytest.approx(0.625)
    assert pt["ci_low"] < 0.625 < pt["ci_high"]
    assert (pt["ci_low"], pt["ci_high"]) != pytest.approx(harness_wilson(round(0.625 * 20), 20))


def test_methods_kinds_and_kv_fraction():
    rows = (passkey_rows("none", ones(20)) + passkey_rows("oracle", ones(20), budget="1/8")
            + passkey_rows("snapkv", ones(15), budget="1/8") + passkey_rows("quantized", ones(19), nbits=4)
            + [variant_row("sliding_window:window=508,sinks=4,backend=blocked", ones(4, 4), depth=d) for d in DEPTHS])
    pts = FR.points(rows).set_index("method")
    assert pts.loc["quantized 4-bit", "kind"] == "quantized" and pts.loc["quantized 4-bit", "budget"] == ""
    assert pts.loc["sinks", "kind"] == "variant" and pts.loc["oracle", "kind"] == "oracle"
    assert pts.loc["snapkv", "kv_fraction"] == pytest.approx(0.125)
    assert pts.loc["quantized 4-bit", "kv_fraction"] == pytest.approx(0.25)


def test_a_task_full_fails_is_marked_and_left_out_of_the_ranking():
    good = grid({"oracle": {b: ones(20) for b in BUDGETS}, "snapkv": {b: ones(10) for b in BUDGETS}}, ones(20))
    # on the hard task full scores 0.3 and snapkv happens to score 0: ranking it would drag snapkv's AUC down
    hard = grid({"oracle": {b: ones(6) for b in BUDGETS}, "snapkv": {b: ones(0) for b in BUDGETS}}, ones(6),
                task="niah_multikey_1")
    pts = FR.points(good + hard)
    marked = pts[pts["below_half"]]
    assert set(marked["task"]) == {"niah_multikey_1"} and not pts[pts["task"] == "passkey"]["below_half"].any()
    rk = FR.ranking(pts).set_index("method")
    assert rk.loc["snapkv", "auc"] == pytest.approx(0.5)  # passkey alone
    assert rk.loc["oracle", "auc"] == pytest.approx(1.0)
    assert "niah_multikey_1 (full 0.30, n 20)" in FR.markdown(pts, FR.FrontierConfig())


def test_auc_of_a_method_equal_to_full_at_every_budget_is_full_score():
    full = ones(14)
    rows = grid({"oracle": {b: ones(20) for b in BUDGETS}, "tova": {b: full for b in BUDGETS},
                 "knorm": {"1/2": full, "1/4": ones(12), "1/8": ones(8), "1/16": ones(2)}}, full, task="niah_single_1")
    rk = FR.ranking(FR.points(rows)).set_index("method")
    assert rk.loc["tova", "auc"] == pytest.approx(0.7) and rk.loc["full", "auc"] == pytest.approx(0.7)
    assert rk.loc["tova", "auc_lo"] < 0.7 < rk.loc["tova", "auc_hi"]
    # knorm: trapezoid over log2 budgets (-4..-1): (0.1+0.4)/2 + (0.4+0.6)/2 + (0.6+0.7)/2 over a range of 3
    assert rk.loc["knorm", "auc"] == pytest.approx(((0.1 + 0.4) / 2 + (0.4 + 0.6) / 2 + (0.6 + 0.7) / 2) / 3)
    assert rk.loc["tova", "gap"] == pytest.approx(0.3) and rk.loc["tova", "gap_lo"] > 0
    order = list(FR.ranking(FR.points(rows))["method"])
    assert order.index("oracle") < order.index("tova") < order.index("knorm")


def test_sized_variants_appear_at_one_eighth_with_no_auc():
    rows = grid({"oracle": {b: ones(20) for b in BUDGETS}}, ones(20))
    rows += [variant_row("moba:block_size=64,topk=8", ones(2, 4), depth=d) for d in DEPTHS]
    rk = FR.ranking(FR.points(rows)).set_index("method")
    assert pd.isna(rk.loc["moba", "auc"]) and rk.loc["moba", "at"] == pytest.approx(0.5)
    # five haystacks (depths), each half found: Wilson on five draws, wider than on twenty examples
    assert (rk.loc["moba", "at_lo"], rk.loc["moba", "at_hi"]) == pytest.approx(paired.wilson(2.5, 5))
    assert rk.loc["moba", "at_lo"] < harness_wilson(10, 20)[0]
    assert rk.loc["moba", "gap_at"] == pytest.approx(0.5) and rk.loc["moba", "gap_at_lo"] < 0  # five draws: unresolved


# -- intervals and tests that count draws ---------------------------------------------------------------

def test_the_pooled_interval_counts_kish_effective_draws():
    """Passkey's 5 haystacks beside two RULER tasks of 20: 45 draws, which the equal-weight mean counts as 30 (and
    passkey's 5 beside one RULER task: 16), Wilson's interval at that count; never zero width, even at 1.0."""
    score, lo, hi, n = paired.interval([np.ones(20), np.ones(20), np.ones(20)], [(4,) * 5, (1,) * 20, (1,) * 20])
    assert n == pytest.approx(30.0) and score == 1.0 and (lo, hi) == pytest.approx(paired.wilson(30, 30)) and lo < 1
    assert paired.interval([np.ones(20), np.ones(20)], [(4,) * 5, (1,) * 20])[3] == pytest.approx(16.0)
    assert paired.interval([np.zeros(20)])[2] > 0  # a floor keeps its width too


def test_the_paired_test_is_the_exact_sign_test_on_binary_draws_and_counts_haystacks_once():
    from scipy.stats import binomtest

    a = np.array([1.0] * 12 + [0.0] * 8)
    b = np.array([1.0] * 3 + [0.0] * 17)  # a ahead on 9 draws, never behind
    t = paired.paired_test(a, b)
    assert (t["a_ahead"], t["b_ahead"], t["test"]) == (9, 0, "exact sign test")
    assert t["p"] == pytest.approx(binomtest(9, 9).pvalue)
    lost = np.array([1.0] * 4 + [0.0] * 4 + [1.0] * 12)  # one haystack (four keys) lost: one discordant draw
    one = paired.paired_test(np.ones(20), lost, [(4,) * 5])
    assert (one["a_ahead"], one["draws"], one["p"]) == (1, 5, 1.0)
    assert paired.paired_test(np.ones(20), lost)["p"] == pytest.approx(binomtest(4, 4).pvalue)  # one by one: 4 draws


def test_the_sign_flip_test_on_unequal_weights_is_exact():
    """Pooled tasks weigh their draws unequally: the null distribution is counted, and equals brute force."""
    import itertools

    d = np.array([0.25, 0.5, 1.0, -1.0, 0.25, 0.75, 0.5]) / 15
    p, how = paired.sign_flip_p(d)
    brute = np.mean([abs(np.dot(s, np.abs(d))) >= abs(d.sum()) - 1e-12 for s in itertools.product((1, -1), repeat=7)])
    assert how == "exact sign-flip" and p == pytest.approx(brute)


def test_differences_whose_common_unit_is_past_any_integer_width_take_the_monte_carlo_test():
    """Real-valued draws (bits per byte) can each be a small fraction and share a denominator of dozens of digits."""
    primes = [p for p in range(2, 100) if all(p % q for q in range(2, p))]
    p, how = paired.sign_flip_p(np.array([1 / q for q in primes]))
    assert how == "Monte Carlo" and p < 0.001  # all 25 of one sign


def test_newcombe_interval_never_collapses_and_holds_the_difference():
    same = np.array([1.0, 0.0] * 10)
    d, lo, hi = paired.paired_difference(same, same)
    assert d == 0 and lo < 0 < hi  # two arms agreeing on every draw still leave room for a difference
    d, lo, hi = paired.paired_difference(np.ones(20), np.zeros(20))
    assert d == 1 and 0 < lo < 1 and hi == 1.0
    d, _, _ = paired.paired_difference([np.ones(4), np.zeros(20)], [np.zeros(4), np.zeros(20)])
    assert d == pytest.approx(0.5)  # the tasks weighted alike, not 4 / 24
    with pytest.raises(ValueError, match="same examples"):
        paired.paired_difference(np.ones(4), np.ones(5))


def test_holm_adjusts_step_down():
    assert paired.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_claims_say_resolved_not_resolved_and_ties_from_the_rows():
    from harness.analysis import claims as C

    rows = grid({"oracle": {"1/8": ones(20)}, "keydiff": {"1/8": ones(20)}, "tova": {"1/8": ones(2)},
                 "knorm": {"1/8": ones(20)}}, ones(20), task="niah_single_1")
    pts = FR.points(rows)
    got = {frozenset((c.a, c.b)): c for c in C.pairwise(pts)}
    assert len(got) == 10  # every pair of the five methods, Holm over ten
    tie = got[frozenset(("oracle", "keydiff"))]
    assert tie.verdict == "tie at ceiling" and "untestable" in tie.sentence()
    win = got[frozenset(("keydiff", "tova"))]
    assert (win.a, win.verdict, win.a_ahead, win.b_ahead) == ("keydiff", "above", 18, 0)
    assert win.sentence().startswith("`keydiff` keeps more than `tova` (1.00 vs 0.10") and "Holm over 10" in win.sentence()
    few = C.pairwise(FR.points(grid({"oracle": {"1/8": ones(20)}, "tova": {"1/8": ones(17)}}, ones(20),
                                    task="niah_single_1")))
    assert all(c.verdict == "not resolved" for c in few if {c.a, c.b} == {"oracle", "tova"})
    assert "not resolved" in FR.markdown(FR.points(rows))


def test_the_gap_at_a_budget_needs_the_oracle_there_only():
    """A task run at 1/8 alone (RULER at 8K) leaves no AUC, and still the gap to the oracle at 1/8."""
    rows = grid({"oracle": {b: ones(20) for b in BUDGETS}, "snapkv": {b: ones(10) for b in BUDGETS}}, ones(20))
    rows += grid({"oracle": {"1/8": ones(20)}, "snapkv": {"1/8": ones(10)}}, ones(20), task="niah_single_1")
    rk = FR.ranking(FR.points(rows)).set_index("method")
    assert pd.isna(rk.loc["snapkv", "auc"]) and rk.loc["snapkv", "gap_at"] == pytest.approx(0.5)


def test_passkey_resamples_whole_depths_and_ruler_single_examples():
    """Passkey's four keys at a depth share one haystack and answer together: an arm that loses one depth is five
    haystacks' evidence, not twenty examples', and its interval says so; RULER's examples draw one by one."""
    lost = [1.0] * 4 + [0.0] * 4 + [1.0] * 12  # the second depth, all four keys
    pt = FR.points(passkey_rows("none", lost)).iloc[0]
    assert pt["clusters"] == (4,) * 5 and (pt["ci_low"], pt["ci_high"]) == pytest.approx(paired.wilson(4, 5))
    top = FR.points(passkey_rows("none", ones(20))).iloc[0]
    assert top["ci_low"] == pytest.approx(harness_wilson(5, 5)[0])  # a perfect score keeps its interval
    d, lo, _ = paired.paired_difference(np.ones(20), np.asarray(lost), clusters=[(4,) * 5])
    assert d == pytest.approx(0.2) and lo < 0  # five haystacks, one lost: no difference shown
    ruler = FR.points([ruler_row("none", lost)]).iloc[0]
    assert ruler["clusters"] == (1,) * 20 and (ruler["ci_low"], ruler["ci_high"]) == pytest.approx(harness_wilson(16, 20))


# -- effective length, beats-oracle --------------------------------------------------------------------

def test_effective_length_is_the_longest_length_keeping_85_percent_of_full():
    rows = []
    for L, snap in ((4096, ones(18)), (8192, ones(10))):
        rows += grid({"oracle": {"1/8": ones(20)}, "snapkv": {"1/8": snap}, "tova": {"1/8": ones(2)}}, ones(20),
                     eval_len=L)
    eff = effective_length(FR.points(rows)).set_index(["method", "budget"])
    assert eff.loc[("snapkv", "1/8"), "effective_len"] == 4096  # 0.9 >= 0.85 at 4K, 0.5 < 0.85 at 8K
    assert eff.loc[("oracle", "1/8"), "effective_len"] == 8192
    assert pd.isna(eff.loc[("tova", "1/8"), "effective_len"])
    text = FR.markdown(FR.points(rows), FR.FrontierConfig())
    assert "| method | 1/8 |\n|---|---|\n" in text and "| tova | < 4096 |" in text and "| oracle | 8192 |" in text


def test_a_method_that_missed_a_ranked_task_at_every_length_has_no_effective_length():
    """Its mean over the tasks it answered is not full's over all of them: no estimate, rather than '< 4096'."""
    rows = grid({"oracle": {"1/8": ones(20)}, "kvzip": {"1/8": ones(20)}}, ones(20))
    rows += grid({"oracle": {"1/8": ones(18)}}, ones(18), task="niah_multikey_2")  # kvzip stopped before this task
    eff = effective_length(FR.points(rows))
    assert set(eff["method"]) == {"oracle"}
    text = FR.markdown(FR.points(rows), FR.FrontierConfig())
    assert "| oracle | 4096 |" in text and "| kvzip | < 4096 |" not in text and "| kvzip | - |" in text


def test_above_the_oracle_is_every_kind_tested_with_holm():
    rows = grid({"oracle": {"1/8": ones(4)}, "streaming_llm": {"1/8": ones(20)}, "tova": {"1/8": ones(6)}}, ones(20),
                task="niah_single_1")
    rows += [r | {"press_spec": "retrieval:retriever=bm25,compression_ratio=0.875", "press_params": {"retriever": "bm25"}}
             for r in grid({"retrieval": {"1/8": ones(19)}}, ones(20), task="niah_single_1") if r["press"] == "retrieval"]
    from harness.analysis.claims import against_oracle

    found = against_oracle(FR.points(rows)).set_index("method")
    assert set(found.index) == {"streaming_llm", "tova", "retrieval (bm25)"}  # retrieval is tested too
    assert found.loc["streaming_llm", "diff"] == pytest.approx(0.8) and found.loc["streaming_llm", "p_adj"] < 0.05
    text = FR.markdown(FR.points(rows))
    assert "Above the oracle at its budget (3 of the 3 cells" in text and "- streaming_llm at 1/8 on niah_single_1" in text
    assert FR.ORACLE_NOTE in text


def test_did_not_run_is_listed_and_kept_out_of_the_numbers():
    rows = grid({"oracle": {"1/8": ones(20)}}, ones(20))
    rows += [press_row("keydiff", [], depth=d, budget="1/8", status="unsupported",
                       error="UnsupportedBackend: keydiff\nneeds a GPU") for d in DEPTHS]
    pts = FR.points(rows)
    assert "keydiff" not in set(FR.ranking(pts)["method"])
    assert "- keydiff at 1/8 on passkey: unsupported: UnsupportedBackend: keydiff needs a GPU" in FR.markdown(
        pts, FR.FrontierConfig())
    only_failures = FR.points(rows[-5:])  # nothing ran: still a summary saying so
    assert "- keydiff at 1/8 on passkey: unsupported" in FR.markdown(only_failures, FR.FrontierConfig())


def test_markdown_is_deterministic():
    rows = grid({"oracle": {b: ones(17) for b in BUDGETS}, "snapkv": {b: ones(12) for b in BUDGETS}}, ones(18))
    rows += grid({"oracle": {b: [0.5] * 20 for b in BUDGETS}, "snapkv": {b: [0.25, 0.5] * 10 for b in BUDGETS}},
                 [0.75] * 20, task="niah_multivalue")
    a, b = FR.markdown(FR.points(rows)), FR.markdown(FR.points(rows))
    assert a == b and "| snapkv | 0.49 [" in a  # (0.6 + 0.375) / 2, the tasks weighted alike


# -- the command ---------------------------------------------------------------------------------------

def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_command_writes_markdown(tmp_path, capsys):
    src = tmp_path / "frontier.jsonl"
    _write(src, grid({"oracle": {b: ones(20) for b in BUDGETS}, "snapkv": {b: ones(11) for b in BUDGETS}}, ones(19)))
    out = tmp_path / "frontier.md"
    assert main(["frontier", str(src), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Memory-quality frontier") and "## m at 4096 tokens" in text and "| snapkv |" in text
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    assert main(["frontier", str(src)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n" + text


def test_out_is_written_beside_the_target_then_renamed(tmp_path, monkeypatch):
    from harness.results import write_atomic

    out = tmp_path / "frontier.md"
    out.write_text("old")
    seen = []

    def failing_replace(src, dst):
        seen.append((Path(src).parent, Path(dst)))
        raise OSError("disk full")

    monkeypatch.setattr(Path, "replace", failing_replace)
    with pytest.raises(OSError):
        write_atomic(out, "new")
    assert seen == [(tmp_path, out)]  # the whole text went to a file in the same directory first
    assert out.read_text() == "old" and list(tmp_path.iterdir()) == [out]  # a failed rename leaves no half file


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ('{"model": "m", "task": "lm", "metric": "ppl", "value": 3.0}\n', "no memory-quality frontier rows"),
    ("not json\n", "line 1 is not a JSON object"),
])
def test_command_bad_input_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    src = tmp_path / "in.jsonl"
    if content is not None:
        src.write_text(content)
    assert main(["frontier", str(src)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


# -- the figure ----------------------------------------------------------------------------------------

def _figure_rows() -> list[dict]:
    rows = []
    for L in (4096, 8192):
        rows += grid({"oracle": {b: ones(18) for b in BUDGETS}, "snapkv": {b: ones(12) for b in BUDGETS}}, ones(19),
                     eval_len=L)
        rows += grid({"oracle": {b: ones(5) for b in BUDGETS}}, ones(4), task="niah_multikey_1", eval_len=L)
        rows += passkey_rows("quantized", ones(19), nbits=4, eval_len=L)
        rows += [variant_row("sliding_window:window=512,backend=blocked", ones(1, 4), depth=d, eval_len=L)
                 for d in DEPTHS]
    return rows


def test_plot_command_draws_the_frontier(tmp_path, capsys):
    src = tmp_path / "rows.jsonl"
    _write(src, _figure_rows())
    assert main(["plot", str(src), "--out", str(tmp_path / "figs"), "--only", "frontier"]) == 0
    assert (tmp_path / "figs" / "frontier.png").stat().st_size > 0
    assert "1 figure(s) written" in capsys.readouterr().out


def test_the_cost_table_sets_each_method_beside_full_of_the_same_run(tmp_path, capsys):
    """A press, a quantized cache and a sized variant matched to their frontier names; times against full's; a noisy
    cell said so; the KV share and score from the accuracy rows at the same length."""
    from harness.analysis.frontier_cost import cost_frame, cost_lines, cost_method

    def cost(press=None, variant="full", mode="decode", ms=10.0, noisy=False):
        return {"scope": "hf", "hf_config": "m", "seq_len": 4096, "mode": mode, "status": "ok", "latency_ms": ms,
                "press_spec": press, "variant_spec": variant, "noisy": noisy}

    assert cost_method(cost("snapkv:compression_ratio=0.875")) == "snapkv"
    assert cost_method(cost("quantized:nbits=2")) == "quantized 2-bit" and cost_method(cost("none")) == "full"
    assert cost_method(cost(None, "sliding_window:window=508,sinks=4,backend=blocked")) == "sinks"
    rows = [cost("none", ms=20.0), cost("none", mode="forward", ms=1000.0), cost("snapkv:compression_ratio=0.875",
            ms=5.0), cost("snapkv:compression_ratio=0.875", mode="forward", ms=1100.0, noisy=True),
            {**cost("none", ms=99.0), "status": "error"}]
    assert len(cost_frame(rows)) == 4
    pts = FR.points(grid({"oracle": {"1/8": ones(20)}, "snapkv": {"1/8": ones(15)}}, ones(20)))
    lines = cost_lines([*rows, {**cost("none"), "hf_config": "another"}], pts)  # a model the frontier lacks: left out
    assert not any("another" in line for line in lines)
    assert "| full | 20.0 ms (1.00x) | 1000.0 ms (1.00x) | 1.000 | 1.00 (passkey) |" in lines
    assert "| snapkv (noisy) | 5.0 ms (0.25x) | 1100.0 ms (1.10x) | 0.125 | 0.75 (passkey) |" in lines
    src, costs = tmp_path / "acc.jsonl", tmp_path / "cost.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in grid({"snapkv": {"1/8": ones(15)}}, ones(20))))
    costs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["frontier", str(src), "--cost", str(costs)]) == 0
    assert "What it costs: m at 4096 tokens" in capsys.readouterr().out
    # a cost in bfloat16 sits beside bfloat16 scores, never beside float32 ones (the frontier's subjects)
    bf16 = FR.points([{**r, "dtype": "bfloat16"} for r in grid({"snapkv": {"1/8": ones(15)}}, ones(20))])
    assert not cost_lines(rows, bf16)
    assert "| full | 20.0 ms (1.00x) | 1000.0 ms (1.00x) | 1.000 | 1.00 (passkey) |" in cost_lines(
        [{**r, "dtype": "bfloat16"} for r in rows], bf16)


def test_the_tested_effective_length_is_the_longest_length_a_test_resolves_keeping_85_percent():
    """Each draw's score minus 0.85 x full's, sign-flip tested: matching a full that is at the ceiling keeps 85 % on
    every draw (resolved, unlike a tie: on two tasks' 40 draws; the difference's interval must clear 0 too, which 20
    draws at the ceiling do not), 17 of 20 against 20 of 20 sits on the line (not resolved), half is below."""
    rows = []
    for L, snap in ((4096, ones(20)), (8192, ones(17))):
        for task in ("niah_single_1", "niah_multikey_1"):
            rows += grid({"snapkv": {"1/8": snap}, "tova": {"1/8": ones(10)}, "knorm": {"1/4": ones(20)}}, ones(20),
                         task=task, eval_len=L)
    kept = kept_tests(FR.points(rows)).set_index(["method", "eval_len"])
    assert set(kept.index) == {(m, L) for m in ("snapkv", "tova") for L in (4096, 8192)}  # knorm: not at 1/8
    assert kept.loc[("snapkv", 4096), "verdict"] == "keeps" and kept.loc[("snapkv", 4096), "p_adj"] < 0.05
    assert kept.loc[("snapkv", 8192), "diff"] == pytest.approx(0.0, abs=1e-12)
    assert kept.loc[("snapkv", 8192), "verdict"] == "not resolved"
    assert (kept.loc["tova", "verdict"] == "below").all()
    assert (kept["p_adj"] >= kept["p"]).all()  # Holm over the table's four tests
    text = FR.markdown(FR.points(rows), FR.FrontierConfig())
    assert ("| snapkv | 4096 | 1.00 of 1.00, +0.15 [+0.03, +0.29]: keeps (p < 0.001) | 0.85 of 1.00, +0.00 [-0.16, "
            "+0.16]: not resolved (p = 1.000) |") in text
    assert "| tova | none | 0.50 of 1.00, -0.35 [-0.52, -0.15]: below" in text


def test_effective_length_reads_only_the_tasks_ranked_at_every_length():
    """A task run at 4K alone (RULER) does not decide 4K's verdict when 8K has only passkey."""
    rows = grid({"snapkv": {"1/8": ones(20)}}, ones(20), eval_len=4096)
    rows += grid({"snapkv": {"1/8": ones(0)}}, ones(20), task="niah_single_1", eval_len=4096)
    rows += grid({"snapkv": {"1/8": ones(10)}}, ones(20), eval_len=8192)
    eff = effective_length(FR.points(rows)).set_index(["method", "budget"])
    assert eff.loc[("snapkv", "1/8"), "effective_len"] == 4096  # passkey 1.0 at 4K; RULER's 0 left out
    cut = grid({"snapkv": {"1/8": ones(4, 4)}}, ones(4, 4), task="niah_single_1")  # 4 examples: no task ranks
    assert effective_length(FR.points(cut)).empty  # not "< 4096": nothing was measured to say so


def retrieval_rows(retriever: str, per_budget: dict[str, list[float]]) -> list[dict]:
    rows = []
    for b, outcomes in per_budget.items():
        for r in passkey_rows("retrieval", outcomes, budget=b):
            rows.append(r | {"press_spec": f"retrieval:retriever={retriever},{r['press_spec'].split(':')[1]}",
                             "press_params": {"retriever": retriever, "chunk": 128}, "query_aware": True})
    return rows


def test_retrieval_is_its_own_kind_ranked_over_the_budgets_and_drawn_in_its_colour(tmp_path):
    """Each retriever is a method of kind retrieval, with an AUC over the press budgets and its score at 1/8; the
    table says it is query-aware by nature; the figure draws it in retrieval's colour, not a press's."""
    from harness.analysis.figures.frontier import FAMILY, plot_frontier

    rows = grid({"oracle": {b: ones(20) for b in BUDGETS}, "snapkv": {b: ones(10) for b in BUDGETS}}, ones(20))
    rows += retrieval_rows("bm25", {b: ones(16) for b in BUDGETS}) + retrieval_rows("dense", {"1/8": ones(4)})
    pts = FR.points(rows)
    assert set(pts[pts["kind"] == "retrieval"]["method"]) == {"retrieval (bm25)", "retrieval (dense)"}
    rk = FR.ranking(pts).set_index("method")
    assert rk.loc["retrieval (bm25)", "auc"] == pytest.approx(0.8) and rk.loc["retrieval (bm25)", "at"] == 0.8
    assert pd.isna(rk.loc["retrieval (dense)", "auc"]) and rk.loc["retrieval (dense)", "at"] == pytest.approx(0.2)
    assert rk.loc["retrieval (bm25)", "gap_at"] == pytest.approx(0.2)
    assert FR.RETRIEVAL_NOTE in FR.markdown(pts, FR.FrontierConfig())
    fig = plot_frontier(pd.DataFrame(rows), tmp_path, formats=("png",))
    dots = {ln.get_gid(): ln for ax in fig.get_axes() for ln in ax.get_lines() if ln.get_gid()}
    assert dots["frontier:m:retrieval (bm25)"].get_color() == FAMILY["retrieval"][1]
    assert dots["frontier:m:snapkv"].get_color() == FAMILY["press"][1]


def test_a_row_says_its_draws_as_a_list_or_a_frame():
    """A passkey row with ``draws`` counts them, read from a list of rows or from a frame where rows without the column
    made it float; a row without it is one haystack."""
    rows = [press_row("none", ones(4), depth=d) | {"draws": 4} for d in DEPTHS]
    rows += [press_row("none", ones(20), task="ruler", subtask="niah_single_1", depth=None)]
    for given in (rows, pd.DataFrame(rows)):
        pts = FR.points(given).set_index("task")
        assert pts.loc["passkey", "draws"] == 20 and pts.loc["niah_single_1", "draws"] == 20
    old = FR.points(passkey_rows("none", ones(20))).iloc[0]
    assert old["draws"] == 5


def test_two_wrappings_of_one_press_are_two_methods_named_by_what_they_wrap():
    """``adakv(snapkv)`` and ``adakv(expected_attention)`` share a ``press`` column (kvpress's AdaKV): the frontier names
    each by the press it wraps, without the ratio the budget set."""
    rows = [press_row("none", [1.0, 0.0, 1.0, 1.0])]
    for inner, ex in (("snapkv", [1.0, 0.0, 0.0, 1.0]), ("expected_attention", [0.0, 0.0, 1.0, 0.0])):
        r = press_row("adakv", ex, budget="1/8")
        r["press_params"] = {"press": f"{inner}:compression_ratio=0.875", "alpha_safeguard": 0.2}
        rows.append(r)
    pts = FR.points(rows).set_index("method")
    assert pts.loc["adakv(snapkv)", "score"] == 0.5 and pts.loc["adakv(expected_attention)", "score"] == 0.25


def test_the_summary_gives_each_model_s_three_best_at_its_longest_length_with_cost_and_ties():
    """The README's one line a model: at its longest length, full and the oracle with their intervals, the three best
    with their test against full, one decoded token against full's from the cost rows of its dtype, the ties."""
    from harness.analysis import answers as A

    rows = []
    for L, snap in ((4096, ones(20)), (8192, ones(19))):
        for task in ("niah_single_1", "niah_multikey_1"):
            rows += grid({"oracle": {"1/8": ones(20)}, "snapkv": {"1/8": snap}, "tova": {"1/8": ones(10)},
                          "knorm": {"1/8": ones(2)}, "keydiff": {"1/8": ones(0)}}, ones(20), task=task, eval_len=L)
    rows = [r | {"model_file": "/x/m-Q4_K_M.gguf", "train_len": 32768, "dtype": "bfloat16"} for r in rows]
    cost = [{"scope": "hf", "hf_config": "m", "seq_len": 8192, "mode": "decode", "status": "ok", "latency_ms": ms,
             "press_spec": p, "variant_spec": "full", "dtype": "bfloat16"}
            for p, ms in (("none", 20.0), ("snapkv:compression_ratio=0.875", 10.0))]
    files = {f: [] for f in (*A.KEEP_FILES, *A.FRONTIER_COST_FILES)}
    files[A.KEEP_FILES[0]], files[A.FRONTIER_COST_FILES[0]] = rows, cost
    (line,) = A.summary(files)
    assert "m, a 4-bit GGUF file (Q4_K_M) dequantised on load, prompted without a chat template, in bfloat16, at 8192 " \
           "tokens, with 1/8 of its KV cache (40 independent draws over 2 tasks): full 1.00 [0.91, 1.00]" in line
    assert "the oracle 1.00 [0.91, 1.00] (tied with full at the ceiling)" in line
    assert "the three best: `snapkv` 0.95 [0.83, 0.99] (not resolved from full, " in line
    assert "`tova` 0.50 [0.35, 0.65] (below full, p < 0.001), `knorm` 0.10" in line and "keydiff" not in line
    assert "one decoded token at 8192 tokens against full's: `snapkv` 0.50x, `tova` not measured" in line
    assert line.endswith("ties (every draw at 1.00 or 0.00: untestable): `full`, `oracle` at the ceiling.")
    files[A.FRONTIER_COST_FILES[0]] = [c | {"dtype": "float32"} for c in cost]  # a cost of another dtype: not beside
    assert "one decoded token: not measured in this dtype" in A.summary(files)[0]


def test_a_probed_frontier_is_the_model_s_frontier_at_its_lengths_and_its_summary_length():
    """Where a probed frontier holds a model at a length, the other files' rows there (other prompts) are left out,
    and the model's line reads the probed frontier's longest length, not the longest of any file."""
    from harness.analysis import answers as A

    old = [r | {"model_file": "/x/m-Q4_K_M.gguf"} for L in (4096, 8192)
           for r in grid({"snapkv": {"1/8": ones(15)}}, ones(18), task="niah_single_1", eval_len=L)]
    new = [r | {"model_file": "/x/m-Q4_K_M.gguf"}
           for r in grid({"snapkv": {"1/8": ones(4)}}, ones(16), task="niah_multikey_1", eval_len=4096)]
    files = {f: [] for f in (*A.KEEP_FILES, *A.FRONTIER_COST_FILES)}
    files[A.KEEP_FILES[0]], files[A.PROBED_FILES[-1]] = old, new
    kept = A.frontier_rows(files, A.KEEP_FILES)
    assert {(r["eval_len"], r["subtask"]) for r in kept} == {(4096, "niah_multikey_1"), (8192, "niah_single_1")}
    (line,) = A.summary(files)
    assert "at 4096 tokens" in line and "full 0.80 [" in line and "`snapkv` 0.20 [" in line
    files[A.PROBED_FILES[-1]] = []  # no probed frontier: the longest length of any file
    assert "at 8192 tokens" in A.summary(files)[0]
