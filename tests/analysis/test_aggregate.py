"""The summary: one tidy row per cell x repeat, from real harness results, failures included."""

from __future__ import annotations

import json
import os
import shutil

import pandas as pd
import pytest
from conftest import ROOT
from feedbench.analysis.aggregate import load_results, read_summary, typed, write_summary
from feedbench.core.knobs import KNOBS
from helpers.damage import damage
from helpers.real_results import EXPERIMENTS, cells, real_matrix  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def summary(real_matrix, tmp_path_factory):  # noqa: F811
    path = str(tmp_path_factory.mktemp("summary") / "summary.csv")
    write_summary(load_results(real_matrix.paths), path)
    return read_summary(path)


def test_one_row_per_cell_and_repeat_with_labels_knobs_and_metrics(summary, real_matrix):  # noqa: F811
    assert len(summary) == len(real_matrix.paths) == 2 * len(cells(EXPERIMENTS)) + 1
    assert not summary.duplicated(["experiment", "cell", "repeat"]).any()
    for column in [
        "experiment",
        "cell",
        "repeat",
        "status",
        "error_type",
        "error_message",
        *KNOBS,
        "samples_per_s",
        "tokens_per_s",
        "step_ms_median",
        "step_ms_p10",
        "step_ms_p90",
        "stall_pct",
        "h2d_gb_per_s",
        "time_to_first_batch_s",
        "cuda_init_s",
        "wait_ms",
        "wait_share",
        "fwd_ms",
        "bwd_ms",
        "opt_ms",
        "h2d_share",
        "host",
        "gpu",
    ]:
        assert column in summary, column
    assert set(summary["experiment"]) == set(EXPERIMENTS) | {"broken"}
    assert sorted(summary.loc[summary["experiment"] == "train", "repeat"].unique()) == [0, 1]


def test_metrics_are_the_results_own_numbers(summary, real_matrix):  # noqa: F811
    by_path = summary.set_index("result")
    for path in real_matrix.paths[:-1]:
        with open(path) as f:
            result = json.load(f)
        row = by_path.loc[path]
        assert row["status"] == result["status"] == "ok"
        metrics = result["metrics"]
        if "transfer" in metrics:
            for point in metrics["transfer"]["by_size"]:
                column = (
                    f"transfer_gb_per_s_{'pinned' if point['pinned'] else 'pageable'}_"
                    f"{point['size_bytes']}"
                )
                assert row[column] == pytest.approx(point["median_gb_per_s"])
            continue
        assert row["samples_per_s"] == pytest.approx(metrics["samples_per_s"])
        assert row["step_ms_median"] == pytest.approx(metrics["step_ms"]["median"])
        assert row["stall_pct"] == pytest.approx(metrics["stall_pct"])
        assert row["wait_share"] == pytest.approx(metrics["phases"]["wait"]["share"])
        assert row["num_workers"] == result["cell"]["num_workers"]
        for name, stats in result["monitor"]["stats"].items():
            assert row[f"{name}_mean"] == pytest.approx(stats["mean"])


def test_transfer_columns_only_on_transfer_rows(summary):
    transfer = summary["scenario"] == "transfer"
    assert summary.loc[transfer, "transfer_peak_gb_per_s_pageable"].notna().all()
    assert summary.loc[~transfer, "transfer_peak_gb_per_s_pageable"].isna().all()
    assert summary.loc[transfer, "samples_per_s"].isna().all()


def test_failed_cell_is_kept_with_its_error(summary):
    failed = summary[summary["status"] == "failed"]
    assert list(failed["cell"]) == ["dataset-truncated"]
    row = failed.iloc[0]
    assert row["error_type"] == "OSError" and "runcated" in row["error_message"]
    assert row["model"] == "resnet18" and row["dataset"] == "images"


def test_adjusted_knobs_are_as_ran_and_requested_is_kept(summary):
    """On a CPU the harness runs pin_memory=true unpinned: the knob column says what ran,
    `requested` what was asked."""
    row = summary[summary["cell"] == "num_workers-0_pin_memory-true"].iloc[0]
    if row["device"] == "cuda":
        pytest.skip("pinning is honoured on a GPU: nothing is adjusted")
    assert not row["pin_memory"]
    assert row["requested"]["pin_memory"] is True  # read_summary gives the mapping
    assert "pin_memory" in row["adjustments"]


def test_labels_fall_back_to_the_workflow_path(run_cell, tmp_path):
    """A result without labels (run by hand) is named by where the workflow keeps it."""
    code, result = run_cell(
        model="none", scenario="loader", image_size=16, batch_size=8, steps=3, warmup_steps=0
    )
    assert code == 0 and result["cell"]["experiment"] is None
    target = tmp_path / "results" / "cells" / "by-hand" / "batch_size-8" / "rep3" / "result.json"
    target.parent.mkdir(parents=True)
    shutil.copy(tmp_path / "cell0" / "result.json", target)
    row = load_results([str(target)]).iloc[0]
    assert (row["experiment"], row["cell"], row["repeat"]) == ("by-hand", "batch_size-8", 3)


def test_invalid_cell_keeps_the_requested_knobs(run_cell, tmp_path):
    code, result = run_cell(batch_size=0, experiment="bad", cell="batch_size-0", repeat=0)
    assert code == 2 and result["cell"] is None
    row = load_results([str(tmp_path / "cell0" / "result.json")]).iloc[0]
    assert (row["experiment"], row["cell"], row["status"], row["error_type"]) == (
        "bad",
        "batch_size-0",
        "failed",
        "KnobError",
    )
    assert row["batch_size"] == 0 and "batch_size" in row["error_message"]


