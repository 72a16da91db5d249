"""``compare`` flags a cell only when it got worse by more than the tolerance beyond the measured noise."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis import compare as C
from harness.analysis import frames as F
from harness.cli import main

LENS = [256, 512, 1024]


def rows(scale: dict | None = None, iqr_frac: float = 0.02, mem_scale: dict | None = None,
         status: dict | None = None) -> list[dict]:
    """Cost rows of two variants; ``scale[(variant, L)]`` multiplies one cell's latency."""
    out = []
    for variant, params, backend, c in [("full", {}, "sdpa", 1e-5), ("sliding_window", {"window": 64}, "flex", 2e-3)]:
        for L in LENS:
            ms = c * L * L * (scale or {}).get((variant, L), 1.0)
            st_ = (status or {}).get((variant, L), "ok")
            ok = st_ == "ok"
            out.append({"run_id": "x", "variant": variant, "variant_params": params, "backend": backend, "position": "none",
                        "scope": "op", "mode": "forward", "device": "cpu", "device_name": "CI box", "dtype": "float32",
                        "batch_size": 1, "num_heads": 2, "head_dim": 16, "seq_len": L, "status": st_,
                        "error": None if ok else "x", "latency_ms": ms if ok else None,
                        "latency_iqr_ms": iqr_frac * ms if ok else None, "tokens_per_s": L / ms * 1e3 if ok else None,
                        "peak_mem_bytes": 1e6 * L * (mem_scale or {}).get((variant, L), 1.0) if ok else None,
                        "flops": None, "achieved_flops_per_s": None})
    return out


def write(path: Path, rs: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rs))
    return str(path)


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # compare ends a failing gate with exit status 1
        return int(e.code)


def test_injected_20_percent_slowdown_fails_the_gate(tmp_path, capsys):
    base = write(tmp_path / "base.jsonl", rows())
    new = write(tmp_path / "new.jsonl", rows(scale={("sliding_window", 512): 1.2}))
    assert run(["compare", base, new, "--fail-if-regression", "0.05"]) == 1
    out = capsys.readouterr().out
    bad = [line for line in out.splitlines() if "REGRESSION" in line]
    assert len(bad) == 1 and "sliding_window(window=64)/flex" in bad[0] and "512" in bad[0] and "1.200×" in bad[0]
    # without the flag the same comparison is reported but does not fail
    assert run(["compare", base, new]) == 0


def test_change_within_noise_passes(tmp_path, capsys):
    base = write(tmp_path / "base.jsonl", rows(iqr_frac=0.10))
    # 12% slower everywhere, but the timings' IQR is 10-11%: 12% < 5% + noise
    new = write(tmp_path / "new.jsonl", rows(scale={(v, L): 1.12 for v in ("full", "sliding_window") for L in LENS},
                                             iqr_frac=0.10))
    assert run(["compare", base, new, "--fail-if-regression", "0.05"]) == 0
    assert "0 regression(s)" in capsys.readouterr().out


def test_memory_growth_and_new_failures_are_regressions(tmp_path, capsys):
    base = write(tmp_path / "base.jsonl", rows())
    more_mem = write(tmp_path / "mem.jsonl", rows(mem_scale={("full", 1024): 1.3}))
    assert run(["compare", base, more_mem, "--fail-if-regression", "0.05"]) == 1
    assert "more memory" in capsys.readouterr().out
    oom = write(tmp_path / "oom.jsonl", rows(status={("full", 1024): "oom"}))
    assert run(["compare", base, oom, "--fail-if-regression", "0.05"]) == 1
    assert "now oom" in capsys.readouterr().out


def test_cells_failing_in_both_runs_are_not_regressions(tmp_path):
    both = {("full", 1024): "oom"}
    base, new = write(tmp_path / "b.jsonl", rows(status=both)), write(tmp_path / "n.jsonl", rows(status=both))
    assert run(["compare", base, new, "--fail-if-regression", "0.0"]) == 0


def frame(rs: list[dict]) -> pd.DataFrame:
    return F.prepare_cost(pd.DataFrame(rs))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(slow=st.floats(0.5, 2.0), iqr=st.floats(0.0, 0.3), tol=st.floats(0.0, 0.3))
def test_uniform_slowdown_flagged_iff_beyond_tolerance_plus_noise(slow, iqr, tol):
    # Definition: flag iff new - base > tol * base + max(iqr_base, iqr_new); here iqr_x = iqr * x.
    margin = (slow - 1) - tol - iqr * max(1.0, slow)
    if abs(margin) < 1e-9:
        return
    scale = {(v, L): slow for v in ("full", "sliding_window") for L in LENS}
    table = C.compare_frames(frame(rows(iqr_frac=iqr)), frame(rows(scale=scale, iqr_frac=iqr)), tol)
    assert len(table) == 2 * len(LENS)
    assert table["regression"].tolist() == [margin > 0] * len(table)
    assert table["ratio"].tolist() == pytest.approx([slow] * len(table))


