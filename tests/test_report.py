"""The HTML report has every section, and its numbers are the ones the data define; the committed report
covers every committed results file as committed, with its command, in under 3 MB."""
from __future__ import annotations

import base64
import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from harness.analysis import findings as FI  # noqa: E402
from harness.analysis import frames as F  # noqa: E402
from harness.analysis import report as R  # noqa: E402
from harness.analysis import runs as RUNS  # noqa: E402
from harness.cli import main  # noqa: E402

LENS = [512, 1024, 2048, 4096, 8192]
ENV = {"device": "cpu", "device_name": "Report CPU", "torch_version": "2.13.0", "project_version": "0.1.0", "dtype": "float32",
       "batch_size": 1, "num_heads": 2, "head_dim": 16, "scope": "op", "position": "none", "seed": 0,
       "timestamp": "2026-01-01T00:00:00+00:00"}
# latency = c * L^p and memory = m * L^q: the fitted exponents must come out as p and q
SERIES = {"full/sdpa": ("full", {}, "sdpa", 2e-6, 2, 8.0, 2),
          "sliding_window(window=128)/flex": ("sliding_window", {"window": 128}, "flex", 1e-3, 1, 4096.0, 1)}
OOM = {("full", 8192)}
POSITIONS = {"rope": [0.9, 0.8, 0.2], "alibi_like(slope=0.5)": [0.9, 0.7, 0.6]}
EVAL = [256, 512, 1024]


def cost_rows(device_name: str = "Report CPU") -> list[dict]:
    rows = []
    for variant, params, backend, c, p, m, q in SERIES.values():
        for L in LENS:
            ok = (variant, L) not in OOM
            ms = c * L**p
            rows.append(dict(ENV, device_name=device_name, run_id="r", variant=variant, variant_params=params, backend=backend,
                             mode="forward", seq_len=L, status="ok" if ok else "oom", error=None if ok else "CUDA out of memory",
                             latency_ms=ms if ok else None, latency_iqr_ms=0.01 * ms if ok else None,
                             tokens_per_s=L / ms * 1e3 if ok else None, peak_mem_bytes=m * L**q if ok else None,
                             flops=None, achieved_flops_per_s=None))
    return rows