def test_unreadable_result_is_a_failed_row_not_a_crash(real_matrix, tmp_path):  # noqa: F811
    # Crafted: a result.json cut short, as a killed writer without atomic rename would leave it.
    broken = tmp_path / "cells" / "e" / "c" / "rep0" / "result.json"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"schema_version": 1, "status": ')
    frame = load_results([real_matrix.paths[0], str(broken)])
    row = frame[frame["cell"] == "c"].iloc[0]
    assert (
        row["status"] == "failed"
        and row["error_type"] == "UnusableResult"
        and str(broken) in row["error_message"]
    )
    assert "not valid JSON" in row["error_message"]
    assert (frame["status"] == "ok").sum() == 1


@pytest.mark.parametrize(
    "how, why",
    [
        ("no-metrics", "'metrics' is a required property"),
        ("rate-is-text", "metrics.samples_per_s: 'fast' is not of type"),
        ("negative-stall", "metrics.stall_pct: -50 is less than the minimum of 0"),
        ("nan-step", "metrics.step_ms.median: not a finite number"),
        ("null", "not a mapping but NoneType"),
        ("list", "not a mapping but list"),
    ],
)
def test_a_result_the_schema_refuses_is_a_failed_row_saying_why(real_matrix, tmp_path, how, why):  # noqa: F811
    good = real_matrix.paths[0]
    with open(good) as f:
        measured = json.load(f)
    assert measured["status"] == "ok"
    damaged = tmp_path / "cells" / "e" / "c" / "rep1" / "result.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text(damage(json.dumps(measured), how))  # the spoiling of test_damaged_results
    frame = load_results([good, str(damaged)])
    row = frame[frame["cell"] == "c"].iloc[0]
    assert (row["experiment"], row["repeat"], row["status"], row["error_type"]) == (
        "e",
        1,
        "failed",
        "UnusableResult",
    )
    assert why in row["error_message"] and str(damaged) in row["error_message"], row[
        "error_message"
    ]
    assert pd.isna(row["samples_per_s"])  # nothing of a refused result is shown as measured
    assert sorted(frame["status"]) == ["failed", "ok"]


def test_write_summary_is_atomic_and_round_trips(summary, tmp_path):
    path = tmp_path / "deep" / "summary.csv"
    write_summary(summary, str(path))
    assert os.listdir(path.parent) == ["summary.csv"]
    again = read_summary(str(path))
    pd.testing.assert_frame_equal(again, summary, check_dtype=False)


def test_no_results_gives_an_empty_table_with_the_columns():
    frame = load_results([])
    assert frame.empty and {"experiment", "cell", "repeat", "status", "num_workers"} <= set(
        frame.columns
    )


def test_a_failed_result_without_provenance_keeps_its_own_error(real_matrix, tmp_path):  # noqa: F811
    # A cell stuck inside one step past its time limit is ended before provenance may be known: its
    # result says why it failed, and that message, not a schema complaint, is what the summary
    # shows.
    with open(real_matrix.paths[0]) as f:
        result = json.load(f)
    del result["provenance"]
    result.update(
        status="failed",
        error={"type": "Terminated", "message": "time limit of 30 s reached", "traceback": ""},
    )
    stuck = tmp_path / "cells" / "e" / "c" / "rep1" / "result.json"
    stuck.parent.mkdir(parents=True)
    stuck.write_text(json.dumps(result))
    row = load_results([str(stuck)]).iloc[0]
    assert (row["status"], row["error_type"]) == ("failed", "Terminated")
    assert row["error_message"] == "time limit of 30 s reached"


STORED_SUMMARY = os.path.join(ROOT, "tests", "stored", "workers-small", "summary.csv")


def test_a_stored_summary_reads_with_knob_columns_typed_from_the_knob_spec():
    """A summary written before issue #22 (tests/stored) reads typed: each knob's column as its Knob
    declares (bools as booleans, integers as nullable integers), `requested` as the mapping of knobs
    asked for."""
    summary = read_summary(STORED_SUMMARY)
    expected = {bool: "boolean", int: "Int64", float: "float64"}
    for name, knob in KNOBS.items():
        if name in summary and knob.type in expected:
            assert str(summary[name].dtype) == expected[knob.type], name
    assert summary["num_workers"].tolist() == [1, 2, 4]
    assert summary["epochs"].isna().all()  # a nullable knob left empty
    assert summary["pin_memory"].tolist() == [False, False, False] and summary["in_order"].all()
    assert (
        summary["requested"][0]["num_workers"] == 1
        and summary["requested"][0]["pin_memory"] is False
    )


def test_a_knob_value_its_type_does_not_allow_stays_as_read():
    """A cell that failed validation keeps the value it asked for: its column is not typed, never
    coerced to empty."""
    frame = typed(
        pd.DataFrame(
            {"num_workers": ["many", "2"], "pin_memory": ["yes", None], "batch_size": [8.0, None]}
        )
    )
    assert (
        frame["num_workers"].tolist() == ["many", "2"] and frame["pin_memory"].tolist()[0] == "yes"
    )
    assert str(frame["batch_size"].dtype) == "Int64" and frame["batch_size"][0] == 8
