"""Results stored by an earlier version aggregate to the summary that version wrote (issue #22: keep behaviour).

tests/stored/workers-small holds real results and the summary the aggregate rule made of them on 2026-11-23. Every
column that summary has must come out the same today, whatever columns were added since; only `result`, the path
each row was read from, differs (the stored run's cells sit in another folder).
"""

from __future__ import annotations

import glob
import os

import pandas as pd
from feedbench.analysis.publish import summarize

STORED = os.path.join(os.path.dirname(__file__), "stored", "workers-small")


def read_as_text(path: str) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def test_stored_results_aggregate_to_the_stored_summary(tmp_path):
    results = sorted(glob.glob(os.path.join(STORED, "cells", "*", "result.json")))
    assert len(results) == 3
    summarize(results, str(tmp_path / "summary.csv"))
    stored, today = read_as_text(os.path.join(STORED, "summary.csv")), read_as_text(str(tmp_path / "summary.csv"))
    assert not set(stored.columns) - set(today.columns), "columns the stored summary has and today's lacks"
    columns = [c for c in stored.columns if c != "result"]
    pd.testing.assert_frame_equal(today[columns], stored[columns])