def acc_rows() -> list[dict]:
    rows = []
    for label, values in POSITIONS.items():
        name, _, rest = label.partition("(")
        params = {"slope": 0.5} if rest else {}
        for L, v in zip(EVAL, values, strict=True):
            rows.append(dict(run_id="a", task="lm", variant="full", variant_params={}, position=name, position_params=params,
                             train_len=256, eval_len=L, metric="accuracy", value=v, ci_low=None, ci_high=None, n=10, seed=0,
                             torch_version="2.13.0"))
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class Tables(HTMLParser):
    """Every <table id=...> of a page as a list of rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.current: str | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and "id" in attrs:
            self.current = attrs["id"]
            self.tables[self.current] = []
        elif tag == "tr" and self.current:
            self.tables[self.current].append([])
        elif tag in ("td", "th") and self.current:
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "table":
            self.current = None
        elif tag in ("td", "th") and self.current and self.cell is not None:
            self.tables[self.current][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def table(html: str, table_id: str) -> dict[str, dict[str, str]]:
    parser = Tables()
    parser.feed(html)
    header, *body = parser.tables[table_id]
    return {row[0]: dict(zip(header, row, strict=True)) for row in body}


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("report")
    c, a = write_jsonl(d / "cost.jsonl", cost_rows()), write_jsonl(d / "acc.jsonl", acc_rows())
    out = d / "sub" / "report.html"
    assert main(["report", str(c), str(a), "--out", str(out)]) == 0
    return out.read_text()


def test_every_section_present(html):
    for sid in R.SECTIONS:
        assert f'<section id="{sid}">' in html, sid


def test_self_contained_with_figures_embedded(html):
    assert "<link" not in html and "<script" not in html and 'src="http' not in html
    images = html.split('src="data:image/webp;base64,')[1:]
    skipped = table(html, "skipped-table") if "skipped-table" in html else {}
    figures = html.count("<figure ")
    assert figures == len(images) >= 4
    for img in images:
        webp = base64.b64decode(img.split('"', 1)[0])
        # lossless WebP (VP8L) no wider than the page, at the size the <img> says: a report of every run stays a page
        assert webp[:4] == b"RIFF" and webp[8:16] == b"WEBPVP8L" and webp[20] == 0x2F
        bits = int.from_bytes(webp[21:25], "little")
        width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        assert width <= 1200 and f'width="{width}" height="{height}" loading="lazy" src="data:image/webp;base64,{img[:40]}' \
            in html
    assert "speedup" in html.split('<section id="figures">')[1] and "latency" not in skipped


def test_environment_lists_device_and_versions(html):
    env = table(html, "environment-table")
    assert env["device_name"]["value"] == "Report CPU"
    assert env["torch_version"]["value"] == "2.13.0"
    assert env["timestamp"]["value"] == ENV["timestamp"]


def test_scaling_exponents_match_the_generating_powers(html):
    rows = table(html, "scaling-table")
    for series, (_, _, _, _, p, _, q) in SERIES.items():
        assert float(rows[series]["latency exponent"]) == pytest.approx(p, abs=0.005)
        assert float(rows[series]["memory exponent"]) == pytest.approx(q, abs=0.005)


def test_crossover_is_where_latencies_cross(html):
    # 1e-3 L < 2e-6 L^2  <=>  L > 500: the first shared length after that is 512
    want = min(L for L in LENS if 1e-3 * L < 2e-6 * L**2)
    row = table(html, "crossover-table")["sliding_window(window=128)/flex"]
    assert row["beats full from"] == F.fmt_len(want)
    longest = max(L for L in LENS if ("full", L) not in OOM)
    assert row["speed-up at longest shared length"] == f"{2e-6 * longest**2 / (1e-3 * longest):.2f}× at {F.fmt_len(longest)}"


def test_longest_length_reached_and_what_stopped_it(html):
    rows = table(html, "reach-table")
    assert rows["full/sdpa"]["longest ok length"] == F.fmt_len(4096)
    assert rows["full/sdpa"]["stopped by"] == "oom at 8k"
    assert rows["sliding_window(window=128)/flex"]["longest ok length"] == "8k"
    assert rows["sliding_window(window=128)/flex"]["stopped by"] == "—"


def test_best_position_per_eval_length(html):
    parser = Tables()
    parser.feed(html)
    header, *body = parser.tables["positions-table"]
    got = {row[header.index("eval length")]: row[header.index("best position")] for row in body}
    for i, L in enumerate(EVAL):
        best = max(POSITIONS, key=lambda k: POSITIONS[k][i])
        tied = [k for k in POSITIONS if np.isclose(POSITIONS[k][i], POSITIONS[best][i])]
        assert got[F.fmt_len(L)] == " = ".join(sorted(tied)), L


def test_summary_table_shows_status_not_a_number_for_failed_cells(html):
    tables = html.split('<section id="tables">')[1].split("</section>")[0]
    assert "Latency (ms) · op · forward" in tables
    latency = tables.split("Latency (ms) · op · forward")[1].split("</table>")[0]
    full_row = latency.split("full/sdpa")[1].split("</tr>")[0]
    assert "oom" in full_row
    assert R.fmt_num(2e-6 * 4096**2) in full_row


def test_findings_sentences(html):
    findings = html.split('<section id="findings">')[1].split('<section id="scaling">')[0]
    assert "full/sdpa (op · forward): latency grows as L^2.00" in findings
    assert "reached 4k before oom at 8k" in findings


def test_mixed_devices_refused_unless_one_is_picked(tmp_path, capsys):
    c = write_jsonl(tmp_path / "c.jsonl", cost_rows() + cost_rows(device_name="Other"))
    rc = main(["report", str(c), "--out", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert rc == 2 and "--device" in err and err.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def test_missing_file_exits_2(tmp_path, capsys):
    rc = main(["report", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "r.html")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def section(html: str, sid: str) -> str:
    return html.split(f'<section id="{sid}">')[1].split("</section>")[0]


def test_a_quiet_sweep_says_it_has_no_suspect_or_noisy_cells(html):
    body = section(html, "suspect")
    assert "No suspect cells" in body and "No noisy cells" in body
    assert "suspect-table" not in html and "noisy-table" not in html
    assert "(suspect)" not in html and "(noisy)" not in html and "suspect cell(s)" not in section(html, "findings")


def test_suspect_and_noisy_cells_are_listed_and_suspect_ones_kept_out_of_fits(tmp_path):
    rows = cost_rows()
    for r in rows:
        r.update(noisy=False, noisy_reason=None, attempts=1)
        if r["variant"] == "sliding_window" and r["seq_len"] == 2048:
            # 1.5x the measured peak with a broken timing 1000x off its L^1 line: it must bend neither the exponent
            # (fit over 2k-8k if it were kept) nor the crossover (it would lose to full at 2k)
            r.update(peak_fraction=1.5, latency_ms=r["latency_ms"] * 1000)
        if r["variant"] == "full" and r["seq_len"] == 1024:
            r.update(noisy=True, noisy_reason="other processes used 0.8 CPU", attempts=3, other_cpu=0.8)
    c = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "r.html"
    assert main(["report", str(c), "--out", str(out)]) == 0
    page = out.read_text()

    suspect = table(page, "suspect-table")
    assert list(suspect) == ["sliding_window(window=128)"]
    row = suspect["sliding_window(window=128)"]
    assert (row["backend"], row["mode"], row["seq_len"], row["peak_fraction"]) == ("flex", "forward", "2k", "1.5")
    assert row["results_file"] == str(c)
    noisy = table(page, "noisy-table")
    assert list(noisy) == ["full"]
    assert noisy["full"]["seq_len"] == "1k" and noisy["full"]["noisy_reason"] == "other processes used 0.8 CPU"
    assert noisy["full"]["attempts"] == "3"

    # left out of the fits: the exponent is the generating power, and the variant still wins from 512
    scaling = table(page, "scaling-table")["sliding_window(window=128)/flex"]
    assert float(scaling["latency exponent"]) == pytest.approx(1, abs=0.005)
    assert "1k–8k" in scaling["fit over"]
    cross = table(page, "crossover-table")["sliding_window(window=128)/flex"]
    assert cross["beats full from"] == "512"
    assert cross["speed-up at longest shared length"] == f"{2e-6 * 4096**2 / (1e-3 * 4096):.2f}× at 4k"
    findings = section(page, "findings").split('<section id="scaling">')[0]
    assert "1 suspect cell(s)" in findings
    assert "sliding_window(window=128)/flex (op · forward): latency grows as L^1.00" in findings
    # it wins at the shortest length too: "from 512" would claim a crossover nobody measured
    assert "sliding_window(window=128)/flex (op · forward) faster than full at every length measured (" in findings
    # the summary tables keep the numbers but say which ones not to trust
    latency = section(page, "tables").split("Latency (ms) · op · forward")[1].split("</table>")[0]
    assert f"{R.fmt_num(1e-3 * 2048 * 1000)} (suspect)" in latency.split("sliding_window")[1].split("</tr>")[0]
    assert f"{R.fmt_num(2e-6 * 1024**2)} (noisy)" in latency.split("full/sdpa")[1].split("</tr>")[0]


def test_findings_state_only_what_enough_lengths_support():
    """Fits need 3 lengths (a line through 2 always fits); a negative exponent is flagged, not stated;
    a crossover needs 2 matched lengths; a variant that ran nowhere says why; at most MAX_FINDINGS lines."""
    from harness.analysis import derive as D

    def row(variant, L, ms, status="ok", error=None, backend="sdpa"):
        return dict(ENV, run_id="r", variant=variant, variant_params={}, backend=backend, mode="forward", seq_len=L,
                    status=status, error=error, latency_ms=ms if status == "ok" else None, latency_iqr_ms=None,
                    tokens_per_s=None, peak_mem_bytes=None, flops=None, achieved_flops_per_s=None)

    rows = [row("full", L, 1e-6 * L**2) for L in (1024, 2048, 4096)]
    rows += [row("sliding_window", 2048, 1.0, backend="flex")]  # one shared length: no crossover claimed
    rows += [row("linear", L, 5.0 / L, backend="chunked") for L in (1024, 2048, 4096)]  # cost falling with length
    rows += [row("block_sparse", L, 1e-3 * L, backend="flex") for L in (1024, 2048)]  # two points: no exponent
    rows += [row("test_raises", L, None, "error", "RuntimeError: boom", backend="reference") for L in (1024, 2048)]
    cost = F.prepare_cost(pd.DataFrame(rows))
    text = "\n".join(FI.findings(cost, pd.DataFrame()))
    assert "full/sdpa (op · forward): latency grows as L^2.00 (R² 1.00, 3 lengths" in text
    assert "L^-1" not in text and "1 latency fit(s) are not stated: negative" in text
    assert "block_sparse/flex (op · forward): latency grows" not in text  # two lengths: no exponent
    assert "sliding_window/flex" not in text  # a crossover from one length would be made up
    assert text.splitlines()[0] == "test_raises/reference (op · forward) ran at no length: error at 1k (RuntimeError: boom)."
    fits = D.fit_exponents(cost).set_index("series")
    assert np.isnan(fits.loc["block_sparse/flex", "exponent"]) and fits.loc["block_sparse/flex", "points"] == 2
    reach = R.reach_table(cost).set_index("series")
    assert reach.loc["test_raises/reference", "why"] == "RuntimeError: boom"
    many = [row(f"v{i}", L, 1.0, backend="b") for i in range(20) for L in (1024, 2048, 4096)]
    lines = FI.findings(F.prepare_cost(pd.DataFrame(rows + many)), pd.DataFrame())
    assert len(lines) == FI.MAX_FINDINGS and lines[-1].endswith("more finding(s) in the tables below.")


# -- one run per file, grouped by kind, each with its command --------------------------------------------------------

COMMANDS = """# Runs

