"""The report as a reader sees it: headless Chromium loads it with no failed request, no console error, every figure drawn.

Needs Debian's chromium package (`make system-deps` installs it as root);
skipped with that hint where it is missing. The screenshot is kept in
test-artifacts/report.png.
"""

from __future__ import annotations

import os

import pytest
from browser import find_chromium, inspect
from real_results import real_matrix  # noqa: F401 (fixture)
from test_report import config, make_report  # noqa: F401 (fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.path.join(ROOT, "test-artifacts")

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="needs Chromium: run `make system-deps` as root (or `apt-get install chromium`)")


def test_report_loads_cleanly_and_draws_every_figure(real_matrix, config, tmp_path):  # noqa: F811
    html = os.path.join(tmp_path, "report", "index.html")
    make_report(str(tmp_path), real_matrix.paths, config)
    screenshot = os.path.join(ARTIFACTS, "report.png")
    page = inspect(html, screenshot)
    assert page.failed_loads == []
    assert page.console_errors == []
    assert all(url.startswith(("file://", "data:")) for url in page.requests), page.requests
    assert len(page.figures) == len(config["experiments"])
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
    page.write_text('<!doctype html><html><body><img src="missing.png"><script>console.error("boom")</script>'
                    '<figure><svg width="0" height="0"></svg></figure></body></html>')
    found = inspect(str(page))
    assert any("missing.png" in failure for failure in found.failed_loads)
    assert any("boom" in error for error in found.console_errors)
    assert found.figures == [{"width": 0, "height": 0, "shapes": 0}]
