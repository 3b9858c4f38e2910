"""`search: num_workers`: the choice of the training cells around the predicted knee
(feedbench.core.search), and the config checks; tests/workflow/test_search_workflow.py runs it
through Snakemake."""

from __future__ import annotations

import pytest
from feedbench.core import search
from feedbench.core.ceilings import ceiling_sources
from feedbench.plan.config import validate_config
from feedbench.plan.matrix import ConfigError, build_cells, search_groups
from helpers.cells import tiny_mlp_base

SCHEMA = "config/schema.yaml"
MLP = tiny_mlp_base()
SIXTEEN = list(range(16))


def config_of(experiment: dict) -> dict:
    config = {"defaults": {"device": "cpu"}, "experiments": {"w": experiment}}
    validate_config(config, SCHEMA)
    return config


def test_the_knee_is_the_fewest_workers_within_5_percent_of_the_best():
    # A loader-bound rise that flattens at the compute ceiling: 96 % of the best already counts.
    predictions = {0: 100.0, 1: 200.0, 2: 400.0, 3: 960.0, 4: 1000.0, 5: 990.0}
    assert search.knee(predictions) == 3
    assert search.choose(predictions)[:2] == (3, [2, 3, 4])


def test_the_neighbours_stop_at_the_ends_of_the_axis_and_follow_its_values_not_its_order():
    assert search.around([8, 0, 2, 4], 0) == [0, 2]
    assert search.around([8, 0, 2, 4], 8) == [4, 8]
    assert search.around([8, 0, 2, 4], 2) == [0, 2, 4]


def test_a_missing_prediction_runs_every_level():
    assert search.choose({0: 10.0, 1: None, 2: 30.0})[:2] == (None, [0, 1, 2])


def test_the_plan_keeps_the_baseline_and_says_what_it_ran():
    cells = {w: f"num_workers-{w}" for w in SIXTEEN}
    # the loader reaches compute at 6 workers
    predicted = {w: min(100.0 * (w + 1), 650.0) for w in SIXTEEN}
    plan = search.plan(
        "w", "num_workers", [{"knobs": {}, "cells": cells, "predicted": predicted}], "num_workers-0"
    )
    assert plan["run"] == ["num_workers-0", "num_workers-5", "num_workers-6", "num_workers-7"]
    assert plan["groups"][0]["knee"] == 6  # 5 workers predict 600 < 0.95 x 650
    assert search.sentence(plan) == (
        "searched: 16 levels of num_workers, ran 3: 5, 6, 7 workers (predicted knee 6); and the "
        "baseline cell num_workers-0"
    )


def test_each_combination_of_the_other_axes_gets_its_own_knee():
    config = config_of(
        {
            "search": "num_workers",
            "base": MLP,
            "matrix": {"num_workers": SIXTEEN, "pin_memory": [False, True]},
        }
    )
    cells = build_cells(config, check=False)
    groups = search_groups(cells, "w", "num_workers")
    assert [g["knobs"] for g in groups] == [{"pin_memory": False}, {"pin_memory": True}]
    assert all(sorted(g["cells"]) == SIXTEEN for g in groups)
    # The ceilings are implied: the loader alone at every level (pinned and not), and one compute
    # ceiling.
    assert len([c for c in cells if c.experiment == "ceilings-loader"]) == 32
    assert len([c for c in cells if c.experiment == "ceilings-compute"]) == 1
    sources = ceiling_sources(groups[1]["cells"][7], cells)
    assert (
        sources["loader"].knobs["num_workers"] == 7
        and sources["loader"].knobs["pin_memory"] is True
    )
    # a CPU copies nothing
    assert sources["compute"].experiment == "ceilings-compute" and sources["transfer"] is None
    line = search.dry_run_line("w", "num_workers", SIXTEEN, len(groups))
    assert "for each combination of the other axes" in line and "at most 7 training cells" in line


