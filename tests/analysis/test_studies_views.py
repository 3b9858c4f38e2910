"""Corrections from the audit of the study views (issue 13), on hand-built summaries as the other
view tests."""

from __future__ import annotations

import pandas as pd
import pytest
from feedbench.analysis.views import builder
from helpers.cells import TINY_LOADER
from helpers.result_rows import PREFETCH, column, find, prefetch_rows, reference, row, summary

# --- prefetch
# --------------------------------------------------------------------------------------------------


def test_prefetch_says_the_published_speedup_falls_with_more_layers_at_one_epoch():
    view = builder("prefetch")(summary(prefetch_rows()), reference("prefetch"), PREFETCH)
    note = next(n for n in view.notes if n.startswith("The published speedup at 1 epoch"))
    assert "1.067, 1.053, 1.038 at 1, 4, 8 hidden layers" in note and "grows" in note
    # those do not fall steadily
    assert not any("at 5 epoch" in n or "at 50 epoch" in n for n in view.notes)
    assert "mlp_style=ray" in view.text


# --- datastall
# --------------------------------------------------------------------------------------------------


def test_datastall_refuses_to_call_a_run_cached_below_99_percent_residency():
    from helpers.summary_rows import datastall_rows, table
    from helpers.summary_rows import summary as scaling_summary

    rows = datastall_rows()
    for r in rows:
        if r["page_cache"] == "warm" and r["model"] == "resnet18":
            r["page_cache_resident"] = 0.6 if r["num_workers"] == 2 else 0.995
    view = builder("datastall")(scaling_summary(rows), None, {})
    stalls = table(view, "Measured on").set_index(["model", "num_workers"])
    assert pd.isna(stalls.loc[("resnet18", 2), "cached us/sample"]) and pd.isna(
        stalls.loc[("resnet18", 2), "prep stall us/sample"]
    )
    # 99.5 % resident: cached
    assert stalls.loc[("resnet18", 4), "cached us/sample"] == pytest.approx(1e6 / 990)
    left_out = [n for n in view.notes if "num_workers=2" in n and "60.0 %" in n]
    assert len(left_out) == 3 and all("not called cached" in n for n in left_out)  # one per repeat
    assert (
        "do not carry over to 8" in view.text
        and "AMP" in view.text
        and "DALI" in view.text
        and "non_blocking" in view.text
    )


# --- workers
# --------------------------------------------------------------------------------------------------


def test_workers_labels_the_two_first_batch_windows_apart_and_marks_derived_numbers():
    from helpers.result_rows import WORKERS, workers_rows

    view = builder("workers")(summary(workers_rows()), reference("workers"), WORKERS)
    side = view.tables[0]
    assert "not the same quantity" in side.caption
    assert "published first-batch speedup vs 1 (CUDA init in, worker start-up out)" in side.columns
    assert "measured first-batch speedup vs 1 (worker start-up in, CUDA init out)" in side.columns
    published = find(view.tables, "Published")
    how = dict(zip(column(published, "num_workers"), column(published, "how read"), strict=True))
    assert how == {
        1: "printed",
        2: "derived: CPU total / CPU total %",
        4: "derived: CPU total / CPU total %",
        8: "printed",
        16: "printed",
    }
    assert (
        dict(
            zip(
                column(published, "num_workers"),
                column(published, "next() + .to() [ms]"),
                strict=True,
            )
        )[2]
        == 40.8
    )
    assert (
        "enumerate() runs before profile()" in view.text
        and "mostly worker start-up" not in view.text
    )


# --- breakdown
# --------------------------------------------------------------------------------------------------


def _breakdown_case(
    model: str, gpus: int, batch_per_gpu: int, processing: float, transfer: float
) -> list[dict]:
    rows = []
    for timing in ("events", "naive"):
        for pin in (False, True):
            for blocking in (False, True):
                knobs = {
                    "model": model,
                    "parallel": "dp",
                    "gpus_per_node": gpus,
                    "batch_size": batch_per_gpu,
                    "timing": timing,
                    "pin_memory": pin,
                    "non_blocking": blocking,
                }
                rows.append(
                    row(
                        "breakdown",
                        knobs,
                        step_ms=processing + transfer + 2,
                        wait_ms=2.0,
                        h2d_ms=transfer,
                        fwd_ms=processing / 3,
                        bwd_ms=processing / 3,
                        opt_ms=processing / 3,
                    )
                )
    return rows


BREAKDOWN_FULL = {
    "matrix": {
        "model": ["resnet18", "resnet50"],
        "gpus_per_node": [1, 4],
        "pin_memory": [False, True],
        "non_blocking": [False, True],
        "timing": ["events", "naive"],
    }
}


