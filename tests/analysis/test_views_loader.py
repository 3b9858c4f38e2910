"""The prefetch, workers and breakdown study views: from small summaries made the way aggregate
makes them, with the real published tables."""

from __future__ import annotations

import os

import pytest
from feedbench.analysis.report import build as build_report
from feedbench.analysis.report import render
from feedbench.analysis.views import builder
from helpers.result_rows import (
    BREAKDOWN,
    H100,
    PREFETCH,
    REFERENCES,
    WORKERS,
    column,
    find,
    keyed,
    prefetch_rows,
    reference,
    row,
    summary,
    workers_rows,
)
from markupsafe import escape
from matplotlib.figure import Figure

# --- published tables
# -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, keys, metrics, count",
    [
        ("prefetch", ["epochs", "hidden_layers", "device_prefetch"], ["seconds"], 18),
        ("workers", ["num_workers"], ["data_load_ms", "h2d_memcpy_us"], 5),
        ("breakdown", ["item", "pin_memory", "non_blocking", "timing", "phase"], ["reported"], 7),
    ],
)
def test_every_row_of_each_published_table_has_its_columns(name, keys, metrics, count):
    with open(os.path.join(REFERENCES, f"{name}.csv")) as f:
        assert f.readline().startswith("#"), "the source comes first, in a comment"
    table = reference(name)
    assert len(table) == count
    required = ["hardware", "source", *keys, *metrics]
    assert set(required) <= set(table.columns)
    assert table[required].notna().all().all(), f"empty cells in {name}.csv"
    assert not table.duplicated(keys).any()


def test_published_numbers_are_the_studies():
    prefetch = reference("prefetch").set_index(["epochs", "hidden_layers", "device_prefetch"])[
        "seconds"
    ]
    assert prefetch[(1, 1, "stream")] == 2.52 and prefetch[(1, 1, "none")] == 2.69
    assert prefetch[(50, 8, "stream")] == 693.52 and prefetch[(50, 8, "none")] == 736.17
    assert set(reference("prefetch")["hardware"]) == {"NVIDIA 2080 Ti"}
    workers = reference("workers").set_index("num_workers")["data_load_ms"]
    # 2 and 4: derived, rounded
    assert workers.to_dict() == {1: 5366, 2: 40.8, 4: 28.5, 8: 15.049, 16: 49.758}
    assert set(reference("breakdown")["timing"]) <= {"events", "sync", "naive"}


# --- prefetch
# --------------------------------------------------------------------------------------------------


def test_prefetch_speedup_is_time_without_over_time_with_per_source():
    view = builder("prefetch")(summary(prefetch_rows()), reference("prefetch"), PREFETCH)
    ours = find(view.tables, "Measured on NVIDIA H100")
    cell = ("source", "epochs", "hidden_layers")
    times = keyed(ours, cell, "time without prefetch [s]")
    # the median of the repeats, not their mean
    assert times[("pageable", 5, 4)] == pytest.approx(40.0)
    speedups = keyed(ours, cell, "speedup")
    assert speedups[("pageable", 1, 1)] == pytest.approx(2.0 / 1.9)
    assert speedups[("pinned", 5, 4)] == pytest.approx(2.0 / 1.6)
    assert (
        "1.05× from a pageable source" in view.verdict
        and "1.25× from a pinned source" in view.verdict
    )


def test_prefetch_shows_the_published_table_and_speedups_side_by_side():
    view = builder("prefetch")(summary(prefetch_rows()), reference("prefetch"), PREFETCH)
    published = find(view.tables, "Published")
    assert "NVIDIA 2080 Ti" in published.caption
    assert len(published.rows) == 9
    side = view.tables[0]
    assert side.columns == [
        "epochs",
        "hidden_layers",
        "published (NVIDIA 2080 Ti)",
        "measured, pageable source",
        "measured, pinned source",
    ]
    by_point = {(r[0], r[1]): r for r in side.rows}
    assert by_point[(1, 1)][2] == pytest.approx(2.69 / 2.52)
    assert by_point[(5, 4)][4] == pytest.approx(1.25)
    assert by_point[(50, 8)][3] is None  # published, not measured here
    # one axes per epochs value
    assert isinstance(view.figure, Figure) and len(view.figure.axes) == 3
    # that one: test_studies_views
    assert [n for n in view.notes if not n.startswith("The published speedup")] == []


def test_prefetch_on_cpu_keeps_pinned_cells_in_their_column_and_says_why_they_do_not_differ():
    view = builder("prefetch")(summary(prefetch_rows(gpu=None)), reference("prefetch"), PREFETCH)
    ours = find(view.tables, "Measured on CPU only")
    assert column(ours, "source").count("pinned") == 4  # ran with pin_memory=false, asked for true
    assert any("pass-through" in n for n in view.notes)


