"""Each figure is drawn from small synthetic results and its drawn data are checked against the rows."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from harness.analysis import derive as D  # noqa: E402
from harness.analysis import figures as P  # noqa: E402
from harness.analysis import frames as F  # noqa: E402
from harness.analysis import trust as T  # noqa: E402
from harness.cli import main  # noqa: E402

LENS = [256, 512, 1024, 2048, 4096, 8192]
ENV = {"device": "cpu", "device_name": "Test CPU (2 cores)", "torch_version": "2.13.0", "project_version": "0.1.0",
       "dtype": "float32", "batch_size": 1, "num_heads": 4, "head_dim": 32, "scope": "op", "position": "none", "seed": 0}
# (variant, params, backend, latency in ms as a function of L)
SERIES = [
    ("full", {}, "sdpa", lambda L: 1e-5 * L**2),
    ("full", {}, "reference", lambda L: 3e-5 * L**2),
    ("sliding_window", {"window": 256}, "flex", lambda L: 4e-3 * L),
    # wins at 256, loses at 512, wins from 1k on: the crossover is where it wins *for good*
    ("toy", {}, "reference", lambda L: {256: 0.5, 512: 5.0}.get(L, 5e-3 * L)),
]
FAILED = {("full", "sdpa", 8192): "oom", ("full", "reference", 4096): "timeout", ("full", "reference", 8192): "oom",
          ("toy", "reference", 8192): "error"}


def cost_rows(mem_limit: bool = True, device_name: str = ENV["device_name"]) -> list[dict]:
    rows = []
    for variant, params, backend, lat in SERIES:
        for L in LENS:
            status = FAILED.get((variant, backend, L), "ok")
            ok = status == "ok"
            ms = lat(L)
            row = dict(ENV, device_name=device_name, run_id="r", variant=variant, variant_params=params, backend=backend,
                       mode="forward", seq_len=L, status=status, error=None if ok else "boom",
                       latency_ms=ms if ok else None, latency_iqr_ms=0.04 * ms if ok else None,
                       tokens_per_s=L / ms * 1e3 if ok else None,
                       peak_mem_bytes=(4.0 * L * L + 2**20 if variant == "full" else 64.0 * L + 2**20) if ok else None,
                       flops=4.0 * L * L * 32, achieved_flops_per_s=4.0 * L * L * 32 / ms * 1e3 if ok else None,
                       peak_flops_per_s=1e12)
            if mem_limit:
                row["mem_limit_bytes"] = 24 * 2**30
            rows.append(row)
    return rows


POSITIONS = [("none", {}, 0.3), ("rope", {}, 0.5), ("rope_yarn", {"factor": 4.0}, 0.1)]
ACC_LENS = [128, 256, 512, 1024]
DEPTHS = [0.0, 0.5, 1.0]


def passkey_value(decay: float, L: int, depth: float) -> float:
    return 1.0 if L <= 256 else max(0.0, 1.0 - decay * np.log2(L / 256) * (0.5 + depth))


def acc_rows() -> list[dict]:
    rows = []
    for pos, pp, decay in POSITIONS:
        for L in ACC_LENS:
            for d in DEPTHS:
                v = passkey_value(decay, L, d)
                rows.append(dict(run_id="a", task="passkey", variant="full", variant_params={}, position=pos, position_params=pp,
                                 train_len=256, eval_len=L, metric="accuracy", value=v, ci_low=v - 0.05, ci_high=v + 0.05,
                                 n=50, seed=0, depth=d, device="cpu", device_name=ENV["device_name"], torch_version="2.13.0"))
    for variant, params, value in [("full", {}, 0.99), ("sliding_window", {"window": 256}, 0.6)]:
        rows.append(dict(run_id="m", task="mqar", variant=variant, variant_params=params, position="rope", position_params={},
                         train_len=256, eval_len=256, metric="accuracy", value=value, ci_low=None, ci_high=None, n=100, seed=0))
    for L in LENS[:4]:
        rows.append(dict(run_id="f", task="fidelity", variant="sliding_window", variant_params={"window": 256},
                         backend="flex", position="none", position_params={}, seq_len=L, metric="rel_l2",
                         value=1e-3 * L / 256, ci_low=None, ci_high=None, n=4, seed=0))
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def cost() -> pd.DataFrame:
    return F.prepare_cost(pd.DataFrame(cost_rows()))


@pytest.fixture(scope="module")
def acc() -> pd.DataFrame:
    return F.prepare_accuracy(pd.DataFrame(acc_rows()))


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("figs")


@pytest.fixture(scope="module")
def latency_fig(cost, out):
    return P.plot_latency(cost, out)


def by_gid(fig, gid: str, kind: str = "lines"):
    hits = [a for ax in fig.axes for a in getattr(ax, kind) if a.get_gid() == gid]
    assert len(hits) == 1, f"expected one {kind[:-1]} with gid {gid!r}, found {len(hits)}"
    return hits[0]


def expected(variant: str, backend: str, column: str = "latency_ms") -> tuple[list[int], list[float]]:
    rows = [r for r in cost_rows() if r["variant"] == variant and r["backend"] == backend]
    return [r["seq_len"] for r in rows], [r[column] if r["status"] == "ok" else np.nan for r in rows]


def assert_line(line, xs, ys) -> None:
    np.testing.assert_array_equal(line.get_xdata(), xs)
    y = np.asarray(line.get_ydata(), dtype=float)
    np.testing.assert_allclose(y, np.asarray(ys, dtype=float), rtol=1e-12)  # NaN where the cell did not run
    assert not np.any(y == 0), "a non-ok cell was drawn as zero"


def test_latency_lines_equal_ok_latencies_and_failures_break_the_line(latency_fig, out):
    assert (out / "latency.png").stat().st_size > 0
    for variant, params, backend, _ in SERIES:
        label = f"{F.spec_label(variant, params)}/{backend}"
        assert_line(by_gid(latency_fig, f"latency:{label}"), *expected(variant, backend))
    ax = latency_fig.axes[0]
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert "(ms)" in ax.get_ylabel() and "(tokens)" in ax.get_xlabel()


def test_latency_band_spans_the_iqr(latency_fig):
    band = by_gid(latency_fig, "band:sliding_window(window=256)/flex", "collections")
    ys = band.get_paths()[0].vertices[:, 1]
    lat = np.array([4e-3 * L for L in LENS])
    assert ys.min() == pytest.approx((lat - 0.02 * lat).min())
    assert ys.max() == pytest.approx((lat + 0.02 * lat).max())


def test_oom_and_timeout_marked_at_their_length(latency_fig):
    for status, label, at in [("oom", "full/sdpa", [8192]), ("timeout", "full/reference", [4096]),
                              ("oom", "full/reference", [8192])]:
        marks = by_gid(latency_fig, f"{status}:{label}", "collections")
        np.testing.assert_array_equal(marks.get_offsets()[:, 0], at)
    # an error is not a length limit: it breaks the line but gets no marker
    assert not [c for c in latency_fig.axes[0].collections if c.get_gid() == "error:toy/reference"]


def test_caption_names_device_and_torch(latency_fig):
    caption = latency_fig.get_supxlabel()
    assert ENV["device_name"] in caption and "torch 2.13.0" in caption


def test_throughput_lines(cost, out):
    fig = P.plot_throughput(cost, out)
    assert (out / "throughput.png").exists()
    assert_line(by_gid(fig, "throughput:full/sdpa"), *expected("full", "sdpa", "tokens_per_s"))
    assert "tokens/s" in fig.axes[0].get_ylabel()


def test_memory_in_mib_with_device_limit(cost, out):
    fig = P.plot_memory(cost, out)
    assert (out / "memory.png").exists()
    xs, ys = expected("full", "sdpa", "peak_mem_bytes")
    assert max(v for v in ys if v == v) < 2**31  # so the axis is in MiB
    assert_line(by_gid(fig, "memory:full/sdpa"), xs, np.asarray(ys) / 2**20)
    assert "(MiB)" in fig.axes[0].get_ylabel()
    np.testing.assert_array_equal(by_gid(fig, "oom:full/sdpa", "collections").get_offsets()[:, 0], [8192])
    # 24 GiB is > 100x the largest peak (64 MiB): named in a note rather than squashing the data
    top = max(v for v in ys if v == v) / 2**20
    note = by_gid(fig, "reference_note").get_label()  # in the legend, not over the curves
    assert "24.0 GiB" in note and f"{24 * 2**10 / top:.3g}×" in note


def test_memory_limit_line_drawn_when_on_scale():
    rows = [dict(r, mem_limit_bytes=2**30) for r in cost_rows()]
    fig = P.plot_memory(F.prepare_cost(pd.DataFrame(rows)))
    assert by_gid(fig, "reference").get_ydata()[0] == 2**30 / 2**20


def test_memory_without_limit_column_draws_no_limit(out):
    fig = P.plot_memory(F.prepare_cost(pd.DataFrame(cost_rows(mem_limit=False))))
    assert not [a for ax in fig.axes for a in [*ax.lines, *ax.texts] if str(a.get_gid()).startswith("reference")]


def test_flops_fraction_is_achieved_over_peak(cost, out):
    fig = P.plot_flops_fraction(cost, out)
    xs, ys = expected("sliding_window", "flex", "achieved_flops_per_s")
    assert_line(by_gid(fig, "flops_fraction:sliding_window(window=256)/flex"), xs, np.asarray(ys) / 1e12)
    with pytest.raises(P.Skip, match="peak"):
        P.plot_flops_fraction(cost.drop(columns=["peak_flops_per_s"]))


def first_winning_length(variant: str, backend: str) -> int:
    """Definition: the shortest length from which the variant beats the fastest full at every longer shared length."""
    rows = cost_rows()
    full = {}
    for r in rows:
        if r["variant"] == "full" and r["status"] == "ok":
            full[r["seq_len"]] = min(full.get(r["seq_len"], np.inf), r["latency_ms"])
    mine = {r["seq_len"]: r["latency_ms"] for r in rows if r["variant"] == variant and r["status"] == "ok"}
    shared = sorted(set(full) & set(mine))
    for L in shared:
        if all(mine[m] < full[m] for m in shared if m >= L):
            return L
    raise AssertionError("never wins")


def test_speedup_over_fastest_full_and_crossover_annotated(cost, out):
    fig = P.plot_speedup(cost, out)
    assert (out / "speedup.png").exists()
    line = by_gid(fig, "speedup:sliding_window(window=256)/flex")
    shared = [L for L in LENS if L <= 4096]  # full/sdpa fails at 8k, so there is no ratio there
    np.testing.assert_array_equal(line.get_xdata(), shared)
    np.testing.assert_allclose(line.get_ydata(), [1e-5 * L**2 / (4e-3 * L) for L in shared])
    for label, variant, backend in [("sliding_window(window=256)/flex", "sliding_window", "flex"),
                                    ("toy/reference", "toy", "reference")]:
        note = by_gid(fig, f"crossover:{label}", "texts")
        assert note.xy[0] == first_winning_length(variant, backend)
    assert first_winning_length("toy", "reference") == 1024  # the synthetic data were built so
    assert not [t for t in fig.axes[0].texts if t.get_gid() == "crossover:full/sdpa"]


def test_speedup_skips_without_full(cost):
    with pytest.raises(P.Skip, match="full"):
        P.plot_speedup(cost[cost["variant"] != "full"])


def test_fidelity_lines(acc, out):
    fig = P.plot_fidelity(acc, out)
    assert (out / "fidelity.png").exists()
    line = by_gid(fig, "fidelity:sliding_window(window=256)/flex")
    np.testing.assert_array_equal(line.get_xdata(), LENS[:4])
    np.testing.assert_allclose(line.get_ydata(), [1e-3 * L / 256 for L in LENS[:4]])


def test_accuracy_vs_length_averages_depth_and_marks_train_length(acc, out):
    fig = P.plot_accuracy(acc, out)
    assert (out / "accuracy.png").exists()
    (ax,) = [a for a in fig.axes if a.get_title() == "passkey · accuracy"]
    for pos, pp, decay in POSITIONS:
        line = by_gid(fig, f"accuracy:{F.spec_label(pos, pp)}")
        np.testing.assert_array_equal(line.get_xdata(), ACC_LENS)
        np.testing.assert_allclose(line.get_ydata(), [np.mean([passkey_value(decay, L, d) for d in DEPTHS]) for L in ACC_LENS])
    train = [ln for ln in ax.lines if ln.get_gid() == "train_len:256"]
    assert len(train) == 1 and train[0].get_xdata()[0] == 256


def test_position_heatmap_cells_equal_mean_over_depth(acc, out):
    fig = P.plot_position_heatmap(acc, out)
    assert (out / "position_heatmap.png").exists()
    mesh = by_gid(fig, "heatmap:passkey:accuracy", "collections")
    rows = sorted(F.spec_label(p, pp) for p, pp, _ in POSITIONS)
    decay = {F.spec_label(p, pp): d for p, pp, d in POSITIONS}
    want = np.array([[np.mean([passkey_value(decay[r], L, d) for d in DEPTHS]) for L in ACC_LENS] for r in rows])
    np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(want.shape), want)
    ax = mesh.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == rows


def test_passkey_heatmap_is_length_by_depth(acc, out):
    fig = P.plot_passkey(acc, out)
    assert (out / "passkey.png").exists()
    for pos, pp, decay in POSITIONS:
        mesh = by_gid(fig, f"passkey:{F.spec_label(pos, pp)}:accuracy", "collections")
        want = np.array([[passkey_value(decay, L, d) for L in ACC_LENS] for d in DEPTHS])
        np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(want.shape), want)


def test_tradeoff_points_join_accuracy_and_cost_by_variant(cost, acc, out):
    fig = P.plot_tradeoff(cost, acc, out)
    assert (out / "tradeoff.png").exists()
    points = by_gid(fig, "tradeoff:mqar:accuracy", "collections")
    # longest length where both joined variants ran ok: full/sdpa ooms at 8k -> 4k; fastest full backend is sdpa
    L = 4096
    want = {(L / (1e-5 * L**2) * 1e3, 0.99), (L / (4e-3 * L) * 1e3, 0.6)}
    got = {tuple(p) for p in np.round(points.get_offsets(), 6)}
    assert got == {tuple(np.round(p, 6)) for p in want}
    sizes = dict(zip([tuple(np.round(p, 6)) for p in points.get_offsets()], points.get_sizes(), strict=True))
    full_pt = tuple(np.round((L / (1e-5 * L**2) * 1e3, 0.99), 6))
    assert sizes[full_pt] == max(sizes.values())  # full uses the most memory at 4k


class FakeLayout:
    def __init__(self, block_size: int):
        self.block_size = block_size

    def layout(self, q_len: int, k_len: int | None = None, causal: bool = True) -> np.ndarray:
        n = -(-q_len // self.block_size)
        return np.tril(np.ones((n, n), dtype=bool)) & (np.add.outer(np.arange(n), -np.arange(n)) < 2)


def test_block_sparse_layout_drawn_from_row_params(out):
    df = pd.DataFrame({"variant": ["block_sparse"] * 3, "variant_params": [{"block_size": 64}] * 3, "seq_len": [512, 1024, 8192]})
    built = []

    def build(name, **params):
        built.append((name, params))
        return FakeLayout(**params)

    fig = P.plot_block_sparse_layout(df, out, build=build)
    assert (out / "block_sparse_layout.png").exists()
    assert built == [("block_sparse", {"block_size": 64})]
    image = [im for ax in fig.axes for im in ax.images][0]
    # 8192 / 64 = 128 blocks is over the 64-block limit, so the drawn length is 1024 (16 blocks)
    np.testing.assert_array_equal(np.asarray(image.get_array()), FakeLayout(64).layout(1024))


def test_block_sparse_layout_too_large_to_draw_is_a_skip_and_never_built():
    # 1M tokens in 64-token blocks: a 16384² grid (a GiB to build, 18 GB to draw) that a panel shows blank
    df = pd.DataFrame({"variant": ["block_sparse"], "variant_params": [{"block_size": 64}], "seq_len": [1 << 20]})
    asked = []

    class Layout(FakeLayout):
        def layout(self, q_len: int, k_len: int | None = None, causal: bool = True) -> np.ndarray:
            asked.append(q_len)
            return super().layout(q_len, k_len, causal)

    with pytest.raises(P.Skip, match="16384×16384 blocks"):
        P.plot_block_sparse_layout(df, build=lambda name, **params: Layout(**params))
    assert asked == []


def test_block_sparse_layout_absent_variant_is_a_skip():
    df = pd.DataFrame({"variant": ["block_sparse"], "variant_params": [{}], "seq_len": [1024]})

    def build(name, **params):
        raise ValueError("unknown attention 'block_sparse'")

    with pytest.raises(P.Skip, match="block_sparse"):
        P.plot_block_sparse_layout(df, build=build)


def test_block_sparse_layout_with_the_real_variant():
    import attn

    if "block_sparse" not in {v["name"] for v in attn.list_attention()}:
        pytest.skip("block_sparse not registered in this build")
    module = attn.build_attention("block_sparse")
    if not hasattr(module, "layout"):
        pytest.skip("block_sparse has no layout() yet")
    df = pd.DataFrame({"variant": ["block_sparse"], "variant_params": [{}], "seq_len": [2048]})
    fig = P.plot_block_sparse_layout(df)
    image = [im for ax in fig.axes for im in ax.images][0]
    np.testing.assert_array_equal(np.asarray(image.get_array()), np.asarray(module.layout(2048), dtype=bool))


def test_one_colour_per_variant_across_figures(tmp_path):
    results = F.load_results([write_jsonl(tmp_path / "c.jsonl", cost_rows()), write_jsonl(tmp_path / "a.jsonl", acc_rows())])
    figs = {name: fig for name, fig, _ in P.figures(results, None, only=("latency", "fidelity"))}
    a = by_gid(figs["latency"], "latency:sliding_window(window=256)/flex").get_color()
    b = by_gid(figs["fidelity"], "fidelity:sliding_window(window=256)/flex").get_color()
    assert matplotlib.colors.to_rgb(a) == matplotlib.colors.to_rgb(b)


# -- the command -------------------------------------------------------------------------------------

def test_plot_command_draws_supported_figures_and_says_what_it_skipped(tmp_path, capsys):
    c = write_jsonl(tmp_path / "c.jsonl", cost_rows())
    rc = main(["plot", str(c), "--out", str(tmp_path / "figs"), "--only", "latency", "--only", "fidelity",
               "--only", "block_sparse_layout", "--format", "svg"])
    text = capsys.readouterr().out
    assert rc == 0
    assert (tmp_path / "figs" / "latency.svg").exists()
    assert "skipped fidelity: no accuracy rows" in text
    assert "skipped block_sparse_layout: no block_sparse rows" in text


def test_plot_command_splits_mixed_devices(tmp_path, capsys):
    c = write_jsonl(tmp_path / "c.jsonl", cost_rows() + cost_rows(device_name="Other GPU"))
    assert main(["plot", str(c), "--out", str(tmp_path / "figs"), "--only", "memory"]) == 0
    assert "several devices" in capsys.readouterr().out
    assert (tmp_path / "figs" / "other-gpu" / "memory.png").exists()
    assert (tmp_path / "figs" / "test-cpu-2-cores" / "memory.png").exists()
    with pytest.raises(ValueError, match="mix 2 devices"):
        P.plot_memory(F.load_results([c]).cost)


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"),
    ("columns", "lack column(s) latency_ms"),
    ("no_ok", "no ok cost rows"),
    ("garbage", "neither cost rows"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, case, message):
    path = tmp_path / "r.jsonl"
    rows = cost_rows()
    if case == "columns":
        write_jsonl(path, [{k: v for k, v in r.items() if k != "latency_ms"} for r in rows])
    elif case == "no_ok":
        write_jsonl(path, [dict(r, status="error", latency_ms=None) for r in rows])
    elif case == "garbage":
        write_jsonl(path, [{"hello": 1}])
    rc = main(["plot", str(path), "--out", str(tmp_path / "figs")])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.count("\n") == 1
    assert "Traceback" not in err


def test_failed_cells_without_a_backend_stay_on_their_series():
    # as the sweep writes them: a failed cell records the backend requested, not one that ran
    rows = []
    for r in cost_rows():
        r = dict(r, backend_requested="reference" if r["backend"] == "reference" else "auto")
        if r["status"] != "ok":
            r["backend"] = None
        rows.append(r)
    fig = P.plot_latency(F.prepare_cost(pd.DataFrame(rows)))
    np.testing.assert_array_equal(by_gid(fig, "oom:full/sdpa", "collections").get_offsets()[:, 0], [8192])
    np.testing.assert_array_equal(by_gid(fig, "timeout:full/reference", "collections").get_offsets()[:, 0], [4096])
    assert_line(by_gid(fig, "latency:full/sdpa"), *expected("full", "sdpa"))


def test_labels_leave_out_registered_defaults_but_keep_the_defining_parameter():
    import attn

    specs = {s["name"]: s["params"] for s in attn.list_attention()}
    linear = dict(specs["linear"])
    assert F.spec_label("linear", linear) == f"linear(feature_map={linear['feature_map']})"
    assert F.spec_label("sliding_window", {"window": specs["sliding_window"]["window"]}) == \
        f"sliding_window(window={specs['sliding_window']['window']})"
    if "block_sparse" in specs:
        params = dict(specs["block_sparse"], random_blocks=specs["block_sparse"]["random_blocks"] + 3)
        first = next(iter(specs["block_sparse"]))
        assert F.spec_label("block_sparse", params) == \
            f"block_sparse({first}={params[first]}, random_blocks={params['random_blocks']})"
    assert F.spec_label("my_plugin", {"a": 1, "b": 2.5}) == "my_plugin(a=1, b=2.5)"  # unknown: every param


def test_accuracy_seeds_are_averaged_with_a_t_interval_and_task_columns_split_lines():
    from scipy import stats

    rows = []
    for num_pairs, base in [(4, 0.9), (8, 0.6)]:
        for seed, noise in enumerate([-0.05, 0.0, 0.08]):
            for L in (64, 128):
                rows.append(dict(task="my_task", variant="full", variant_params={}, position="rope", position_params={},
                                 train_len=64, eval_len=L, metric="accuracy", value=base + noise - (L == 128) * 0.2,
                                 ci_low=None, ci_high=None, n=100, seed=seed, num_pairs=num_pairs, status="ok"))
    rows.append(dict(rows[0], seed=9, value=None, status="error"))  # a failed seed is not a zero
    fig = P.plot_accuracy(F.prepare_accuracy(pd.DataFrame(rows)))
    for num_pairs, base in [(4, 0.9), (8, 0.6)]:
        line = by_gid(fig, f"accuracy:rope [num_pairs={num_pairs}]")
        for L, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
            vals = np.array([base + n - (L == 128) * 0.2 for n in (-0.05, 0.0, 0.08)])
            assert y == pytest.approx(vals.mean())
        band = by_gid(fig, f"band:rope [num_pairs={num_pairs}]", "collections").get_paths()[0].vertices[:, 1]
        vals = np.array([base + n for n in (-0.05, 0.0, 0.08)])  # at L = 64
        half = stats.t.ppf(0.975, len(vals) - 1) * vals.std(ddof=1) / np.sqrt(len(vals))
        assert band.max() == pytest.approx(min(1.0, vals.mean() + half))  # an accuracy's interval stops at 1
        assert band.min() == pytest.approx(vals.mean() - 0.2 - half)  # at L = 128: the lower edge is not clipped
    assert by_gid(fig, "band:rope [num_pairs=4]", "collections").get_paths()[0].vertices[:, 1].max() == 1.0  # 0.91 + 0.16


# -- MQAR (Zoology's protocol) ---------------------------------------------------------------------

MQAR_PRESET = "tiny"
MQAR_VOCAB = 64  # chance = 1 / (vocab / 2)
MQAR_LRS = (1e-3, 3e-3)
# seed -> value added at each learning rate: the best rate differs by seed, so "best per seed, then mean" differs
# from "best mean rate", from "mean over rates" and from "best over everything"
MQAR_LR_NOISE = {0: (0.05, -0.10), 1: (-0.08, 0.02), 2: (0.01, 0.03)}
# (family, variant_spec, variant_params, {d_model: base accuracy}); None = the preset's own width
MQAR_MODELS = [
    ("full", "full", {}, {None: 0.5, 128: 0.8, 256: 0.96}),  # 256: per-seed bests near 1, interval clipped at 1
    ("sliding_window", "sliding_window:window=8", {"window": 8}, {64: 0.0, 128: 0.3}),  # 64: clipped at 0
    ("sliding_window", "sliding_window:window=32", {"window": 32}, {64: 0.4, 128: 0.6}),
]


def mqar_state(params: dict, L: int, width: int) -> int:
    """Numbers one layer carries to decode: a KV cache over the context, or over the window."""
    return 2 * min(params.get("window", L), L) * width


def mqar_rows() -> list[dict]:
    """2 families x 2-3 widths x 2 learning rates x 3 seeds x 2 training lengths, two metrics; plus extrapolation
    rows (eval at 2L) and a failed run, neither of which may reach the figure."""
    import attn

    preset = attn.PRESETS[MQAR_PRESET]["d_model"]
    rows = []
    for family, spec, params, bases in MQAR_MODELS:
        for d_model, base in bases.items():
            for L in (64, 128):
                for lr_i, lr in enumerate(MQAR_LRS):
                    for seed, noise in MQAR_LR_NOISE.items():
                        for eval_len in (L, 2 * L):
                            state = mqar_state(params, eval_len, d_model or preset)
                            acc = min(1.0, max(0.0, base - 0.1 * (L == 128) * (family == "full") + noise[lr_i]))
                            row = dict(task="mqar", variant=family, variant_spec=spec, variant_params=params,
                                       position="none", position_params={}, position_spec="none", train_len=L,
                                       eval_len=eval_len, num_pairs=eval_len // 16, chance=2 / MQAR_VOCAB,
                                       baseline=16 / eval_len, model=MQAR_PRESET, d_model=d_model, short_conv=None, lr=lr,
                                       seed=seed, n=256, state_bytes=4 * state, state_numbers=state, status="ok",
                                       stage="zero_shot", device="cpu", device_name=ENV["device_name"])
                            if eval_len != L:
                                acc = 0.0  # extrapolation: would pull every point down if it leaked in
                            rows.append(dict(row, metric="accuracy", value=acc, ci_low=max(0, acc - 0.05),
                                             ci_high=min(1, acc + 0.05)))
                            rows.append(dict(row, metric="exact_match", value=acc / 2, ci_low=None, ci_high=None))
    rows.append(dict(rows[0], lr=1e-2, value=None, ci_low=None, ci_high=None, status="error"))  # no value: never best
    return rows


def mqar_expected(rows: list[dict], L: int) -> dict[tuple[str, int | None], tuple[float, float, float, float]]:
    """(variant_spec, d_model) -> (mean over seeds of each seed's best accuracy over lr, t interval clipped to [0, 1],
    state_numbers), from the rows trained and evaluated at L, by plain loops."""
    from scipy import stats

    best: dict = {}
    state: dict = {}
    for r in rows:
        if r["metric"] != "accuracy" or r["status"] != "ok" or r["train_len"] != L or r["eval_len"] != L:
            continue
        key = (r["variant_spec"], r["d_model"])
        seeds = best.setdefault(key, {})
        seeds[r["seed"]] = max(seeds.get(r["seed"], -1.0), r["value"])
        state[key] = r["state_numbers"]
    out = {}
    for key, seeds in best.items():
        v = np.array(list(seeds.values()))
        half = stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
        out[key] = (v.mean(), max(0.0, v.mean() - half), min(1.0, v.mean() + half), state[key])
    return out


def band_edges(fig, gid: str) -> dict[float, tuple[float, float]]:
    """x -> (lowest, highest) y of a filled band."""
    verts = by_gid(fig, gid, "collections").get_paths()[0].vertices
    out: dict[float, tuple[float, float]] = {}
    for x, y in verts:
        lo, hi = out.get(x, (np.inf, -np.inf))
        out[x] = (min(lo, y), max(hi, y))
    return out


@pytest.fixture(scope="module")
def mqar_acc() -> pd.DataFrame:
    return F.prepare_accuracy(pd.DataFrame(mqar_rows()))


def test_mqar_figure_is_best_lr_then_mean_over_seeds_against_state_size(mqar_acc, tmp_path):
    fig = P.plot_mqar(mqar_acc, tmp_path)
    assert (tmp_path / "mqar.png").stat().st_size > 0
    assert sorted(ax.get_title() for ax in fig.axes) == ["trained and evaluated at 128", "trained and evaluated at 64"]
    rows = mqar_rows()
    clipped = set()
    for L in (64, 128):
        want = mqar_expected(rows, L)
        for family in ("full", "sliding_window"):
            points = sorted((st, mean, lo, hi) for (spec, _), (mean, lo, hi, st) in want.items()
                            if spec.split(":")[0] == family)
            line = by_gid(fig, f"mqar:{family} [train_len={L}]")
            np.testing.assert_array_equal(line.get_xdata(), [p[0] for p in points])  # the rows' state sizes, sorted
            np.testing.assert_allclose(line.get_ydata(), [p[1] for p in points], rtol=1e-12)
            edges = band_edges(fig, f"band:{family} [train_len={L}]")
            for st, _, lo, hi in points:
                assert edges[st] == pytest.approx((lo, hi), abs=1e-12)
                assert 0.0 <= edges[st][0] and edges[st][1] <= 1.0
                clipped |= {"low"} if lo == 0.0 else set()
                clipped |= {"high"} if hi == 1.0 else set()
        ax = by_gid(fig, f"mqar:full [train_len={L}]").axes
        assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
        assert ax.get_xlabel() == "decoding state per layer (numbers)"
        baseline, chance = by_gid(fig, f"baseline [train_len={L}]"), by_gid(fig, f"chance [train_len={L}]")
        assert baseline.get_ydata()[0] == pytest.approx(16 / L) and baseline.get_linestyle() == "--"
        assert chance.get_ydata()[0] == pytest.approx(2 / MQAR_VOCAB) and chance.get_linestyle() == ":"
        assert "baseline" in baseline.get_label() and "chance" in chance.get_label()
    assert clipped == {"low", "high"}  # the data reach both edges, so a missing clip would fail above
    assert "extrapolation" in fig.get_supxlabel()  # the 2L rows are counted, not drawn


def test_mqar_width_figure_has_one_curve_per_variant_spec(mqar_acc, tmp_path):
    import attn

    fig = P.plot_mqar_width(mqar_acc, tmp_path)
    assert (tmp_path / "mqar-width.png").stat().st_size > 0
    preset = attn.PRESETS[MQAR_PRESET]["d_model"]
    rows = mqar_rows()
    for L in (64, 128):
        gids = {ln.get_gid() for ax in fig.axes for ln in ax.lines if str(ln.get_gid()).startswith("mqar-width:")}
        labels = {F.spec_label(family, params): spec for family, spec, params, _ in MQAR_MODELS}
        assert {g for g in gids if g.endswith(f"[train_len={L}]")} == {f"mqar-width:{lab} [train_len={L}]" for lab in labels}
        want = mqar_expected(rows, L)
        for label, spec in labels.items():
            points = sorted(((d or preset), mean) for (s, d), (mean, *_) in want.items() if s == spec)
            line = by_gid(fig, f"mqar-width:{label} [train_len={L}]")
            np.testing.assert_array_equal(line.get_xdata(), [p[0] for p in points])  # None = the preset's width
            np.testing.assert_allclose(line.get_ydata(), [p[1] for p in points], rtol=1e-12)
        assert by_gid(fig, f"baseline [train_len={L}]").get_ydata()[0] == pytest.approx(16 / L)
    assert "mqar-width" in [f.name for f in P.FIGURES]


def test_mqar_table_picks_the_same_learning_rate_as_the_figure():
    from harness.accuracy.tasks import table

    rows = mqar_rows()
    t = table(rows, "mqar")  # with the extrapolation rows, two training lengths meet at eval length 128
    assert list(t.columns) == [64, 128, 256] and list(t.index.names) == ["variant_spec", "d_model", "train_len"]
    for L in (64, 128):
        for (spec, d), (mean, *_) in mqar_expected(rows, L).items():
            assert t.loc[(spec, d if d is not None else "preset", L), L] == pytest.approx(mean)
            assert t.loc[(spec, d if d is not None else "preset", L), 2 * L] == 0.0
    assert list(t.xs("sliding_window:window=8").index.get_level_values("d_model").unique()) == [64, 128]
    zoology = table([r for r in rows if r["eval_len"] == r["train_len"]], "mqar")  # one length each: no diagonal
    assert list(zoology.index.names) == ["variant_spec", "d_model"] and "pairs 4 at 64, 8 at 128" in zoology.columns.name


def test_accuracy_points_take_the_best_rate_by_the_metric_s_direction_and_keep_widths_apart():
    rows = [dict(task="lm", variant="full", variant_params={}, position="rope", position_params={}, train_len=64,
                 eval_len=64, metric="bpb", value=v + (d == 128) * 0.5, ci_low=None, ci_high=None, n=10, seed=s, lr=lr,
                 d_model=d) for d in (64, 128) for s in (0, 1) for lr, v in ((1e-3, 2.0 + s), (3e-3, 3.0 - s))]
    pts = D.accuracy_points(F.prepare_accuracy(pd.DataFrame(rows)))
    # bits per byte: lower is better; seed 0 is best at 1e-3 (2.0), seed 1 at 3e-3 (2.0)
    assert sorted(zip(pts["d_model"], pts["value"], strict=True)) == [("128", 2.5), ("64", 2.0)]


def test_plot_command_skips_old_mqar_rows_and_draws_new_ones(tmp_path, capsys):
    old = []
    for variant, params in [("full", {}), ("sliding_window", {"window": 8})]:
        for rule in ("0", "half", "max"):
            for L in (32, 64):
                old.append(dict(task="mqar", variant=variant, variant_params=params, variant_spec="x", position="rope",
                                position_params={}, train_len=32, eval_len=L, metric="accuracy", value=0.5, ci_low=0.4,
                                ci_high=0.6, n=256, seed=0, num_pairs=4, gap=3, gap_rule=rule, d_model=None, lr=3e-3,
                                stage="zero_shot", status="ok"))
    path = write_jsonl(tmp_path / "old.jsonl", old)
    assert main(["plot", str(path), "--out", str(tmp_path / "figs"), "--only", "mqar", "--only", "mqar-width"]) == 0
    text = capsys.readouterr()
    assert "Traceback" not in text.err
    for name in ("mqar", "mqar-width"):
        assert f"skipped {name}: no mqar rows trained and evaluated at one length with the current protocol " \
               f"({len(old)} rows left out: old protocol" in text.out
    both = write_jsonl(tmp_path / "both.jsonl", old + mqar_rows())
    assert main(["plot", str(both), "--out", str(tmp_path / "figs"), "--only", "mqar", "--only", "mqar-width"]) == 0
    assert (tmp_path / "figs" / "mqar.png").exists() and (tmp_path / "figs" / "mqar-width.png").exists()
    fig = P.plot_mqar(F.load_results([both]).accuracy)
    assert f"{len(old)} rows left out: old protocol" in fig.get_supxlabel()
    want = mqar_expected(mqar_rows(), 64)
    assert list(by_gid(fig, "mqar:full [train_len=64]").get_ydata()) == pytest.approx(
        [mean for (spec, _), (mean, *_) in sorted(want.items(), key=lambda kv: kv[1][3]) if spec == "full"])


def test_tradeoff_joins_mqar_at_each_seed_s_best_rate(cost):
    rows = [r for r in mqar_rows() if r["eval_len"] == r["train_len"]]
    pts, note = P.tradeoff_points(cost, F.prepare_accuracy(pd.DataFrame(rows)))
    full = pts[(pts["variant_label"] == "full") & (pts["metric"] == "accuracy")]
    means = [mean for L in (64, 128) for (spec, _), (mean, *_) in mqar_expected(rows, L).items() if spec == "full"]
    assert list(full["value"]) == [pytest.approx(np.mean(means))]
    assert "best learning rate per seed" in note


def test_accuracy_figure_labels_a_position_by_the_spec_asked_for_not_its_per_length_factor():
    rows = []
    for L in (128, 256, 512):
        for stage, shift in (("zero_shot", 0.0), ("finetune", -0.5)):
            v = 2.0 + L / 256 + shift
            rows.append(dict(task="lm", variant="full", variant_params={}, position="rope_yarn", position_spec="rope_yarn",
                             position_params={"factor": L / 128, "original_max_position_embeddings": 128}, train_len=128,
                             eval_len=L, metric="bpb", value=v, ci_low=None, ci_high=None, n=1000, seed=0, stage=stage))
    fig = P.plot_accuracy(F.prepare_accuracy(pd.DataFrame(rows)))
    zero = by_gid(fig, "accuracy:rope_yarn [stage=zero_shot]")
    tuned = by_gid(fig, "accuracy:rope_yarn [stage=finetune]")
    assert list(zero.get_ydata()) == pytest.approx([2.0 + L / 256 for L in (128, 256, 512)])
    assert tuned.get_linestyle() == "--" and zero.get_linestyle() == "-"
    assert zero.get_color() == tuned.get_color()


def test_accuracy_figure_leaves_mqar_to_its_own_figure(mqar_acc):
    acc = mqar_acc
    with pytest.raises(P.Skip, match="mqar"):
        P.plot_accuracy(acc)


def test_best_positions_ranks_only_groups_with_several_methods():
    rows = [dict(task="lm", variant="full", variant_params={}, position=p, position_params={}, train_len=128, eval_len=256,
                 metric="bpb", value=v, ci_low=None, ci_high=None, n=10, seed=0) for p, v in (("rope", 3.0), ("rope_yarn", 2.5))]
    rows += [dict(r, task="mqar", metric="accuracy", position="rope", value=0.9) for r in rows[:1]]  # one method: no ranking
    best = D.best_positions(F.prepare_accuracy(pd.DataFrame(rows)))
    assert list(best["task"]) == ["lm"] and list(best["best_position"]) == ["rope_yarn"]
    assert list(best["runner_up"]) == ["rope (3)"]


def test_position_colours_are_distinct_and_stable_beside_many_variants():
    positions = ["none", "rope", "rope_linear", "rope_ntk", "rope_dynamic", "rope_yarn", "rope_llama3"]
    variants = ["full", "sliding_window", "block_sparse", "linear"]
    rows = [dict(task="lm", variant=v, variant_params={}, position=p, position_params={}, train_len=128, eval_len=128,
                 metric="bpb", value=3.0, ci_low=None, ci_high=None, n=1, seed=0) for v in variants for p in positions]
    pal = P.palette_for(F.Results(cost=pd.DataFrame(), accuracy=F.prepare_accuracy(pd.DataFrame(rows))))
    assert len({pal[p] for p in positions}) == len(positions)
    assert pal["full"] == P.palette(["full"])["full"]  # the same blue wherever full is drawn


# -- noisy and suspect cells ------------------------------------------------------------------------

def hollow_points(fig) -> dict[str, list[tuple[float, float]]]:
    """Every marker drawn with no face (hollow), by gid, as (x, y) points."""
    out: dict[str, list[tuple[float, float]]] = {}
    for ax in fig.axes:
        for ln in ax.lines:
            if str(ln.get_markerfacecolor()) == "none" and ln.get_marker() not in (None, "None", "", " "):
                out.setdefault(str(ln.get_gid()), []).extend(zip(ln.get_xdata(), ln.get_ydata(), strict=True))
    return out


def flagged_rows(flags: dict | None = None) -> list[dict]:
    """``cost_rows`` with the trust columns a newer worker writes; ``flags`` maps (variant, backend, L) -> extra fields."""
    rows = []
    for r in cost_rows():
        r = dict(r, noisy=False, noisy_reason=None, attempts=1, loadavg_1m=0.1, other_cpu=0.0)
        rows.append(dict(r, **(flags or {}).get((r["variant"], r["backend"], r["seq_len"]), {})))
    return rows


NOISY = {"noisy": True, "noisy_reason": "peaks before/after differ by 31%", "attempts": 3}


@pytest.mark.parametrize("draw, name, column, scale", [
    (P.plot_latency, "latency", "latency_ms", 1.0),
    (P.plot_throughput, "throughput", "tokens_per_s", 1.0),
    (P.plot_memory, "memory", "peak_mem_bytes", 2.0**20),
    (P.plot_flops_fraction, "flops_fraction", "achieved_flops_per_s", 1e12),
])
def test_a_noisy_cell_is_drawn_hollow_on_its_line(draw, name, column, scale):
    fig = draw(F.prepare_cost(pd.DataFrame(flagged_rows({("sliding_window", "flex", 1024): NOISY}))))
    series = "sliding_window(window=256)/flex"
    value = next(r[column] for r in cost_rows() if r["variant"] == "sliding_window" and r["seq_len"] == 1024) / scale
    hollow = hollow_points(fig)
    assert list(hollow) == [f"hollow:{name}:{series}"]
    ((x, y),) = hollow[f"hollow:{name}:{series}"]
    assert x == 1024 and y == pytest.approx(value)
    line = by_gid(fig, f"{name}:{series}")
    xs, ys = expected("sliding_window", "flex", column)
    assert_line(line, xs, np.asarray(ys) / scale)  # the line still runs through the noisy point
    shown = np.asarray(line.get_markevery(), dtype=bool)  # the line's own filled marker skips that point
    np.testing.assert_array_equal(shown, [L != 1024 for L in LENS])
    hollow_line = by_gid(fig, f"hollow:{name}:{series}")
    assert matplotlib.colors.to_rgb(hollow_line.get_markeredgecolor()) == matplotlib.colors.to_rgb(line.get_color())
    assert "hollow markers: noisy or suspect cells (1)" in fig.get_supxlabel()


def test_a_quiet_sweep_has_no_hollow_markers(latency_fig):
    # old rows (no noisy column), and new rows that say noisy: false / null, are all quiet
    mixed = [{k: v for k, v in r.items() if k != "noisy"} if r["variant"] == "toy" else r  # old rows: NaN once mixed
             for r in flagged_rows({("full", "sdpa", 512): {"noisy": None}})]
    quiet = F.prepare_cost(pd.DataFrame(mixed))
    assert quiet["noisy"].isna().sum() == len(LENS) + 1
    for fig in (latency_fig, P.plot_latency(quiet), P.plot_speedup(quiet), P.plot_flops_fraction(quiet)):
        assert hollow_points(fig) == {}
        assert "hollow" not in fig.get_supxlabel()
        assert all(ln.get_markevery() is None for ax in fig.axes for ln in ax.lines)


def test_a_speedup_is_hollow_when_its_cell_or_its_full_baseline_is_untrusted():
    rows = flagged_rows({("sliding_window", "flex", 2048): NOISY, ("full", "sdpa", 512): NOISY})
    fig = P.plot_speedup(F.prepare_cost(pd.DataFrame(rows)))
    hollow = hollow_points(fig)
    # full/sdpa is the fastest full at every length, so its noisy 512 cell taints every ratio at 512
    assert sorted(x for x, _ in hollow["hollow:speedup:sliding_window(window=256)/flex"]) == [512, 2048]
    assert [x for x, _ in hollow["hollow:speedup:toy/reference"]] == [512]
    assert "hollow markers: noisy or suspect cells (3)" in fig.get_supxlabel()


def test_a_fraction_above_the_peak_is_clipped_hollow_and_labelled():
    rows = flagged_rows({("sliding_window", "flex", 2048): {"peak_fraction": 1.5}})
    cost = F.prepare_cost(pd.DataFrame(rows))
    assert list(T.suspect_rows(cost)[["variant", "seq_len", "peak_fraction"]].itertuples(index=False, name=None)) == \
        [("sliding_window(window=256)", 2048.0, 1.5)]
    fig = P.plot_flops_fraction(cost)
    series = "sliding_window(window=256)/flex"
    assert hollow_points(fig) == {f"hollow:flops_fraction:{series}": [(2048, 1.0)]}
    assert max(np.nanmax(np.asarray(ln.get_ydata(), dtype=float)) for ax in fig.axes for ln in ax.lines) == 1.0
    assert by_gid(fig, f"over:{series}:2048", "texts").get_text() == "1.5× peak"
    caption = fig.get_supxlabel()
    assert "hollow markers: noisy or suspect cells (1)" in caption and "1 above the measured peak, drawn at 1" in caption
    # the other figures draw that cell hollow too: it is suspect, whatever the column
    assert list(hollow_points(P.plot_latency(cost))) == [f"hollow:latency:{series}"]


def test_colours_are_stable_across_figure_sets_with_different_variants():
    """`block_sparse` is the same green whether or not `full` or a plugin is drawn beside it; a plugin
    does not take a built-in's colour; two backends of one variant get two shades of its colour."""
    from harness.analysis.figures import style as S

    one = S.palette(["block_sparse(block_size=64)", "linear(feature_map=elu1)"])
    two = S.palette(["full", "attn_sinks(sinks=4)", "block_sparse(block_size=64)", "sliding_window(window=256)"])
    assert one["block_sparse(block_size=64)"] == two["block_sparse(block_size=64)"]
    builtin = {S.stable_colour(v) for v in ("full", "sliding_window", "block_sparse", "linear")}
    assert len(builtin) == 4 and two["attn_sinks(sinks=4)"] not in builtin
    assert S.palette(["full"])["full"] == S.palette(["linear", "full", "x"])["full"]
    sdpa, xformers = (S.backend_shade(two["full"], b) for b in ("sdpa", "xformers"))
    assert sdpa != xformers
    assert len(set(S.palette([f"p{i}" for i in range(12)]).values())) == 12  # collisions resolved within a figure


