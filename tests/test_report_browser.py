"""The report in a real browser: headless Chromium (Debian's package; scripts/test.sh installs it where it
can) at a laptop's 1400 px: no horizontal scroll even with every run and table unfolded, one run open and the
others folded, a contents list that reaches every run under its group, and a caption above each figure.
Skipped, saying why, where Chromium cannot be found."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_report import acc_rows, cost_rows, write_jsonl

from harness.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (Debian: apt-get install chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
PROBE = ("<script>window.addEventListener('load', () => { const d = document.documentElement;"
         " document.body.setAttribute('data-size', [d.scrollWidth, d.clientWidth, d.scrollHeight].join('x')); });</script>")
# As the page loads: how many of the open run's figures, of the folded runs' sections and of the folded tables are
# shown; then with every <details> opened, how many tables are shown and whether anything is wider than the window.
FOLDS = ("<script>window.addEventListener('load', () => { const n = s => [...document.querySelectorAll(s)]"
         ".filter(e => e.checkVisibility()).length; const d = document.documentElement;"
         " const shown = [n('article.run > details[open] figure img'), n('article.run > details:not([open]) section'),"
         " n('details.table > table')];"
         " document.querySelectorAll('details').forEach(e => { e.open = true; });"
         " document.body.setAttribute('data-folds', [...shown, n('details.table > table'), d.scrollWidth, d.clientWidth]"
         ".join('x')); });</script>")

# Every figure decoded by the browser itself (the report embeds lossless WebP), loaded eagerly so that the load event
# waits for them all: how many have a picture (a broken image has no natural width), of how many.
DECODE = ("<script>window.addEventListener('load', () => { const imgs = [...document.images];"
          " const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;"
          " document.body.setAttribute('data-decoded', ok + 'x' + imgs.length); });</script>")


def eager(page: str) -> str:
    return page.replace(' loading="lazy"', "")


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", "--window-size=1400,900", *args],
                          capture_output=True, text=True, timeout=120)


def probed(page: str, scripts: str, attrs: tuple[str, ...], tmp: Path, budget_ms: int = 5000) -> list[tuple[int, ...]]:
    """Load ``page`` with ``scripts`` appended to its body in Chromium and read back the numbers those scripts wrote
    into each ``data-<attr>`` of the body ("3x4" -> (3, 4))."""
    probe = tmp / "probe.html"
    probe.write_text(page.replace("</body>", scripts + "</body>"), encoding="utf-8")
    r = chromium(f"--virtual-time-budget={budget_ms}", "--dump-dom", probe.as_uri(), tmp=tmp)
    found = [re.search(rf'data-{a}="(\d+(?:x\d+)*)"', r.stdout) for a in attrs]
    assert all(found), r.stderr[-1000:]
    return [tuple(map(int, m.group(1).split("x"))) for m in found]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("browser")
    small = [dict(r, num_heads=4, run_id="s") for r in cost_rows()]
    paths = [write_jsonl(d / "big.jsonl", cost_rows()), write_jsonl(d / "small.jsonl", small),
             write_jsonl(d / "acc.jsonl", acc_rows())]
    out = d / "report.html"
    assert main(["report", *map(str, paths), "--out", str(out)]) == 0
    return out


def test_the_report_fits_a_laptop_screen_without_horizontal_scroll(report, tmp_path):
    [(scroll_width, client_width, height)] = probed(report.read_text(), PROBE, ("size",), tmp_path)
    assert client_width > 1000 and scroll_width <= client_width, (scroll_width, client_width)
    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", report.as_uri(), tmp=tmp_path)
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(header[16:20], "big") == 1400


def test_the_report_opens_one_run_and_folds_the_rest_and_unfolded_still_fits(report, tmp_path):
    [folds] = probed(report.read_text(), FOLDS, ("folds",), tmp_path)
    open_figures, folded_runs, folded_tables, unfolded_tables, scroll_width, client_width = folds
    assert open_figures > 0 and folded_runs == 0 and folded_tables == 0 and unfolded_tables > 0
    assert scroll_width <= client_width, (scroll_width, client_width)


def test_every_figure_decodes_in_the_browser(report, tmp_path):
    [(ok, total)] = probed(eager(report.read_text()), DECODE, ("decoded",), tmp_path)
    assert ok == total == report.read_text().count("<figure ") > 0


def test_the_report_is_grouped_by_run_with_contents_and_captions(report):
    page = report.read_text()
    runs = re.findall(r'<article class="run" id="([^"]+)" data-file="([^"]+)"><details(?: open)?><summary>'
                      r'<h3 class="run-title">([^<]+)</h3>', page)
    assert [(f, t) for _, f, t in runs] == [("big.jsonl",) * 2, ("small.jsonl",) * 2, ("acc.jsonl",) * 2]
    assert page.count("<details open>") == 1  # the first run open, the others one click away
    contents = page.split('<nav id="contents">')[1].split("</nav>")[0]
    for anchor, _, _ in runs:
        assert f'href="#{anchor}"' in contents
    # grouped: the two cost runs under one heading, the accuracy run under another, in the contents as on the page
    assert re.findall(r'<li><a href="#kind-(\w+)">', contents) == ["op", "pretrained"]
    assert contents.index("#kind-op") < contents.index(f'#{runs[0][0]}"') < contents.index("#kind-pretrained") \
        < contents.index(f'#{runs[2][0]}"')
    figures = re.findall(r"<figure[^>]*>(.*?)</figure>", page)
    assert figures and all(f.startswith("<figcaption><b>") and "<img" in f.split("</figcaption>")[1] for f in figures)
    # each run says its own shape: the pooled "H=4/8" header is gone
    assert "H=2" in page.split('id="run-2"')[0] and "H=4" in page.split('id="run-2"')[1].split('id="run-3"')[0]


def test_the_committed_report_loads_fits_and_every_figure_decodes(tmp_path):
    committed = Path(__file__).resolve().parents[1] / "results" / "report.html"
    size, (ok, total) = probed(eager(committed.read_text(encoding="utf-8")), PROBE + DECODE, ("size", "decoded"),
                               tmp_path, budget_ms=20000)
    scroll_width, client_width = size[:2]
    assert scroll_width <= client_width, (scroll_width, client_width)
    assert ok == total == committed.read_text(encoding="utf-8").count("<figure ") > 100
