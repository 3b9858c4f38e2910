"""Documentation that must stay in line with the code."""

from __future__ import annotations

import os
import re

from conftest import ROOT
from feedbench.plan import metric_table
from feedbench.plan.knobs import markdown_table


def test_knob_table_in_docs_matches_knobs():
    text = open(os.path.join(ROOT, "docs", "knobs.md")).read()
    table = re.search(r"<!-- knobs:begin[^>]*-->\n(.*)<!-- knobs:end -->", text, re.S).group(1)
    assert table == markdown_table(), "regenerate with: python -m feedbench knobs --markdown"


def test_metric_table_in_docs_matches_the_metric_table():
    text = open(os.path.join(ROOT, "docs", "result-schema.md")).read()
    table = re.search(r"<!-- metrics:begin[^>]*-->\n(.*)<!-- metrics:end -->", text, re.S).group(1)
    assert table == metric_table.markdown_table(), "regenerate with: python -m feedbench metrics --markdown"
