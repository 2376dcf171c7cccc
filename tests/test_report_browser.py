"""Every kind of report, opened in headless Chromium: no console error, every figure loaded (issue 32).

Chromium and its driver are Debian's (`apt-get install chromium chromium-driver`; `.ci/run` installs
them), driven by selenium with that driver named: nothing is downloaded. Without them the test skips,
saying so. One browser serves the module, and one report of each kind of page (the event tar and raw
ROOT reports draw the same event sections as HDF5 and memmap: tests/test_report.py reads their content),
so the module stays under 20 s.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import jpeg_folder, make_docs, run_cli, write_jsonl

# many processes a test (DataLoader workers, killed ranks, an S3 server, a browser) or long: `make test-heavy`
pytestmark = pytest.mark.heavy

pytest.importorskip("matplotlib")
webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs selenium (the dev extra)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    """One report of each kind: tokens, images, events (HDF5, memmap) and raw inputs (texts, images)."""
    uproot = pytest.importorskip("uproot")  # noqa: F841
    from shardsmith.demo.root_files import make_icecube_like

    base = tmp_path_factory.mktemp("reports")
    texts = write_jsonl(base / "in" / "texts" / "a.jsonl", make_docs(300) + ["x    y    z\n    w    v"] * 300)
    images = jpeg_folder(base / "in" / "images", classes=3, per_class=6)
    root = make_icecube_like(base / "in" / "ev" / "run.root", events=200, mean_pulses=6, seed=0)
    made = {
        "tokens": ["pack-tokens", texts.parent, "--train-tokenizer", "300", "--split", "train=0.8,val=0.2"],
        "images": ["convert", images, "--to", "webdataset", "--shard-samples", "5"],
        "hdf5": ["convert", root, "--to", "hdf5"],
        "memmap": ["convert", root, "--to", "memmap", "--max-len", "8"],
    }
    out = {}
    for name, args in made.items():
        res = run_cli(*args, "-o", base / name, "-q")
        assert res.exit_code == 0, (name, res.stderr)
        out[name] = (base / name, base / f"report-{name}")
    out["raw-texts"] = (texts.parent, base / "report-raw-texts")
    out["raw-images"] = (images, base / "report-raw-images")
    for name, (src, folder) in out.items():
        res = run_cli("inspect", src, "--report", folder)
        assert res.exit_code == 0, (name, res.stderr)
    return {name: folder / "report.html" for name, (_, folder) in out.items()}


KINDS = ["tokens", "images", "hdf5", "memmap", "raw-texts", "raw-images"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_report_opens_clean_in_a_browser(browser, reports, kind):
    browser.get(reports[kind].as_uri())
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.getAttribute('src').slice(0, 30), i.complete, "
        "i.naturalWidth])")
    assert images, f"{kind}: a report without figures"
    broken = [src for src, complete, width in images if not complete or width == 0]
    assert not broken, f"{kind}: figures that did not load: {broken}"
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, f"{kind}: console errors {errors}"
    title = browser.execute_script("return document.title")
    assert title.startswith("shardsmith report"), title


def test_whitespace_tokens_keep_their_spaces(browser, reports):
    """A token of spaces is shown as its repr ('\\n   ') and the page keeps every space of it."""
    browser.get(reports["tokens"].as_uri())
    cells = browser.execute_script(
        "return Array.from(document.querySelectorAll('td')).map(td => [td.innerText, getComputedStyle(td).whiteSpace])")
    tokens = [text for text, space in cells if text.startswith("'") and "  " in text]
    assert tokens, "the spaced documents give tokens of several spaces"
    assert all(space == "pre-wrap" for _, space in cells)
