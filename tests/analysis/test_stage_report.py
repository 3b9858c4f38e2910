"""The report names the stage: a data-bound cell's verdict names its costliest loader stage with its
share and ms per sample, and an experiment whose cells timed their stages gets a stacked bar of
them."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from feedbench.analysis import stages
from feedbench.analysis.aggregate import load_results
from feedbench.analysis.plots import stage_figure
from feedbench.analysis.verdict import summarize_experiment
from helpers.real_results import run_matrix
from helpers.reports import make_report

# one worker: fixture `paths` measures its cells once.
pytestmark = pytest.mark.xdist_group("stage_report")

# The ms per sample must stay under twice the delay. A loaded machine wakes a sleeping loader late:
# a 2 ms delay read 4.7 ms in a fresh clone's parallel phase; 10 ms leaves that lateness a margin
# of 10 ms, so the module runs beside the other tests.
DELAY_MS = 10.0
# One experiment of data-bound cells (a 10 ms sample delay, no workers): the same cell with stage
# timing off and on; and one with no stage timing at all.
EXPERIMENTS = {
    "timed": {
        "title": "A slow sample, timed",
        "base": {
            "scenario": "train",
            "model": "mlp",
            "dataset": "memory",
            "input_size": 16,
            "width": 16,
            "batch_size": 8,
            "num_samples": 64,
            "sample_delay_ms": DELAY_MS,
            "steps": 12,
            "warmup_steps": 2,
        },
        "matrix": {"stage_timing": [False, True]},
        "plot": {"x": "stage_timing", "y": "samples_per_s", "kind": "bar"},
    },
    "untimed": {
        "title": "Workers, untimed",
        "base": {
            "scenario": "loader",
            "model": "none",
            "image_size": 16,
            "batch_size": 8,
            "num_samples": 64,
        },
        "matrix": {"num_workers": [0]},
        "plot": {"x": "num_workers", "y": "samples_per_s", "kind": "bar"},
    },
}
NAMED = re.compile(
    r"(\d+) % of each sample's ([\d.]+) ms in the loader is sample_delay "
    r"\(([\d.]+) ms per sample\)$"
)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return run_matrix(str(tmp_path_factory.mktemp("stage-report")), EXPERIMENTS, repeats=2)


@pytest.fixture(scope="module")
def summary(paths):
    return load_results(paths)


def cell(found: dict, timing: bool) -> dict:
    cells = found["cells"]
    return (
        cells[cells["stage_timing"].astype(str).str.lower() == str(timing).lower()]
        .iloc[0]
        .to_dict()
    )


def test_a_data_bound_cell_with_stage_timing_names_its_costliest_stage(summary):
    found = summarize_experiment(
        summary[summary["experiment"] == "timed"], EXPERIMENTS["timed"]["matrix"]
    )
    timed = cell(found, True)
    assert timed["bound"] == "data"
    match = NAMED.search(timed["why"])
    assert match, timed["why"]
    share, whole, ms = int(match[1]), float(match[2]), float(match[3])
    assert share >= 80  # the delay is nearly all of a sample's time in the loader
    assert DELAY_MS <= ms <= whole < 2 * DELAY_MS
    assert timed["why"].startswith("waits on the loader ") and timed["culprit"] == match[0]


def test_a_cell_without_stage_timing_keeps_todays_wording(summary):
    found = summarize_experiment(
        summary[summary["experiment"] == "timed"], EXPERIMENTS["timed"]["matrix"]
    )
    untimed = cell(found, False)
    assert untimed["bound"] == "data" and pd.isna(untimed["culprit"])
    assert re.fullmatch(r"waits on the loader \d+ % of each step \(>= 10 %\)", untimed["why"]), (
        untimed["why"]
    )


def rows(shares: dict[str, float], worker_ms: float = 6.1, stall_pct: float = 40.0) -> pd.DataFrame:
    """Two repeats of one data-bound train cell with the given stage shares (crafted: which stage
    wins is the point)."""
    row = {"experiment": "e", "cell": "c", "status": "ok", "scenario": "train", "baseline": True}
    row |= {"samples_per_s": 100.0, "stall_pct": stall_pct, "stage_worker_ms": worker_ms}
    for name, share in shares.items():
        row |= {
            f"stage_{name}_share": share,
            f"stage_{name}_mean_ms": share * worker_ms,
            f"stage_{name}_ms": 0.0,
        }
    return pd.DataFrame([{**row, "repeat": 0}, {**row, "repeat": 1}])


def test_the_largest_named_stage_is_named_with_share_and_ms():
    found = summarize_experiment(
        rows({"decode": 0.3, "RandomResizedCrop": 0.58, "unattributed": 0.12})
    )
    assert found["best"]["why"].endswith(
        "; 58 % of each sample's 6.1 ms in the loader is RandomResizedCrop (3.5 ms per sample)"
    )


def test_unattributed_is_never_named_as_a_stage_when_it_is_the_largest():
    found = summarize_experiment(rows({"decode": 0.3, "unattributed": 0.7}))
    why = found["best"]["why"]
    assert why.endswith(
        "; the largest part of each sample's 6.1 ms in the loader, 70 % (4.3 ms), is outside the "
        "named stages (feedbench.stage marks more)"
    )
    assert "is unattributed" not in why and "decode" not in why


def test_a_cell_that_is_not_data_bound_names_no_stage():
    found = summarize_experiment(rows({"decode": 0.9, "unattributed": 0.1}, stall_pct=2.0))
    assert found["best"]["bound"] == "compute" and pd.isna(found["best"]["culprit"])
    assert "decode" not in found["best"]["why"]


def test_the_stage_figure_has_a_bar_per_cell_and_a_segment_per_stage(summary):
    timed = summary[summary["experiment"] == "timed"]
    fig = stage_figure(timed, "timed")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "unattributed",
        *reversed([n for n in stages.names(timed) if n != "unattributed"]),
        "worker (median)",
    ]
    assert len(ax.get_xticklabels()) == 1  # only the timed cell has stages to draw
    assert stage_figure(summary[summary["experiment"] == "untimed"], "untimed") is None


def test_the_report_shows_the_stage_figure_only_where_cells_timed_their_stages(paths, tmp_path):
    html = make_report(str(tmp_path), paths, {"experiments": EXPERIMENTS})
    sections = {
        name: html[html.index(f'id="exp-{name}"') :].split("</section>")[0] for name in EXPERIMENTS
    }
    assert (
        sections["timed"].count("<figure>") == 2
        and "Stage time per sample in the loader" in sections["timed"]
    )
    assert sections["untimed"].count("<figure>") == 1 and "Stage time" not in sections["untimed"]
    # the timed cell's bound says why, naming it
    assert "ms in the loader is sample_delay" in sections["timed"]


def test_the_recommendation_leads_with_the_stage_of_its_data_bound_cell():
    predicted = {
        "predicted_samples_per_s": 100.0,
        "ceiling_loader_samples_per_s": 80.0,
        "ceiling_compute_samples_per_s": 150.0,
    }
    found = summarize_experiment(
        rows({"RandomResizedCrop": 0.58, "unattributed": 0.42}).assign(**predicted)
    )
    assert found["recommendation"]["sentence"].startswith(
        "data-bound: 58 % of each sample's 6.1 ms in the loader is RandomResizedCrop (3.5 ms per "
        "sample); with free data, training could run 1.5x faster;"
    )
