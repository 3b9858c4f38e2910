"""The planner's map of ceilings (core.ceilings.ceiling_map): the summary joins on it, and a summary
rebuilt from results that have none plans their cells again by the same rule
(aggregate.rebuilt_map)."""

from __future__ import annotations

import glob
import json

import pandas as pd
import pytest
from feedbench.analysis.aggregate import load_results, rebuilt_map, result_row, with_predictions
from feedbench.core.ceilings import Bounds, batch_bytes, ceiling_map
from feedbench.core.records import record_of
from feedbench.plan.config import validate_config
from feedbench.plan.matrix import build_cells
from helpers.snakemake_run import snakemake, workflow_copy

MLP = {
    "scenario": "train",
    "model": "mlp",
    "dataset": "memory",
    "input_size": 64,
    "width": 64,
    "batch_size": 16,
}
SIZE = batch_bytes(MLP)


def row(experiment: str, cell: str, scenario: str, metrics: dict, **knobs) -> dict:
    knobs = {**MLP, "device": "cuda", "scenario": scenario, **knobs}
    result = {
        "status": "ok",
        "cell": {**knobs, "experiment": experiment, "cell": cell},
        "metrics": metrics,
    }
    return result_row(record_of(result, f"results/cells/{experiment}/{cell}/rep1/result.json"))


def probe(gb_per_s: float) -> dict:
    point = {"size_bytes": SIZE, "pinned": False, "median_gb_per_s": gb_per_s}
    return {"samples_per_s": None, "transfer": {"by_size": [point]}}


# A training cell, and two measurements of each of its ceilings: the derived ones and another
# experiment's.
ROWS = [
    row("w", "base", "train", {"samples_per_s": 50.0}),
    row("ceilings-loader", "l", "loader", {"samples_per_s": 300.0}),
    row("other", "l", "loader", {"samples_per_s": 100.0}),
    row("ceilings-compute", "c", "compute", {"samples_per_s": 600.0}),
    row("ceilings-transfer", "t", "transfer", probe(10.0)),
    row("other", "t", "transfer", probe(1.0)),
]
LINKS = {
    "w/base": {
        "loader": "ceilings-loader/l",
        "compute": "ceilings-compute/c",
        "transfer": "ceilings-transfer/t",
    }
}


def test_the_summary_reads_the_ceilings_the_map_names():
    train = with_predictions(pd.DataFrame(ROWS), LINKS).iloc[0]
    assert (
        train["ceiling_loader_samples_per_s"] == 300.0
        and train["ceiling_compute_samples_per_s"] == 600.0
    )
    assert train["ceiling_copy_gb_per_s"] == 10.0 and train["ceiling_copy_from"] == "sweep"
    assert train["predicted_samples_per_s"] > 0


def test_a_training_cell_the_map_does_not_name_has_no_ceilings():
    train = with_predictions(pd.DataFrame(ROWS), {}).iloc[0]
    assert pd.isna(train["ceiling_loader_samples_per_s"]) and pd.isna(
        train["predicted_samples_per_s"]
    )


def test_without_a_map_the_planners_rule_finds_the_ceilings():
    # A summary rebuilt from results alone: its cells planned again from the knobs they asked for,
    # and the planner's own rule (ceilings.Bounds) names one cell per ceiling, the derived one where
    # another has the same knobs.
    rebuilt = rebuilt_map(pd.DataFrame(ROWS))
    assert rebuilt == {
        "w/base": {
            "loader": "ceilings-loader/l",
            "compute": "ceilings-compute/c",
            "transfer": "ceilings-transfer/t",
        }
    }
    train = with_predictions(pd.DataFrame(ROWS)).iloc[0]
    assert (
        train["ceiling_loader_samples_per_s"] == 300.0
        and train["ceiling_compute_samples_per_s"] == 600.0
    )
    assert train["ceiling_copy_gb_per_s"] == 10.0
    pd.testing.assert_series_equal(train, with_predictions(pd.DataFrame(ROWS), rebuilt).iloc[0])


def test_the_map_names_the_cells_the_planner_derived():
    config = {
        "defaults": {"device": "cuda"},
        "experiments": {"w": {"ceilings": True, "base": MLP, "matrix": {"num_workers": [0, 2]}}},
    }
    validate_config(config, "config/schema.yaml")
    cells = build_cells(config, check=False)
    links = ceiling_map(cells)
    bounds = Bounds(cells)
    trained = [c for c in cells if c.experiment == "w"]
    assert set(links) == {f"w/{c.id}" for c in trained}
    for cell in trained:
        found = bounds.of(cell)
        assert links[f"w/{cell.id}"] == {s: f"{c.experiment}/{c.id}" for s, c in found.items()}
        assert {s: c.experiment for s, c in found.items()} == {s: f"ceilings-{s}" for s in found}


def test_a_plan_without_ceiling_cells_maps_nothing():
    config = {"experiments": {"w": {"base": MLP, "matrix": {"num_workers": [0, 2]}}}}
    validate_config(config, "config/schema.yaml")
    assert ceiling_map(build_cells(config, check=False)) == {}


@pytest.mark.slow  # three tiny cells through Snakemake: about half a minute
def test_a_run_with_ceilings_joins_the_summary_on_the_planners_map(tmp_path):
    config = {
        "defaults": {
            "repeats": 1,
            "steps": 3,
            "warmup_steps": 1,
            "device": "cpu",
            "torch_threads": 1,
        },
        "experiments": {
            "w": {
                "ceilings": True,
                "base": {**MLP, "num_samples": 32},
                "matrix": {"num_workers": [0]},
            },
            # The same loader, sampled otherwise (a knob no ceiling keeps): the planner measures its
            # own ceiling.
            "other": {
                "base": {**MLP, "num_samples": 32, "scenario": "loader", "monitor_interval_s": 0.25}
            },
        },
    }
    workflow, work = workflow_copy(tmp_path)
    run = snakemake(workflow, work, config)
    assert run.returncode == 0, run.stderr[-4000:]
    links = json.loads((work / "results" / "ceilings.json").read_text())
    (trained,) = links
    assert trained.startswith("w/") and links[trained]["transfer"] is None  # a CPU copies nothing
    summary = pd.read_csv(work / "results" / "summary.csv")
    name = summary["experiment"] + "/" + summary["cell"]
    train = summary[name == trained].iloc[0]
    for ceiling in ("loader", "compute"):
        assert links[trained][ceiling].startswith(f"ceilings-{ceiling}/")
        measured = summary.loc[name == links[trained][ceiling], "samples_per_s"].median()
        assert train[f"ceiling_{ceiling}_samples_per_s"] == pytest.approx(measured)
    assert train["predicted_samples_per_s"] > 0
    # Rebuilt from the results alone, the summary plans the cells again: the same map, the same
    # ceiling figures.
    rebuilt = load_results(
        sorted(glob.glob(str(work / "results" / "cells" / "*" / "*" / "rep1" / "result.json")))
    )
    assert rebuilt_map(rebuilt) == links
    again = rebuilt[rebuilt["scenario"] == "train"].iloc[0]
    assert again["ceiling_loader_samples_per_s"] == pytest.approx(
        train["ceiling_loader_samples_per_s"]
    )