def breakdown_full_rows() -> list[dict]:
    return (
        _breakdown_case("resnet18", 1, 64, 30.0, 4.0)
        + _breakdown_case("resnet18", 4, 64, 36.0, 8.0)
        + _breakdown_case("resnet50", 1, 64, 90.0, 5.0)
        + _breakdown_case("resnet50", 4, 64, 99.0, 11.0)
        + _breakdown_case("resnet18", 1, 256, 120.0, 16.0)
        + _breakdown_case("resnet18", 4, 256, 132.0, 30.0)
    )


def test_breakdown_matches_each_statement_on_its_model_gpus_and_batch():
    view = builder("breakdown")(
        summary(breakdown_full_rows()), reference("breakdown"), BREAKDOWN_FULL
    )
    published = view.tables[0]
    rows = [dict(zip(published.columns, r, strict=True)) for r in published.rows]
    q3 = {r["model"]: r for r in rows if r["item"] == "Q3" and r["phase"] == "transfer"}
    # 4 GPUs, 256 in all: not the 1-GPU 4.0
    assert q3["resnet18"]["measured at this timing [ms]"] == pytest.approx(8.0)
    assert q3["resnet50"]["measured at this timing [ms]"] == pytest.approx(11.0)
    q1 = {r["model"]: r for r in rows if r["item"] == "Q1"}
    # 4 GPUs at 1024 in all
    assert q1["resnet18"]["measured at this timing [ms]"] == pytest.approx(132.0)
    assert q1["resnet50"]["measured at this timing [ms]"] is None
    assert any(
        n.startswith("Q1: no measured cell of model=resnet50 on 4 GPU(s) at batch 1024")
        for n in view.notes
    )
    assert sum(bool(r["explanation"]) for r in rows if r["item"] == "Q3") == 1


def test_breakdown_compares_processing_per_gpu_one_gpu_against_dataparallel():
    view = builder("breakdown")(
        summary(breakdown_full_rows()), reference("breakdown"), BREAKDOWN_FULL
    )
    per_gpu = find(
        view.tables,
        "Measured on NVIDIA H100 80GB HBM3 (host node1): processing time per step at the same "
        "batch per GPU",
    )
    cases = {
        (r[0], r[1], r[2], r[3], r[4]): dict(zip(per_gpu.columns, r, strict=True))
        for r in per_gpu.rows
    }
    q1 = cases[("resnet18", 256, "naive", True, True)]
    assert q1["processing, 1 GPU [ms]"] == pytest.approx(120.0) and q1[
        "processing, DataParallel on 4 GPUs [ms]"
    ] == pytest.approx(132.0)
    assert q1["4 GPUs / 1 GPU"] == pytest.approx(1.1)
    assert cases[("resnet50", 64, "events", False, False)]["4 GPUs / 1 GPU"] == pytest.approx(1.1)


def test_breakdown_says_sync_is_not_the_follow_up_and_why_event_bars_do_not_sum():
    view = builder("breakdown")(
        summary(breakdown_full_rows()), reference("breakdown"), BREAKDOWN_FULL
    )
    assert (
        "sync is not the post's follow-up" in view.text and "do not add up to the step" in view.text
    )
    events = view.figure.axes[0]
    assert events.get_title().startswith("events")
    assert any("need not sum to the step" in t.get_text() for t in events.texts)
    assert "step (host clock)" in events.get_legend_handles_labels()[1]


def test_a_loader_cell_repeats_the_notebooks_profiler_window(run_cell):
    loader = dict(TINY_LOADER, num_samples=64)
    code, result = run_cell(**loader, num_workers=1, profile_first_batch=True)
    assert code == 0 and result["status"] == "ok", result.get("error")
    window = result["metrics"]["first_batch_profile"]
    assert (
        window["data_load_ms"] > 0
        and window["to_ms"] is not None
        and window["to_ms"] <= window["data_load_ms"]
    )
    code, result = run_cell(**loader)
    assert result["metrics"]["first_batch_profile"] is None


def test_workers_shows_our_run_of_the_notebooks_window():
    from helpers.result_rows import WORKERS, workers_rows

    rows = workers_rows()
    for r in rows:
        r["first_batch_profiled_ms"] = 40.0 / max(r["num_workers"], 1)
    view = builder("workers")(summary(rows), reference("workers"), WORKERS)
    ours = find(view.tables, "Measured on")
    profiled = dict(
        zip(
            column(ours, "num_workers"),
            column(ours, "next() + .to() under the profiler [ms] (the notebook's window)"),
            strict=True,
        )
    )
    assert profiled[1] == pytest.approx(40.0) and profiled[4] == pytest.approx(10.0)
    side = view.tables[0]
    speedups = dict(
        zip(
            column(side, "num_workers"),
            column(
                side, "measured speedup of the notebook's window vs 1 (CUDA context made before it)"
            ),
            strict=True,
        )
    )
    assert speedups[4] == pytest.approx(4.0)