def test_comparing_a_run_with_itself_finds_nothing():
    table = C.compare_frames(frame(rows()), frame(rows()), 0.0)
    assert not table["regression"].any() and set(table["verdict"]) == {"within noise"}


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"),
    ("no_ok", "no ok cost rows"),
    ("disjoint", "no cells in common"),
    ("accuracy_only", "holds no cost rows"),
])
def test_bad_input_exits_2(tmp_path, capsys, case, message):
    base = write(tmp_path / "base.jsonl", rows())
    new = str(tmp_path / "nope.jsonl")
    if case == "no_ok":
        new = write(tmp_path / "new.jsonl", [dict(r, status="error", latency_ms=None) for r in rows()])
    elif case == "disjoint":
        new = write(tmp_path / "new.jsonl", [dict(r, seq_len=r["seq_len"] * 3) for r in rows()])
    elif case == "accuracy_only":
        new = write(tmp_path / "new.jsonl", [{"task": "mqar", "variant": "full", "metric": "accuracy", "value": 1.0,
                                              "eval_len": 64}])
    assert run(["compare", base, new]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_newly_failing_cell_matches_although_no_backend_ran(tmp_path, capsys):
    base_rows = [dict(r, backend_requested="auto") for r in rows()]
    new_rows = [dict(r, backend=None if r["status"] != "ok" else r["backend"]) for r in
                (dict(r, backend_requested="auto") for r in rows(status={("sliding_window", 1024): "oom"}))]
    base, new = write(tmp_path / "b.jsonl", base_rows), write(tmp_path / "n.jsonl", new_rows)
    assert run(["compare", base, new, "--fail-if-regression", "0.05"]) == 1
    bad = [line for line in capsys.readouterr().out.splitlines() if "REGRESSION" in line]
    assert len(bad) == 1 and "now oom" in bad[0] and "sliding_window" in bad[0]


def test_a_parameter_added_since_the_base_run_does_not_split_the_cells(tmp_path, capsys):
    """Base rows written before `sinks`/`softcap`/`dilation` existed match new rows holding them at their defaults;
    a non-default value is a different cell."""
    new_rows = rows()
    for r in new_rows:
        if r["variant"] == "sliding_window":
            r["variant_params"] = {"window": 64, "sinks": 0, "softcap": 0.0, "dilation": 1}
        else:
            r["variant_params"] = {"softcap": 0.0}
    base = write(tmp_path / "base.jsonl", rows())
    assert run(["compare", base, write(tmp_path / "new.jsonl", new_rows)]) == 0
    assert "6 matched cell(s) (0 only in BASE, 0 only in NEW)" in capsys.readouterr().out
    new_rows[0]["variant_params"] = {"softcap": 50.0}
    assert run(["compare", base, write(tmp_path / "new2.jsonl", new_rows)]) == 0
    assert "5 matched cell(s) (1 only in BASE, 1 only in NEW)" in capsys.readouterr().out


# A value other than the base row's for each identity field (harness.results.COST_KEY_FIELDS).
OTHER = {
    "variant": "linear", "variant_params": {"window": 128}, "backend_requested": "flex", "position": "rope",
    "position_params": {"rope_theta": 500000.0}, "scope": "op", "mode": "decode", "device": "cuda", "dtype": "bfloat16",
    "batch_size": 2, "num_heads": 4, "num_kv_heads": 1, "head_dim": 32, "seq_len": 2048, "causal": False, "layers": 4,
    "hf_config": "smollm2-135m", "docs": 4, "press": "snapkv", "press_params": {"compression_ratio": 0.5}, "queries": 4,
    "budget_bytes": 2**30, "ragged": "lognormal", "side": "head",
}


def test_every_identity_field_keeps_two_cells_apart_in_every_consumer(tmp_path):
    """Two rows that differ in one identity field only are two cells for the sweep's --resume, for compare, for
    the report's and the plots' cells and for the series they are drawn in: none merges or drops one of them."""
    from harness.cost import KEY_FIELDS
    from harness.results import COST_KEY_FIELDS, cell_key

    assert KEY_FIELDS == COST_KEY_FIELDS and set(OTHER) == set(COST_KEY_FIELDS)
    base = {**rows()[3], "variant_params": {"window": 64}, "backend_requested": "auto", "scope": "model", "layers": 2}
    for field, value in OTHER.items():
        other = {**base, field: value}
        assert cell_key(base, KEY_FIELDS) != cell_key(other, KEY_FIELDS), field  # sweep, --resume
        path = write(tmp_path / f"{field}.jsonl", [base, other])
        cost = F.load_results([path]).cost
        assert len(C.compare_frames(cost, cost)) == 2, field  # compare
        drawn = F.cells(cost)  # the report's and the plots' cells
        assert len(drawn) == 2, field
        assert len(drawn.groupby(["device_key", "facet", "series", "seq_len"])) == 2, (field, list(drawn["series"]))
        assert C._load(path, "BASE").shape[0] == 2, field  # the loader compare reads with keeps both


def test_one_machine_name_on_two_vector_units_is_two_machines(tmp_path, capsys):
    """"AMD EPYC (2 cores)" names AVX2 and AVX-512 machines whose peaks differ by 2x: readers see the unit too."""
    avx2 = write(tmp_path / "avx2.jsonl", [{**r, "cpu_capability": "AVX2"} for r in rows()])
    avx512 = write(tmp_path / "avx512.jsonl", [{**r, "cpu_capability": "AVX512"} for r in rows()])
    both = F.load_results([avx2, avx512]).cost
    assert F.devices(both) == ["CI box AVX2", "CI box AVX512"]
    assert run(["compare", avx2, avx512]) == 0
    assert "note: BASE ran on CI box AVX2; NEW on CI box AVX512" in capsys.readouterr().out