### `op.jsonl`

`attn-bench sweep --preset quick --out op.jsonl`: the first [variants](../docs/x.md)
at 4 < 8 lengths.

![a figure](figures/x.png)

### `trained.jsonl`

The same command with `--task lm`, **two** seeds.

## Accuracy runs

### `pretrained.jsonl`

```bash
attn-bench accuracy --preset smollm2-cpu
```
"""


def test_run_commands_are_the_first_paragraph_of_each_files_section():
    got = RUNS.run_commands(COMMANDS)
    assert list(got) == ["op.jsonl", "trained.jsonl", "pretrained.jsonl"]
    assert got["op.jsonl"] == ("<code>attn-bench sweep --preset quick --out op.jsonl</code>: the first variants\n"
                               "at 4 &lt; 8 lengths.")
    assert got["trained.jsonl"] == "The same command with <code>--task lm</code>, <b>two</b> seeds."
    assert got["pretrained.jsonl"] == "<code>attn-bench accuracy --preset smollm2-cpu</code>"


@pytest.fixture(scope="module")
def grouped(tmp_path_factory) -> tuple[str, dict[str, Path]]:
    d = tmp_path_factory.mktemp("grouped")
    serving = [dict(r, batch_size=8) for r in cost_rows()]
    hf = [dict(r, scope="hf") for r in cost_rows()]
    trained = [dict(r, steps=100) for r in acc_rows()]
    pretrained = [dict(r, value=1 - r["value"], model="smollm2-135m") for r in acc_rows()]
    files = {name: write_jsonl(d / f"{name}.jsonl", rows) for name, rows in
             (("op", cost_rows()), ("serving", serving), ("hf", hf), ("trained", trained), ("pretrained", pretrained))}
    (d / "COMMANDS.md").write_text(COMMANDS)
    out = d / "report.html"
    assert main(["report", *map(str, files.values()), "--commands", str(d / "COMMANDS.md"), "--out", str(out)]) == 0
    return out.read_text(), files


def articles(page: str) -> dict[str, str]:
    """Each run's article, by the file name it shows."""
    found = re.findall(r'<article class="run" id="[^"]+" data-file="([^"]+)">(.*?)</article>', page, re.S)
    return dict(found)