@pytest.mark.parametrize(
    "experiment, message",
    [
        (
            {"search": "pin_memory", "base": MLP, "matrix": {"num_workers": [0, 1]}},
            "experiments.w.search: value 'pin_memory' is not allowed; allowed: num_workers",
        ),
        (
            {"search": "num_workers", "base": MLP, "matrix": {"num_workers": [2]}},
            "experiments.w.search: the matrix has no num_workers axis of 2 levels or more; "
            "allowed: num_workers",
        ),
        (
            {"search": "num_workers", "base": MLP, "matrix": {"pin_memory": [False, True]}},
            "experiments.w.search: the matrix has no num_workers axis of 2 levels or more; "
            "allowed: num_workers",
        ),
        (
            {
                "search": "num_workers",
                "base": {**MLP, "scenario": "compute"},
                "matrix": {"num_workers": [0, 1]},
            },
            "experiments.w.search: the cells are scenario compute, parallel none, which have no "
            "prediction; allowed: num_workers on single-process training or loader cells",
        ),
        (
            {
                "search": "num_workers",
                "base": MLP,
                "matrix": {"num_workers": [0, 1], "scenario": ["train", "loader"]},
            },
            "experiments.w.search: the matrix varies scenario; allowed: num_workers with one "
            "scenario",
        ),
        (
            {
                "search": {"axis": "num_workers", "beyond_cores": "yes"},
                "base": MLP,
                "matrix": {"num_workers": [0, 1]},
            },
            "experiments.w.search.beyond_cores: value 'yes' has the wrong type; allowed: true or "
            "false",
        ),
        (
            {
                "search": {"axis": "num_workers", "beyond": True},
                "base": MLP,
                "matrix": {"num_workers": [0, 1]},
            },
            "experiments.w.search.beyond: unknown key; allowed: axis, beyond_cores",
        ),
        (
            {"search": {"beyond_cores": True}, "base": MLP, "matrix": {"num_workers": [0, 1]}},
            "experiments.w.search: missing key; allowed: a mapping with axis",
        ),
    ],
)
def test_a_bad_search_is_one_line_naming_what_is_allowed(experiment, message):
    with pytest.raises(ConfigError) as error:
        config = {"defaults": {"device": "cpu"}, "experiments": {"w": experiment}}
        validate_config(config, SCHEMA)
        build_cells(config, check=False)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_the_search_block_names_its_axis_and_may_pass_the_cores():
    config = config_of(
        {
            "search": {"axis": "num_workers", "beyond_cores": True},
            "base": MLP,
            "matrix": {"num_workers": [0, 1]},
        }
    )
    assert (
        len([c for c in build_cells(config, check=False) if c.experiment == "ceilings-loader"]) == 2
    )
    assert search.axis_of(config["experiments"]["w"]["search"]) == "num_workers"
    assert search.beyond_cores(config["experiments"]["w"]["search"]) and not search.beyond_cores(
        "num_workers"
    )


def test_only_cpu_bound_workers_beyond_the_cores_stop_the_knee():
    """Workers that wait (on storage, say) may outnumber the cores: the knee stays; CPU-bound ones
    stop it."""
    predicted = {w: 10.0 * (w + 1) for w in (0, 1, 2, 4, 8)}
    waiting = {
        w: {"oversubscribed": False, "demand_cores": w + 1, "usable_cores": 2} for w in predicted
    }
    assert search.choose(predicted, waiting)[0] == 8
    busy = {
        w: {**waiting[w], "oversubscribed": w + 1 > 2, "runnable_share": 0.97} for w in predicted
    }
    knee, levels, why = search.choose(predicted, busy)
    assert (knee, levels) == (1, [0, 1, 2]) and why.startswith(
        "stopped at 1 worker by the cores: at 8"
    )
    assert "runnable 97 % of the time" in why and "asked for 9 cores and it had 2" in why
    assert search.choose(predicted, busy, beyond=True)[0] == 8
    assert search.choose(predicted)[2].startswith(
        "the predicted knee: more workers are predicted to add less than 5 %"
    )
