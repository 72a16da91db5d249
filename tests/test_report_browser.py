"""The report in a real browser: headless Chromium (Debian's package; scripts/test.sh installs it where it
can) at a laptop's 1400 px: no horizontal scroll, a contents list that reaches every run, and a caption
above each figure. Skipped, saying why, where Chromium cannot be found."""
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


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", "--window-size=1400,900", *args],
                          capture_output=True, text=True, timeout=120)


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
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    r = chromium("--virtual-time-budget=5000", "--dump-dom", probe.as_uri(), tmp=tmp_path)
    size = re.search(r'data-size="(\d+)x(\d+)x(\d+)"', r.stdout)
    assert size, r.stderr[-1000:]
    scroll_width, client_width, height = map(int, size.groups())
    assert client_width > 1000 and scroll_width <= client_width, (scroll_width, client_width)
    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", report.as_uri(), tmp=tmp_path)
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(header[16:20], "big") == 1400


def test_the_report_is_grouped_by_run_with_contents_and_captions(report):
    page = report.read_text()
    runs = re.findall(r'<article class="run" id="([^"]+)"><details(?: open)?><summary><h2 class="run-title">([^<]+)</h2>', page)
    assert [t for _, t in runs] == ["Run: big.jsonl", "Run: small.jsonl", "Accuracy"]
    assert page.count("<details open>") == 1  # the first run open, the others one click away
    contents = page.split('<nav id="contents">')[1].split("</nav>")[0]
    for anchor, _ in runs:
        assert f'href="#{anchor}"' in contents
    figures = re.findall(r"<figure[^>]*>(.*?)</figure>", page)
    assert figures and all(f.startswith("<figcaption><b>") and "<img" in f.split("</figcaption>")[1] for f in figures)
    # each run says its own shape: the pooled "H=4/8" header is gone
    assert "H=2" in page.split('id="run-2"')[0] and "H=4" in page.split('id="run-2"')[1].split('id="run-3"')[0]
