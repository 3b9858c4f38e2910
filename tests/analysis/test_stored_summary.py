"""Results stored by an earlier version aggregate to the summary that version wrote (issue #22: keep
behaviour).

tests/stored/workers-small holds real results and the summary the aggregate rule made of them on
2026-11-23. Every column that summary has must come out the same today, whatever columns were added
since; only `result`, the path each row was read from, differs (the stored run's cells sit in
another folder).
"""

from __future__ import annotations

import glob
import os

import pandas as pd
from conftest import ROOT
from feedbench.analysis.publish import summarize

STORED = os.path.join(ROOT, "tests", "stored", "workers-small")


def read_as_text(path: str) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def test_stored_results_aggregate_to_the_stored_summary(tmp_path):
    results = sorted(glob.glob(os.path.join(STORED, "cells", "*", "result.json")))
    assert len(results) == 3
    summarize(results, str(tmp_path / "summary.csv"))
    stored, today = (
        read_as_text(os.path.join(STORED, "summary.csv")),
        read_as_text(str(tmp_path / "summary.csv")),
    )
    assert not set(stored.columns) - set(today.columns), (
        "columns the stored summary has and today's lacks"
    )
    columns = [c for c in stored.columns if c != "result"]
    pd.testing.assert_frame_equal(today[columns], stored[columns])


def test_stored_results_read_as_typed_records_and_back(tmp_path):
    """Results written before some metrics existed read as records keyed by the knob and metric
    tables, those metrics empty (as their summary columns are), and come back equal from
    results/records.json."""
    from feedbench.core.knobs import KNOBS
    from feedbench.core.metric_table import METRICS
    from feedbench.core.records import NAMED, load_records, read_record, write_records

    records = [
        read_record(p) for p in sorted(glob.glob(os.path.join(STORED, "cells", "*", "result.json")))
    ]
    assert [r.knobs["num_workers"] for r in records] == [1, 2, 4] and all(
        set(r.knobs) == set(KNOBS) for r in records
    )
    assert all(set(r.metrics) == set(NAMED) <= set(METRICS) for r in records)
    # h2d: newer
    assert all(r.metrics["samples_per_s"] > 0 and r.metrics["h2d_bytes"] is None for r in records)
    write_records(records, str(tmp_path / "records.json"))
    assert load_records(str(tmp_path / "records.json")) == records
