"""`make screenshots`: pictures of reports for docs/ and the README, taken by headless Chromium
(helpers/browser.py).

    PYTHONPATH=tests python -m helpers.screenshots DEFAULT_REPORT [BREAKDOWN_REPORT]

writes docs/report.png (the top of the default report, the README's picture), docs/decode-report.png
(the default report's training cell starved by JPEG decoding: its stage profile, the verdict's stage
and fix, its ceilings), docs/breakdown-report.png (the whole report of the breakdown preset's small
run: 5 axes, 8 cells) and docs/study-view.png (its study view alone), each 1280 px wide; without
BREAKDOWN_REPORT, the default's two. It stops with one line when a page does not fit its width, a
table cell clips its content, squeezes a sentence to a word a line or breaks a short word.
"""

from __future__ import annotations

import os
import sys

from helpers.browser import find_chromium, inspect

DOCS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs"
)


# (which report, the picture in docs/, how inspect takes it)
SHOTS = [
    ("default", "report.png", {"max_height": 1800}),
    ("default", "decode-report.png", {"selector": "#exp-decode"}),
    ("breakdown", "breakdown-report.png", {}),
    ("breakdown", "study-view.png", {"selector": ".view"}),
]


def main(default_report: str, breakdown_report: str | None = None) -> None:
    if find_chromium() is None:
        sys.exit("screenshots: needs Chromium (Debian: sudo apt-get install chromium)")
    reports = {"default": default_report, "breakdown": breakdown_report}
    for page, name, options in (
        (reports[which], name, options) for which, name, options in SHOTS if reports[which]
    ):
        found = inspect(page, os.path.join(DOCS, name), width=1280, **options)
        layout = found.layout
        cramped = layout["clipped"] or layout["cramped"] or layout["broken"]
        if layout["scrollWidth"] > layout["clientWidth"] or cramped or found.console_errors:
            sys.exit(
                f"screenshots: {page} does not fit 1280 px: {layout}, console errors "
                f"{found.console_errors}"
            )
        print(f"docs/{name}: {page}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