def test_prefetch_without_reference_and_with_failed_cells():
    rows = prefetch_rows() + [
        row(
            "prefetch",
            {"epochs": 50, "hidden_layers": 8, "device_prefetch": "none", "pin_memory": True},
            failed=True,
        )
    ]
    view = builder("prefetch")(summary(rows), None, PREFETCH)
    assert not any(t.caption.startswith("Published") for t in view.tables)
    assert any("No published table" in n for n in view.notes)
    assert any("epochs=50" in n and "OutOfMemoryError" in n for n in view.notes)
    assert len(find(view.tables, "Measured").rows) == 8  # the failed cell is not a row of numbers


def test_prefetch_with_nothing_measured():
    rows = [
        row(
            "prefetch",
            {"epochs": 1, "hidden_layers": 1, "device_prefetch": p, "pin_memory": False},
            failed=True,
        )
        for p in ("none", "stream")
    ]
    view = builder("prefetch")(summary(rows), reference("prefetch"), PREFETCH)
    assert find(view.tables, "Measured").rows == []
    assert view.verdict is None
    assert any("measured anything" in n for n in view.notes)
    assert view.figure is not None  # the published speedups still have their figure


# --- workers
# --------------------------------------------------------------------------------------------------


def test_workers_steady_state_beside_first_batch_and_cuda_init():
    view = builder("workers")(summary(workers_rows()), reference("workers"), WORKERS)
    ours = find(view.tables, "Measured on NVIDIA H100")
    assert column(ours, "num_workers") == [0, 1, 2, 4, 8]
    assert column(ours, "samples/s (steady state)") == [500, 1000, 1500, 2500, 2500]
    assert column(ours, "first batch [ms]")[1] == pytest.approx(70.0)
    assert column(ours, "CUDA init [ms], apart") == [pytest.approx(400.0)] * 5
    assert column(ours, "first batch / steady batch")[1] == pytest.approx(70.0 / 64.0)
    side = view.tables[0]
    points = {r[0]: r for r in side.rows}
    assert points[8][1] == pytest.approx(5366 / 15.049)  # the published first-batch "speedup"
    # ours: the first batch gets slower with more workers to start
    assert points[4][2] == pytest.approx(70.0 / 130.0)
    assert points[4][3] == pytest.approx(2.5)  # steady state: 2500 / 1000 samples/s
    assert points[16][3] is None
    published = find(view.tables, "Published")
    assert "not stated" in published.caption and len(published.rows) == 5
    assert "4 workers load the most" in view.verdict and "400 ms" in view.verdict
    assert isinstance(view.figure, Figure) and len(view.figure.axes) == 2


def test_workers_on_cpu_without_reference_and_a_failed_cell():
    rows = workers_rows(gpu=None) + [
        row("workers", {"scenario": "loader", "num_workers": 16}, gpu=None, failed=True)
    ]
    view = builder("workers")(summary(rows), None, WORKERS)
    assert any("no CUDA context" in n for n in view.notes)
    assert any("No published table" in n for n in view.notes)
    assert any("num_workers=16" in n for n in view.notes)
    side = view.tables[0]
    assert side.columns == [
        "num_workers",
        "measured first-batch speedup vs 1 (worker start-up in, CUDA init out)",
        "measured steady-state speedup vs 1",
    ]  # no published column
    assert column(side, "measured steady-state speedup vs 1")[0] == pytest.approx(0.5)
    assert "creating the CUDA context" not in view.verdict


# --- breakdown
# --------------------------------------------------------------------------------------------------

# The case of the post's Q2, Q3 and follow-up: DataParallel on 4 GPUs, batch 256 in all.
POST_CASE = {"model": "resnet18", "parallel": "dp", "gpus_per_node": 4, "batch_size": 64}


def breakdown_rows(gpu: str | None = H100, case: dict = POST_CASE) -> list[dict]:
    """Pageable copies cost 5 ms; pinned ones 1 ms, which naive timing of a non_blocking copy books
    under forward."""
    rows = []
    for timing in ("events", "sync", "naive"):
        for pin in (False, True):
            for blocking in (False, True):
                hidden = timing == "naive" and pin and blocking
                h2d = 0.05 if hidden else (1.0 if pin else 5.0)
                for repeat in range(2):
                    rows.append(
                        row(
                            "breakdown",
                            {**case, "timing": timing, "pin_memory": pin, "non_blocking": blocking},
                            repeat,
                            gpu,
                            step_ms=40.0,
                            wait_ms=2.0 if pin else 3.0,
                            h2d_ms=h2d,
                            fwd_ms=10.0 + (0.95 if hidden else 0.0),
                            bwd_ms=20.0,
                            opt_ms=3.0,
                        )
                    )
    return rows


