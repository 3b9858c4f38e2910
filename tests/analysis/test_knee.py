"""The worker count with its proof (analysis.knee): which limit the sentence names, and when the
neighbours confirm the knee. Real runs show it in tests/workflow/test_search_workflow.py (16 levels)
and the workers preset's small run (tests/workflow/test_presets.py); here the rule's branches, from
cell tables as analysis.verdict.cell_table gives."""

from __future__ import annotations

import pandas as pd
from feedbench.analysis import knee
from feedbench.core import search

LEVELS = [1, 2, 4, 8]


def table(medians: dict, **per_level) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cell table, summary rows) of a searched experiment whose levels measured `medians`
    samples/s."""
    cells = [
        {
            "cell": f"num_workers-{w}",
            "num_workers": w,
            "median": m,
            "low": m * 0.98,
            "high": m * 1.02,
        }
        | {
            "ceiling_compute": 1000.0,
            "workers_kind": "waiting",
            "demand_cores": w + 1,
            "usable_cores": 16,
        }
        | {k: v.get(w) for k, v in per_level.items()}
        for w, m in medians.items()
    ]
    rows = pd.DataFrame([{**c, "status": "ok"} for c in cells])
    return pd.DataFrame(cells), rows


def decision(levels=LEVELS) -> dict:
    return search.measured_plan(
        "w",
        "num_workers",
        [{"knobs": {}, "cells": {w: f"num_workers-{w}" for w in levels}}],
        "num_workers-1",
    )


def test_a_knee_confirmed_on_both_sides_and_nothing_stops_it():
    cells, rows = table({1: 300.0, 2: 600.0, 4: 900.0, 8: 910.0})
    (line,) = knee.proof(decision(), cells, rows, "samples/s", lambda x: f"{x:.0f}")
    assert line.startswith(
        "recommended: 4 workers. Measured there: 900 samples/s (95 % interval 882–918), 90 % of"
    )
    assert (
        "2 workers 600 samples/s (67 %), 8 workers 910 samples/s (101 %); they confirm "
        "the knee" in line
    )
    assert line.endswith(
        "stopped by nothing: no limit of cores, memory or shared memory is reached; more workers "
        "are not faster."
    )


def test_the_limit_named_is_the_one_the_next_worker_would_pass():
    medians = {1: 300.0, 2: 600.0, 4: 900.0, 8: 1500.0}
    cells, rows = table(
        medians, oversubscribed={8: True}, workers_kind={4: "CPU-bound", 8: "CPU-bound"}
    )
    (line,) = knee.proof(decision(), cells, rows, "samples/s", str)
    assert "recommended: 4 workers" in line and "the level above does not confirm the knee" in line
    assert line.endswith(
        "stopped by the cores: CPU-bound workers at 8 workers asked for 9 cores of 16."
    )
    cells, rows = table(
        {1: 300.0, 2: 600.0, 4: 900.0}, workers_pss_mb_mean={4: 900.0}, memory_limit_mb={4: 1000.0}
    )
    (line,) = knee.proof(decision([1, 2, 4]), cells, rows, "samples/s", str)
    assert "its workers hold 900.0 MB (PSS, mean) of the 1000.0 MB the cell may use" in line
    assert line.endswith(
        "stopped by memory: one more worker would take the workers past 1000.0 MB."
    )
    cells, rows = table(
        {1: 300.0, 2: 600.0, 4: 900.0},
        shm_in_flight_bytes={4: 60 * 2**20},
        shm_free_bytes={4: 64 * 2**20},
    )
    (line,) = knee.proof(decision([1, 2, 4]), cells, rows, "samples/s", str)
    assert (
        "60.0 MB of shared memory in flight of 64.0 MB free" in line
        and "stopped by shared memory" in line
    )


def test_the_top_of_the_axis_and_cells_that_did_not_finish_are_said_so():
    cells, rows = table({1: 300.0, 2: 600.0, 4: 900.0})
    (line,) = knee.proof(decision([1, 2, 4]), cells, rows, "samples/s", str)
    assert (
        "none above; the knee is confirmed from below only" in line
        and "the axis ends at 4 workers" in line
    )
    cells, rows = table({1: float("nan"), 2: float("nan")})
    assert knee.proof(decision([1, 2]), cells, rows, "samples/s", str) == [
        "no cell the search ran finished: no worker count to recommend"
    ]


def test_no_workers_recommended_says_the_main_process_loads():
    cells, rows = table({0: 900.0, 1: 910.0, 2: 905.0})
    (line,) = knee.proof(decision([0, 1, 2]), cells, rows, "samples/s", str)
    assert (
        line.startswith("recommended: 0 workers.")
        and "no loader workers: the main process loads" in line
    )


def test_workers_never_sampled_are_said_so_not_nan():
    """A cell too short for the monitor has no workers_kind: NaN in the summary, which read "its
    workers are nan" (seen in a fresh clone's 16-level search, 2026-11-26)."""
    from feedbench.analysis.knee import _cpu

    said = _cpu(
        {"level": 8, "workers_kind": float("nan"), "demand_cores": 9, "usable_cores": 2}, str
    )
    assert said.startswith("its workers were not sampled") and "nan" not in said


def test_the_cores_limit_counts_the_trainers_threads():
    """Issue #39: a trainer of 2 intra-op threads takes 2 of the cores, so fewer workers fit beside
    it."""
    medians = {1: 300.0, 2: 600.0, 4: 900.0, 8: 1500.0}
    cells, rows = table(
        medians,
        oversubscribed={8: True},
        workers_kind={4: "CPU-bound", 8: "CPU-bound"},
        trainer_cores={w: 2 for w in medians},
        demand_cores={w: w + 2 for w in medians},
    )
    (line,) = knee.proof(decision(), cells, rows, "samples/s", str)
    assert line.endswith(
        "stopped by the cores: CPU-bound workers at 8 workers asked for 10 cores of 16 (the "
        "trainer's 2 intra-op threads among them)."
    )
    medians = {1: 300.0, 2: 600.0}
    cells, rows = table(
        medians,
        workers_kind={1: "CPU-bound", 2: "CPU-bound"},
        trainer_cores={1: 2, 2: 2},
        demand_cores={1: 3, 2: 4},
        usable_cores={1: 4, 2: 4},
    )
    (line,) = knee.proof(decision([1, 2]), cells, rows, "samples/s", str)
    assert line.endswith(
        "stopped by the cores: 4 usable hold at most 2 workers (the trainer's 2 intra-op threads "
        "among them)."
    )
