"""The headline cost figure, drawn from the committed headline rows: what a reader takes from it at a glance."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from harness.analysis import figures as P  # noqa: E402
from harness.analysis import frames as F  # noqa: E402
from harness.analysis.figures.headline import short_label  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
FILES = [RESULTS / "headline-cpu.jsonl", RESULTS / "long-headline-cpu.jsonl"]
CORE = ("full", "sliding_window", "block_sparse", "linear")
PANELS = [(mode, column) for mode in ("forward", "decode") for column in ("latency_ms", "peak_mem_bytes")]


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    out = tmp_path_factory.mktemp("headline")
    [(name, fig, where)] = list(P.figures(F.load_results(FILES), out, only=("headline",)))
    assert name == "headline" and not isinstance(fig, P.Skip), fig
    assert (where / "headline.png").exists()
    return fig


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def line(fig, gid: str):
    hits = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid() == gid]
    assert len(hits) == 1, f"expected one line {gid!r}, found {len(hits)}"
    return hits[0]


def test_one_colour_per_variant_in_every_panel(drawn):
    colours = {}
    for v in CORE:
        seen = {mcolors.to_rgb(line(drawn, f"headline:{m}:{c}:{v}").get_color()) for m, c in PANELS}
        assert len(seen) == 1, (v, seen)
        colours[v] = seen.pop()
    assert len(set(colours.values())) == len(CORE)
    assert {ln.get_gid().rsplit(":", 1)[1] for ax in drawn.axes for ln in ax.get_lines()
            if ln.get_gid() and ln.get_gid().startswith("headline:")} == set(CORE)  # no serving or hybrid series


def test_four_short_labels_without_defaults_and_a_legend_inside_the_figure(drawn):
    [legend] = drawn.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["full (SDPA)", "sliding_window w=256 (Flex / blocked)", "block_sparse block=64 (Flex / gathered)",
                      "linear (chunked / recurrent)"]
    renderer = FigureCanvasAgg(drawn).get_renderer()
    drawn.draw(renderer)
    box, page = legend.get_window_extent(renderer), drawn.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1
    for handle, v in zip(legend.legend_handles, CORE, strict=True):
        assert mcolors.to_rgb(handle.get_color()) == mcolors.to_rgb(line(drawn, f"headline:forward:latency_ms:{v}").get_color())


def test_every_length_of_both_files_is_drawn(drawn):
    long_forward = {r["variant"]: r for r in rows(FILES[1])}
    for v in CORE:
        x = list(line(drawn, f"headline:forward:latency_ms:{v}").get_xdata())
        y = list(line(drawn, f"headline:forward:latency_ms:{v}").get_ydata())
        assert x == [4096, 16384, long_forward[v]["seq_len"]]
        assert y[-1] == pytest.approx(long_forward[v]["latency_ms"])
    assert max(line(drawn, "headline:forward:latency_ms:linear").get_xdata()) == 2**20
    assert max(line(drawn, "headline:forward:latency_ms:full").get_xdata()) == 2**17
    decode = {v: sorted(r["seq_len"] for r in rows(FILES[0]) if r["variant"] == v and r["mode"] == "decode"
                        and r["batch_size"] == 1 and r.get("scope", "op") == "op") for v in CORE}
    for v in CORE:
        assert list(line(drawn, f"headline:decode:latency_ms:{v}").get_xdata()) == decode[v]
    assert decode["full"][-1] == 2**17 and decode["linear"] == [2**p for p in range(10, 21)]
    one_step = next(r for r in rows(FILES[0]) if r["variant"] == "full" and r["mode"] == "decode"
                    and r["seq_len"] == 16384 and r["batch_size"] == 1 and r.get("scope") == "op")
    full = line(drawn, "headline:decode:latency_ms:full")
    assert list(full.get_ydata())[list(full.get_xdata()).index(16384)] == pytest.approx(one_step["latency_ms"])


def test_noisy_cells_are_hollow(drawn):
    noisy = {(r["variant"], r["mode"], r["seq_len"]) for f in FILES for r in rows(f)
             if r["noisy"] and r["variant"] in CORE and r["batch_size"] == 1 and r.get("scope") == "op"}
    assert noisy
    hollow = {(v, m, int(x)) for v in CORE for m in ("forward", "decode") for ax in drawn.axes for ln in ax.get_lines()
              if ln.get_gid() == f"hollow:headline:{m}:latency_ms:{v}" for x in ln.get_xdata()}
    assert hollow == noisy


def test_short_label_keeps_sizes_and_changed_parameters_only():
    assert short_label("full", {"softcap": 0.0, "prefix": 0, "alibi": False}, ["sdpa"]) == "full (SDPA)"
    assert short_label("full", {"softcap": 30.0}, ["flex", "sdpa"]) == "full softcap=30 (Flex / SDPA)"
    assert short_label("sliding_window", {"window": 128, "sinks": 0}, ["blocked", "blocked"]) == "sliding_window w=128 (blocked)"
    assert short_label("linear", {"feature_map": "elu1", "chunk_size": 128}) == "linear chunk_size=128"