def test_breakdown_phases_per_timing_mode():
    view = builder("breakdown")(summary(breakdown_rows()), reference("breakdown"), BREAKDOWN)
    ours = find(view.tables, "Measured on NVIDIA H100")
    assert column(ours, "timing") == ["events"] * 4 + ["sync"] * 4 + ["naive"] * 4
    cases = {(r[0], r[1], r[2]): dict(zip(ours.columns, r, strict=True)) for r in ours.rows}
    assert cases[("naive", True, True)]["transfer [ms]"] == pytest.approx(0.05)
    # fwd + bwd + opt
    assert cases[("naive", True, True)]["processing [ms]"] == pytest.approx(33.95)
    assert cases[("events", False, False)]["load [ms]"] == pytest.approx(3.0)
    assert isinstance(view.figure, Figure) and len(view.figure.axes) == 3
    assert view.figure.axes[0].get_title().startswith("events")


def test_breakdown_lists_the_posts_statements_with_our_numbers_and_explanations():
    view = builder("breakdown")(summary(breakdown_rows()), reference("breakdown"), BREAKDOWN)
    published = view.tables[0]
    assert published.caption.startswith("Published") and "not stated" in published.caption
    rows = [dict(zip(published.columns, r, strict=True)) for r in published.rows]
    q3 = [r for r in rows if r["item"] == "Q3"]
    assert {r["phase"] for r in q3} == {"load", "transfer", "processing"}
    transfer = next(r for r in q3 if r["phase"] == "transfer")
    assert transfer["measured at this timing [ms]"] == pytest.approx(5.0)
    q1 = next(
        r for r in rows if r["item"] == "Q1"
    )  # 4 GPUs at batch 1024 in all: not among these cells (test_studies_views)
    assert q1["measured at this timing [ms]"] is None and any(
        n.startswith("Q1: no measured cell of model=resnet18 on 4") for n in view.notes
    )
    for item in ("Q1", "Q2", "Q3", "follow-up"):  # each statement explained once, on its first row
        assert [bool(r["explanation"]) for r in rows if r["item"] == item][0] and sum(
            bool(r["explanation"]) for r in rows if r["item"] == item
        ) == 1
    assert view.verdict.startswith("Shortest step, timed with events")


def test_breakdown_on_cpu_and_with_a_missing_timing_mode():
    rows = [r for r in breakdown_rows(gpu=None) if r["timing"] != "sync"]
    rows.append(
        row(
            "breakdown",
            {"timing": "sync", "pin_memory": True, "non_blocking": True},
            gpu=None,
            failed=True,
        )
    )
    view = builder("breakdown")(summary(rows), None, BREAKDOWN)
    assert any("same host clock" in n for n in view.notes)
    assert any("timing=sync" in n and "incomplete" in n for n in view.notes)
    assert any("No published table" in n for n in view.notes)
    assert len(view.figure.axes) == 2


@pytest.mark.parametrize(
    "name, knobs",
    [
        ("workers", {"scenario": "loader", "num_workers": 2}),
        ("breakdown", {"timing": "naive", "pin_memory": True, "non_blocking": True}),
    ],
)
def test_workers_and_breakdown_with_nothing_measured(name, knobs):
    view = builder(name)(
        summary([row(name, knobs, failed=True)]),
        reference(name),
        {"matrix": {k: [v] for k, v in knobs.items()}},
    )
    assert find(view.tables, "Measured").rows == [] and find(view.tables, "Published").rows
    assert view.verdict is None
    assert any("measured anything" in n for n in view.notes)


# --- through the report
# ----------------------------------------------------------------------------------------------


def test_each_view_is_rendered_in_the_report_with_its_tables():
    frame = summary(prefetch_rows() + workers_rows() + breakdown_rows())
    config = {
        "experiments": {
            "prefetch": {"title": "Ray prefetch", "view": "prefetch", **PREFETCH},
            "workers": {
                "title": "CIFAR-100 workers",
                "view": "workers",
                "base": {"scenario": "loader"},
                **WORKERS,
            },
            "breakdown": {"title": "Forum breakdown", "view": "breakdown", **BREAKDOWN},
        }
    }
    references = [
        os.path.join(REFERENCES, f"{name}.csv") for name in ("prefetch", "workers", "breakdown")
    ]
    context = build_report(frame, [], [], config, "c0ffee42", references=references)
    html = render(context)
    for name, spec in config["experiments"].items():
        start = html.index(f'id="view-{name}"')
        section = html[start : html.index("</div>", start)]
        view = builder(name)(frame[frame["experiment"] == name], reference(name), spec)
        assert view.tables and "<svg" in section
        for table in view.tables:
            assert f"<caption>{escape(table.caption)}</caption>" in section
        assert section.count('<table class="view-table">') == len(view.tables)
        assert f"<p>{escape(' '.join(view.text.split()[:6]))}" in section
