"""The frontier's figures (harness/analysis/figures/frontier.py) from the committed rows: a forest at 1/8, one panel per
model, and the score-against-bytes curves beside it. Drawn once for the module (a few seconds)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.colors as mcolors
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from test_frontier_analysis import BUDGETS, grid, ones, passkey_rows, retrieval_rows, variant_row

from harness.analysis import frames as F
from harness.analysis import frontier as FR
from harness.analysis.figures import frontier as FF
from harness.analysis.figures import frontier_curves as FC

ROOT = Path(__file__).resolve().parents[1]
FILES = ("frontier-smollm2-cpu", "frontier-qwen-cpu", "frontier-gemma3-cpu", "retrieval-smollm2-cpu",
         "retrieval-smollm2-4k-cpu", "retrieval-qwen-cpu", "prefill-passkey-smollm2-cpu", "prefill-ruler-smollm2-cpu")


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """(accuracy rows, points, forest panels, the forest Figure, the out directory) of the committed frontier rows."""
    acc = F.load_results([str(ROOT / "results" / f"{f}.jsonl") for f in FILES]).accuracy
    out = tmp_path_factory.mktemp("frontier")
    fig = FF.plot_frontier(acc, out, formats=("png",))
    FC.plot_frontier_curves(acc, out, formats=("png",))
    pts = FR.points(acc)
    return acc, pts, FF.forest(pts), fig, out


def _panels(fig) -> list:
    return [ax for ax in fig.get_axes() if (ax.get_gid() or "").startswith("frontier:")]


def _dots(ax) -> dict[str, tuple[float, float, object]]:
    """method -> (x, y, line) of a panel's dots."""
    gid = ax.get_gid()
    return {ln.get_gid()[len(gid) + 1:]: (float(ln.get_xdata()[0]), float(ln.get_ydata()[0]), ln)
            for ln in ax.get_lines() if (ln.get_gid() or "").startswith(gid + ":")}


def test_one_panel_per_model_in_the_readme_order_at_its_longest_length(drawn):
    _, _, panels, fig, out = drawn
    assert [p.model for p in panels] == ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]
    assert [p.eval_len for p in panels] == [8192, 8192, 8192]  # each model's longest length run at 1/8
    assert [ax.get_gid() for ax in _panels(fig)] == ["frontier:SmolLM2-135M", "frontier:Qwen2.5-Coder-0.5B",
                                                     "frontier:Gemma 3 270M"]
    titles = [t.get_text() for t in fig.findobj(lambda a: (getattr(a, "get_gid", lambda: "")() or "").startswith("title:"))]
    assert len(titles) == 3 and all("at 8192 tokens" in t for t in titles)
    assert sorted(p.name for p in out.iterdir()) == ["frontier-curves.png", "frontier.png"]  # nothing per length


def test_dots_are_ranking_at_one_eighth_sorted_best_first_within_each_block(drawn):
    _, pts, panels, fig, _ = drawn
    rk = FR.ranking(pts, at="1/8")
    for ax, panel in zip(_panels(fig), panels, strict=True):
        dots = _dots(ax)
        complete = panel.blocks[0]
        assert complete.complete and all(not b.complete for b in panel.blocks[1:])
        for block in panel.blocks:
            ys = [dots[m][1] for m in block.rows["method"]]
            xs = [dots[m][0] for m in block.rows["method"]]
            assert ys == sorted(ys) and xs == sorted(xs, reverse=True)  # top to bottom, best first
        mine = rk[(rk["model"] == panel.model) & (rk["eval_len"] == panel.eval_len)].set_index("method")
        for r in complete.rows.itertuples():  # the number is the ranking's, at 1/8 (quantized: its score)
            col = "score" if r.kind == "quantized" else "at"
            assert dots[r.method][0] == pytest.approx(mine.loc[r.method, col])
    smol = panels[0]
    assert [b.tasks for b in smol.blocks] == [("passkey", "niah_single_1"), ("passkey",)]
    assert {"vertical_slash", "xattention", "flexprefill"} <= set(smol.blocks[0].rows["method"])
    assert {"sliding_window", "sinks", "block_sparse", "moba"} == set(smol.blocks[1].rows["method"])
    assert smol.passkey == (20, 5)  # full's passkey cell: 4 keys in each of 5 haystacks


def test_every_family_has_its_colour_and_one_legend_entry(drawn):
    _, _, panels, fig, _ = drawn
    for ax, panel in zip(_panels(fig), panels, strict=True):
        dots = _dots(ax)
        for block in panel.blocks:
            for r in block.rows.itertuples():
                line = dots[r.method][2]
                assert mcolors.same_color(line.get_color(), FF.FAMILY[r.kind][1])
                assert (line.get_markerfacecolor() == "white") == (not block.complete)  # hollow: fewer tasks
                assert line.get_marker() == {"ceiling": ">", "floor": "<"}.get(r.edge, "o")
    kinds = {k for p in panels for b in p.blocks for k in b.rows["kind"]}
    assert kinds == set(FF.FAMILY)  # press, variant, quantized, retrieval, sparse prefill
    assert len({c for _, c in FF.FAMILY.values()}) == len(FF.FAMILY)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    family = [name for name, _ in FF.FAMILY.values()]
    assert all(labels.count(name) == 1 for name in family) and len(labels) == len(set(labels))
    assert len(labels) <= min(sum(len(b.rows) for b in p.blocks) for p in panels)  # never longer than a panel
    assert {FF.LINES["reference"][0], FF.LINES["oracle"][0]} <= set(labels)
    edges = {e for p in panels for b in p.blocks for e in b.rows["edge"]}
    assert edges == {"", "ceiling", "floor"} and "every cell 1.0 (ceiling) / every cell 0 (floor)" in labels


