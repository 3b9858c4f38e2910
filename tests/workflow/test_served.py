"""Ceilings fold under the experiment they serve: the report shows no section and no verdict row for
`ceilings-loader` and the like, but a table of ceilings in the experiment that asked for them, from
real cells run by the harness as the planner lays them out, joined on the planner's map."""

from __future__ import annotations

import os

import pytest
from conftest import needs_chromium
from feedbench.analysis.aggregate import load_results, read_summary, write_summary
from feedbench.analysis.plots import plot_experiment
from feedbench.analysis.publish import report
from feedbench.core.ceilings import ceiling_map
from feedbench.harness.runner import run
from feedbench.plan.config import validate_config
from feedbench.plan.matrix import build_cells
from helpers.browser import ARTIFACTS, assert_fits, inspect

pytestmark = pytest.mark.xdist_group("served")  # one worker: the module fixture runs the cells once

MLP = {
    "scenario": "train",
    "model": "mlp",
    "dataset": "memory",
    "input_size": 32,
    "width": 32,
    "batch_size": 16,
}
CONFIG = {
    "defaults": {
        "repeats": 2,
        "steps": 4,
        "warmup_steps": 1,
        "torch_threads": 1,
        "device": "cpu",
        "num_samples": 128,
    },
    "experiments": {
        "train": {
            "title": "Does a worker feed the MLP?",
            "ceilings": True,
            "base": MLP,
            "matrix": {"num_workers": [0, 1]},
            "plot": {"x": "num_workers", "y": "samples_per_s", "kind": "bar"},
        },
        "compute": {  # measures the training cells' compute ceiling: shared, not measured again
            "title": "Compute ceiling",
            "base": {**MLP, "scenario": "compute"},
            "plot": {"x": "model", "y": "samples_per_s", "kind": "bar"},
        },
    },
}
SCHEMA = "config/schema.yaml"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The cells as the planner makes them (ceilings included), each repeat run by the harness;
    summary and map."""
    root = tmp_path_factory.mktemp("served")
    config = {**CONFIG}
    validate_config(config, SCHEMA)
    cells = build_cells(config, check=False)
    paths = []
    for cell in cells:
        for repeat in (1, 2):
            out = root / "cells" / cell.experiment / cell.id / f"rep{repeat}"
            run({**cell.labelled(repeat), "seed": repeat}, str(out))
            paths.append(str(out / "result.json"))
    links = ceiling_map(cells)
    summary = str(root / "summary.csv")
    write_summary(load_results(paths, links), summary)
    svgs = []
    for name, spec in config["experiments"].items():
        svgs.append(str(root / "plots" / f"{name}.svg"))
        plot_experiment(read_summary(summary), name, spec["plot"], svgs[-1], spec["title"])
    return root, config, cells, paths, links, summary, svgs


def render(made, name: str, links) -> str:
    root, config, _cells, paths, _links, summary, svgs = made
    html = str(root / "report" / name)
    report(summary, svgs, paths, config, "c0ffee42", html, ceilings=links)
    with open(html) as f:
        return f.read()


def section(html: str, start: str) -> str:
    begin = html.index(start)
    return html[begin : html.index("</section>", begin)]


def test_the_derived_ceilings_fold_under_the_experiment_they_serve(made):
    cells, links = made[2], made[4]
    derived = {c.experiment for c in cells if c.experiment.startswith("ceilings-")}
    # compute is the `compute` experiment's; a CPU copies nothing
    assert derived == {"ceilings-loader"}
    html = render(made, "index.html", links)
    assert 'id="exp-ceilings-loader"' not in html and "no baseline" not in html
    assert "#exp-ceilings-loader" not in html  # nor in the navigation
    verdict = html[html.index('id="verdict"') : html.index('id="exp-')]
    assert "ceilings-loader" not in verdict
    train = section(html, 'id="exp-train"').replace("<wbr>", "")
    assert "Ceilings of this experiment" in train
    table = train[train.index("Ceilings of this experiment") :]
    for cell in (c for c in cells if c.experiment == "ceilings-loader"):
        assert cell.id in table
    # The compute experiment's cell is shared: named with its experiment and linked there, bounding
    # both cells.
    assert (
        '<a href="#exp-compute"><code class="id" title="compute/base">compute/base</code></a>'
        in table
    )
    rows = table.split("<tr>")[1:]
    compute_row = next(r for r in rows if "compute/base" in r)
    assert (
        "num_workers=0, num_workers=1" in compute_row
        and "2/2" in compute_row
        and "samples/s" in compute_row
    )
    loader_rows = [r for r in rows if "<td>loader</td>" in r]
    assert {("num_workers=0" in r, "num_workers=1" in r) for r in loader_rows} == {
        (True, False),
        (False, True),
    }
    assert 'id="exp-compute"' in html and "Ceilings of this experiment" not in section(
        html, 'id="exp-compute"'
    )


def test_without_the_map_the_derived_ceilings_fold_under_the_experiments_that_asked(made):
    html = render(made, "nomap.html", None)
    assert 'id="exp-ceilings-loader"' not in html and "no baseline" not in html
    train = section(html, 'id="exp-train"').replace("<wbr>", "")
    loader_ids = [c.id for c in made[2] if c.experiment == "ceilings-loader"]
    assert all(cell in train for cell in loader_ids)
    # only the map knows which experiment's cells serve as ceilings
    assert "compute/base" not in train


@needs_chromium
@pytest.mark.parametrize("width", [1280, 390])
def test_the_folded_ceilings_fit_a_laptop_and_a_phone(made, width):
    render(made, "fit.html", made[4])
    page = inspect(
        str(made[0] / "report" / "fit.html"),
        os.path.join(ARTIFACTS, f"served-{width}.png"),
        width=width,
    )
    assert_fits(page, f"report with folded ceilings at {width} px", width)


def test_a_transfer_probe_planned_for_device_auto_is_not_shown_for_cells_that_ran_on_the_cpu(made):
    # With `device: auto` the plan gives every training cell a transfer probe; a cell that ran on a
    # CPU copies nothing (its summary row has no copy term), so the probe bounds none of them and is
    # not listed as their ceiling.
    links = {cell: {**bounds, "transfer": "transfer/base"} for cell, bounds in made[4].items()}
    train = section(render(made, "auto.html", links), 'id="exp-train"')
    assert (
        "<td>loader</td>" in train
        and "<td>compute</td>" in train
        and "<td>transfer</td>" not in train
    )
