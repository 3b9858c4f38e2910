"""Corrections from the audit of the study views (issue 13), on hand-built summaries as the other view tests."""

from __future__ import annotations

import pytest

from feedbench.views import builder
from test_views_loader import PREFETCH, column, find, prefetch_rows, reference, row, summary

# --- prefetch ---------------------------------------------------------------------------------------------------------


def test_prefetch_says_the_published_speedup_falls_with_more_layers_at_one_epoch():
    view = builder("prefetch")(summary(prefetch_rows()), reference("prefetch"), PREFETCH)
    note = next(n for n in view.notes if n.startswith("The published speedup at 1 epoch"))
    assert "1.067, 1.053, 1.038 at 1, 4, 8 hidden layers" in note and "grows" in note
    assert not any("at 5 epoch" in n or "at 50 epoch" in n for n in view.notes)  # those do not fall steadily
    assert "mlp_style=ray" in view.text