def test_full_and_the_oracle_are_lines_with_bands_in_every_block(drawn):
    _, _, panels, fig, _ = drawn
    for ax, panel in zip(_panels(fig), panels, strict=True):
        gid = ax.get_gid()
        lines = [c for c in ax.collections if c.get_gid() in (f"{gid}:reference", f"{gid}:oracle")]
        bands = [c for c in ax.collections if c.get_gid() in (f"band:{gid}:reference", f"band:{gid}:oracle")]
        assert len(lines) == len(bands) == 2 * len(panel.blocks)
        assert all(set(b.lines) == {"reference", "oracle"} for b in panel.blocks)
        assert "full" not in _dots(ax) and "oracle" not in _dots(ax)  # lines, not rows
        assert ax.get_xlim() == pytest.approx((-0.04, 1.04))
    assert _panels(fig)[-1].get_xlabel() == FF.X_LABEL
    caption = next(t for t in fig.texts if t.get_gid() == "caption")
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    box = caption.get_window_extent(renderer)
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width and box.y0 >= 0  # not cut off


def test_curves_draw_a_few_methods_per_model(drawn):
    _, pts, panels, _, out = drawn
    roles = [FC.curve_methods(p) for p in panels]
    assert roles[0] == {"full": "full", "oracle": "oracle", "press 1": "keydiff", "press 2": "tova",
                        "retrieval": "retrieval (dense)", "quantized": "quantized 4-bit"}
    assert all(len(r) <= 6 for r in roles)
    c = FC.curves(pts, panels[0])
    kd = c[c["method"] == "retrieval (dense)"].set_index("budget")  # at 8K the presses ran 1/8 alone
    assert list(kd.index) == ["1/16", "1/8", "1/4"] and (kd["kv_fraction"].diff().dropna() > 0).all()
    assert (out / "frontier-curves.png").stat().st_size > 0


def test_curves_legend_is_at_most_six_entries():
    rows = grid({"oracle": {b: ones(18) for b in BUDGETS}, "snapkv": {b: ones(12) for b in BUDGETS},
                 "tova": {b: ones(10) for b in BUDGETS}, "knorm": {b: ones(8) for b in BUDGETS}}, ones(19))
    rows += passkey_rows("quantized", ones(19), nbits=4) + passkey_rows("quantized", ones(3), nbits=2)
    rows += retrieval_rows("bm25", {b: ones(16) for b in BUDGETS}) + retrieval_rows("dense", {"1/8": ones(4)})
    fig = FC.plot_frontier_curves(pd.DataFrame(rows))
    (ax,) = fig.get_axes()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["full", "oracle", "snapkv", "tova", "retrieval (bm25)", "quantized 4-bit"]


def test_synthetic_rows_a_variant_on_passkey_only_and_an_unranked_task(tmp_path):
    """Two lengths: the forest takes the longer; a task full fails is not ranked, so the variant on passkey alone is
    in the complete block; a press cut short is left out, saying so; a model with no cell at 1/8 is skipped; a
    subject's dtype is in its name."""
    rows = []
    for L in (4096, 8192):
        rows += grid({"oracle": {b: ones(18) for b in BUDGETS}, "snapkv": {b: ones(12) for b in BUDGETS}}, ones(19),
                     eval_len=L)
        rows += grid({"oracle": {b: ones(5) for b in BUDGETS}}, ones(4), task="niah_multikey_1", eval_len=L)
        rows += [variant_row("sliding_window:window=512,backend=blocked", ones(1, 4), depth=d, eval_len=L)
                 for d in (0.0, 0.25, 0.5, 0.75, 1.0)]
    rows += passkey_rows("knorm", ones(3, 16), budget="1/8", eval_len=8192)[:4]  # 4 of 5 depths: left out
    rows += grid({"snapkv": {"1/2": ones(10)}}, ones(20), model="other")  # no 1/8: no panel
    rows = [r | {"dtype": "bfloat16"} for r in rows]
    fig = FF.plot_frontier(pd.DataFrame(rows), tmp_path)
    FC.plot_frontier_curves(pd.DataFrame(rows), tmp_path)
    (panel,) = FF.forest(FR.points(rows))
    assert (panel.model, panel.eval_len, panel.tasks) == ("m (bfloat16)", 8192, ("passkey",))
    assert len(panel.blocks) == 1 and list(panel.blocks[0].rows["method"]) == ["snapkv", "sliding_window"]
    assert panel.left_out == [("knorm", "16 of full's 20 passkey examples: a run cut short, not paired")]
    assert [ax.get_gid() for ax in _panels(fig)] == ["frontier:m (bfloat16)"]
    caption = next(t for t in fig.texts if t.get_gid() == "caption").get_text().replace("\n", " ")
    assert "(passkey: 5 haystacks of 4 keys)" in caption and "Left out: m (bfloat16)'s knorm (16 of full's 20" in caption
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frontier-curves.png", "frontier.png"]
