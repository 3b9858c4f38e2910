"""The report as a reader sees it: headless Chromium loads it with no failed request, no console error, every figure
drawn.

Needs Debian's chromium package (`make system-deps` installs it as root);
skipped with that hint where it is missing. The screenshot is kept in
test-artifacts/report.png.

A report people publish must fit a laptop (1280 px) and a phone (390 px) at any matrix size: the page never
scrolls sideways (wide tables scroll in their own box) and no table cell clips its content. Checked on the test
matrix's report here, and on the report of every preset's small run (the breakdown preset's 5 axes and 12 cells
among them) made by the real workflow in tests/test_presets.py, which runs it once for its own tests.
"""

from __future__ import annotations

import os

import pytest
from browser import ARTIFACTS, assert_fits, inspect
from conftest import needs_chromium
from real_results import real_matrix  # noqa: F401 (fixture)
from test_report import config, make_report  # noqa: F401 (fixture)

pytestmark = [
    needs_chromium,
    pytest.mark.xdist_group("browser"),  # one worker: the module fixture renders the default report once
]


def test_report_loads_cleanly_and_draws_every_figure(real_matrix, config, tmp_path):  # noqa: F811
    html = os.path.join(tmp_path, "report", "index.html")
    make_report(str(tmp_path), real_matrix.paths, config)
    screenshot = os.path.join(ARTIFACTS, "report.png")
    page = inspect(html, screenshot)
    assert page.failed_loads == []
    assert page.console_errors == []
    assert all(url.startswith(("file://", "data:")) for url in page.requests), page.requests
    assert len(page.figures) == len(config["experiments"]) + 1  # and the train experiment's stage profile
    for figure in page.figures:  # the broken experiment's figure holds only its note: a text, still drawn
        assert figure["width"] > 100 and figure["height"] > 100 and figure["shapes"] > 0, figure
    # A drawn plot has axes, ticks, labels and marks (dozens of shapes; how many depends on the data);
    # the broken experiment's figure holds only its note (a few).
    assert sum(figure["shapes"] > 10 for figure in page.figures) == len(page.figures) - 1
    with open(screenshot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(screenshot) > 20_000


def test_the_check_sees_a_broken_page(tmp_path):
    """The same check on a crafted broken page must report each fault (so the test above can fail)."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<!doctype html><html><body><img src="missing.png"><script>console.error("boom")</script>'
        '<figure><svg width="0" height="0"></svg></figure></body></html>'
    )
    found = inspect(str(page))
    assert any("missing.png" in failure for failure in found.failed_loads)
    assert any("boom" in error for error in found.console_errors)
    assert found.figures == [{"width": 0, "height": 0, "shapes": 0}]


@pytest.fixture(scope="module")
def default_report(real_matrix, config, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("fit")
    make_report(str(root), real_matrix.paths, config)
    return str(root / "report" / "index.html")


@pytest.mark.parametrize("width", [1280, 390])
def test_the_report_fits_a_laptop_and_a_phone(default_report, width):
    page = inspect(default_report, os.path.join(ARTIFACTS, f"report-{width}.png"), width=width)
    assert_fits(page, f"default report at {width} px", width)


def test_the_fit_check_sees_a_page_that_scrolls_sideways_and_a_clipped_cell(tmp_path):
    """So the fit tests can fail."""
    page = tmp_path / "wide.html"
    page.write_text(
        "<!doctype html><html><body><table><tr><td>" + "x" * 400 + "</td>"
        '<td style="overflow:hidden;max-width:3em;white-space:nowrap">clipped content here</td>'
        "</tr></table></body></html>"
    )
    found = inspect(str(page), width=390)
    assert found.layout["scrollWidth"] > found.layout["clientWidth"]
    assert found.layout["clipped"] == ["clipped content here"]


def test_the_fit_check_sees_a_cramped_sentence_and_a_broken_word(tmp_path):
    """A study view table whose text column is squeezed (the breakdown view's published table before its fix) fails."""
    sentence = "processing time per GPU for 4 GPUs at batch size 1024 lower than for 1 GPU"
    page = tmp_path / "cramped.html"
    page.write_text(
        '<!doctype html><html><body><table class="view-table" style="width:20rem"><tr>'
        + "".join(f"<td>{'x' * 20}</td>" for _ in range(3))
        + f"<td>{sentence}</td><td>follow-up</td></tr></table></body></html>"
    )
    found = inspect(str(page), width=1280)
    assert [c.split(" px: ")[1] for c in found.layout["cramped"]] == [sentence[:60]]
    assert found.layout["broken"] == ["follow-up"]
