"""Corrections from the audit of the study views (issue 13), on hand-built summaries as the other view tests."""

from __future__ import annotations

import pandas as pd
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


# --- datastall --------------------------------------------------------------------------------------------------------

def test_datastall_refuses_to_call_a_run_cached_below_99_percent_residency():
    from test_views_scaling import datastall_rows, table
    from test_views_scaling import summary as scaling_summary

    rows = datastall_rows()
    for r in rows:
        if r["page_cache"] == "warm" and r["model"] == "resnet18":
            r["page_cache_resident"] = 0.6 if r["num_workers"] == 2 else 0.995
    view = builder("datastall")(scaling_summary(rows), None, {})
    stalls = table(view, "Measured on").set_index(["model", "num_workers"])
    assert pd.isna(stalls.loc[("resnet18", 2), "cached us/sample"]) and pd.isna(stalls.loc[("resnet18", 2), "prep stall us/sample"])
    assert stalls.loc[("resnet18", 4), "cached us/sample"] == pytest.approx(1e6 / 990)  # 99.5 % resident: cached
    left_out = [n for n in view.notes if "num_workers=2" in n and "60.0 %" in n]
    assert len(left_out) == 3 and all("not called cached" in n for n in left_out)  # one per repeat
    assert "do not carry over to 8" in view.text and "AMP" in view.text and "DALI" in view.text and "non_blocking" in view.text


# --- workers ----------------------------------------------------------------------------------------------------------

def test_workers_labels_the_two_first_batch_windows_apart_and_marks_derived_numbers():
    from test_views_loader import WORKERS, workers_rows

    view = builder("workers")(summary(workers_rows()), reference("workers"), WORKERS)
    side = view.tables[0]
    assert "not the same quantity" in side.caption
    assert "published first-batch speedup vs 1 (CUDA init in, worker start-up out)" in side.columns
    assert "measured first-batch speedup vs 1 (worker start-up in, CUDA init out)" in side.columns
    published = find(view.tables, "Published")
    how = dict(zip(column(published, "num_workers"), column(published, "how read")))
    assert how == {1: "printed", 2: "derived: CPU total / CPU total %", 4: "derived: CPU total / CPU total %", 8: "printed", 16: "printed"}
    assert dict(zip(column(published, "num_workers"), column(published, "next() + .to() [ms]")))[2] == 40.8
    assert "enumerate() runs before profile()" in view.text and "mostly worker start-up" not in view.text