def test_each_file_is_one_run_in_its_kinds_group_with_its_command(grouped):
    page, files = grouped
    groups = re.findall(r'<section class="kind" id="kind-(\w+)"><h2>[^<]*</h2>(.*?)</section>\n?'
                        r'(?=<section class="kind"|</body>)', page, re.S)
    assert [(g, list(articles(body))) for g, body in groups] == [
        ("op", ["op.jsonl"]), ("serving", ["serving.jsonl"]), ("hf", ["hf.jsonl"]),
        ("trained", ["trained.jsonl"]), ("pretrained", ["pretrained.jsonl"])]
    runs = articles(page)
    assert f'<p class="command">{RUNS.run_commands(COMMANDS)["op.jsonl"]}</p>' in runs["op.jsonl"]
    assert '<p class="command">The same command with <code>--task lm</code>' in runs["trained.jsonl"]
    assert "no command recorded in " in runs["serving.jsonl"] and "COMMANDS.md" in runs["serving.jsonl"]
    # accuracy files are never pooled: each has its own table of its own values (inverted in the second file)
    best = {}
    for name in ("trained.jsonl", "pretrained.jsonl"):
        tid = re.search(r'id="(positions-table(?:-\d+)?)"', runs[name]).group(1)
        parser = Tables()
        parser.feed(runs[name])
        header, *body = parser.tables[tid]
        best[name] = {row[header.index("eval length")]: row[header.index("best position")] for row in body}
    assert best["trained.jsonl"]["1k"] == "alibi_like(slope=0.5)" and best["pretrained.jsonl"]["1k"] == "rope"
    # the contents list reaches every run, under its group
    contents = page.split('<nav id="contents">')[1].split("</nav>")[0]
    assert all(f'href="#kind-{g}"' in contents for g, _ in groups)
    assert len(re.findall(r'href="#run(?:-\d+)?"', contents)) == len(files)