def test_speedup_ticks_read_as_fractions_not_long_decimals():
    from harness.analysis.figures.cost import speedup_tick

    assert [speedup_tick(v) for v in (0.015625, 0.5, 1, 2, 64, 1.5, 0.3)] == ["1/64×", "1/2×", "1×", "2×", "64×", "1.5×", "0.3×"]


def test_loading_keeps_a_rows_own_source_column(tmp_path):
    """Fidelity rows say where their activations came from (``source``: trained or swap); loading names the file in
    ``results_file`` and leaves that column alone, so two files never become two series."""
    rows = [dict(task="fidelity", variant="linear", variant_params={}, position="rope", position_params={}, train_len=64,
                 eval_len=64, metric="rel_l2_trained", value=0.1, seed=0, source=s) for s in ("trained", "swap")]
    a, b = write_jsonl(tmp_path / "a.jsonl", rows[:1]), write_jsonl(tmp_path / "b.jsonl", rows[1:])
    acc = F.load_results([str(a), str(b)]).accuracy
    assert sorted(acc["source"]) == ["swap", "trained"] and sorted(acc["results_file"]) == sorted([str(a), str(b)])


def test_patterns_figure_places_each_model_at_its_fraction_of_full_layers(tmp_path):
    """Decode state, decode and prefill latency at the longest length and MQAR recall (mean over seeds) per width, each
    point at the share of its layers that run full attention; a family's line runs from its uniform model through its
    hybrids to all-full, and a GQA row (num_kv_heads) is not a pattern point."""
    models = [("full", {}, None, 1.0), ("gated_deltanet", {}, None, 0.0),
              ("layers", {"pattern": "gated_deltanet*3; full"}, "qwen3-next", 0.25)]
    cost = []
    for (variant, params, spec, frac), kv in [(m, None) for m in models] + [(models[0], 2)]:
        for L in (1024, 2048):
            for mode in ("decode", "forward"):
                lat = (1 + 10 * frac) * L / 1024 * (1 if mode == "decode" else 100) * (0.5 if kv else 1)
                cost.append(dict(ENV, scope="model", run_id="h", variant=variant, variant_params=params, variant_spec=spec,
                                 backend="sdpa", mode=mode, seq_len=L, status="ok", latency_ms=lat, num_kv_heads=kv,
                                 state_bytes=(2**20 * (1 + 100 * frac) * L / 1024) if mode == "decode" else None))
    acc = [dict(run_id="m", task="mqar", variant=variant, variant_params=params, variant_spec=spec, position="rope",
                position_params={}, train_len=128, eval_len=128, metric="accuracy", value=0.2 + 0.7 * frac + 0.01 * seed,
                n=100, seed=seed, d_model=d) for variant, params, spec, frac in models for seed in (0, 1) for d in (32, 64)]
    fig = P.plot_patterns(F.prepare_cost(pd.DataFrame(cost)), F.prepare_accuracy(pd.DataFrame(acc)), tmp_path)
    assert (tmp_path / "patterns.png").stat().st_size > 0
    for label, _, _, frac in [(F.spec_label(v, p) if spec is None else spec, v, p, f) for v, p, spec, f in models]:
        for panel, want in (("state", 2 * (1 + 100 * frac)), ("decode", 2 * (1 + 10 * frac)),
                            ("prefill", 200 * (1 + 10 * frac)), ("mqar32", 0.205 + 0.7 * frac), ("mqar64", 0.205 + 0.7 * frac)):
            np.testing.assert_allclose(by_gid(fig, f"patterns:{panel}:{label}", "collections").get_offsets(),
                                       [[frac, want]], rtol=1e-12)
    line = by_gid(fig, "patterns:state:family:gated_deltanet")
    np.testing.assert_array_equal(line.get_xdata(), [0.0, 0.25, 1.0])
    assert not [a for ax in fig.axes for a in ax.lines if a.get_gid() == "patterns:state:family:full"]