def test_run_kind_is_read_from_the_rows():
    cost = F.prepare_cost(pd.DataFrame(cost_rows()))
    assert RUNS.run_kind(cost, accuracy=False) == "op"
    assert RUNS.run_kind(cost.assign(mode="decode"), accuracy=False) == "decode"
    assert RUNS.run_kind(cost.assign(mode="decode", queries=4.0), accuracy=False) == "serving"
    assert RUNS.run_kind(cost.assign(scope="model"), accuracy=False) == "model"
    acc = F.prepare_accuracy(pd.DataFrame(acc_rows()))
    assert RUNS.run_kind(acc, accuracy=True) == "pretrained"
    assert RUNS.run_kind(acc.assign(steps=[None] * (len(acc) - 1) + [10.0]), accuracy=True) == "trained"


def test_sources_table_records_each_files_rows_and_sha256(grouped):
    page, files = grouped
    sources = table(page, "sources-table")
    assert set(sources) == {p.name for p in files.values()}
    for p in files.values():
        assert sources[p.name]["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
        assert sources[p.name]["rows"] == str(len(p.read_text().splitlines()))


# -- the committed report: pure file reads, fast enough for every run of the suite -------------------------------------

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results" / "report.html"
REBUILD = "attn-bench report results/*.jsonl --commands results/README.md --out results/report.html"


@pytest.fixture(scope="module")
def committed() -> str:
    return COMMITTED.read_text(encoding="utf-8")


def test_the_committed_report_loads_like_a_page():
    assert COMMITTED.stat().st_size < 3_000_000, f"results/report.html is {COMMITTED.stat().st_size:,} bytes"


def test_the_committed_report_is_of_every_committed_results_file_as_committed(committed):
    sources = committed.split('<section id="sources">')[1].split("</section>")[0]
    shown = {name: row["sha256"] for name, row in table(sources, "sources-table").items()}
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ROOT / "results").glob("*.jsonl")}
    assert shown == files, f"results/report.html is stale: rebuild it with `{REBUILD}`"
    assert sorted(articles(committed)) == sorted(files), f"results/report.html lacks a run: rebuild it with `{REBUILD}`"


def test_the_committed_report_shows_each_runs_command_from_results_readme(committed):
    # the command itself (the paragraph's first code), not its prose: editing a section's wording needs no rebuild
    commands = RUNS.run_commands((ROOT / "results" / "README.md").read_text(encoding="utf-8"))
    for name, body in articles(committed).items():
        shown = re.search(r'<p class="command">(.*?)</p>', body, re.S)
        code = re.search(r"<code>.*?</code>", commands[name], re.S)
        assert shown and (code.group(0) if code else commands[name]) in shown.group(1), \
            f"{name}: its command in results/report.html is not results/README.md's: rebuild it with `{REBUILD}`"


def test_figures_drawn_by_worker_processes_make_the_same_page(tmp_path):
    results = F.load_results([write_jsonl(tmp_path / "c.jsonl", cost_rows()), write_jsonl(tmp_path / "a.jsonl", acc_rows())])
    assert R.build_report(results, jobs=2) == R.build_report(results, jobs=1)


def test_the_page_leaves_diagnostic_figures_to_plot_unless_asked(html, tmp_path):
    assert 'id="fig-latency"' in html and "fig-throughput" not in html and "fig-flops_fraction" not in html
    out = tmp_path / "all.html"
    assert main(["report", str(write_jsonl(tmp_path / "c.jsonl", cost_rows())), "--all-figures", "--out", str(out)]) == 0
    assert 'id="fig-throughput"' in out.read_text()
