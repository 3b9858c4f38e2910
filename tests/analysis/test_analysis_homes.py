"""One home per rule: the baseline travels from the matrix to the summary, one PHASES, names that
say what they hold."""

from __future__ import annotations

import ast
import json
import os

import feedbench
import yaml
from feedbench.analysis import report, verdict
from feedbench.analysis.aggregate import load_results, read_summary, result_row, write_summary
from feedbench.core.metrics import CLOCKED_PHASES, PHASES
from feedbench.core.records import record_of
from feedbench.harness import loop as harness
from feedbench.harness import provenance
from feedbench.harness.runner import run
from feedbench.plan import matrix

PACKAGE = os.path.dirname(os.path.abspath(feedbench.__file__))
CONFIG = {
    "defaults": {
        "steps": 4,
        "warmup_steps": 1,
        "monitor_interval_s": 0.05,
        "torch_threads": 1,
        "device": "cpu",
    },
    "experiments": {
        "workers": {
            "base": {
                "scenario": "loader",
                "model": "none",
                "image_size": 16,
                "batch_size": 16,
                "num_samples": 64,
            },
            # The baseline is the first level of every axis, whichever order the levels are written
            # in.
            "matrix": {"num_workers": [1, 0]},
        }
    },
}


def test_the_baseline_travels_from_the_matrix_to_the_summary(tmp_path):
    """matrix marks it -> cell.yaml (as the bench rule writes it) -> result.json -> summary column
    -> verdict."""
    cells = matrix.build_cells(CONFIG)
    paths = []
    for cell in cells:
        out = tmp_path / "cells" / cell.experiment / cell.id / "rep1"
        # the rule's printf of params.cell, read back
        cell_yaml = yaml.safe_load(json.dumps(cell.labelled(1)))
        assert cell_yaml["baseline"] is cell.baseline
        run(cell_yaml, str(out))
        paths.append(str(out / "result.json"))
    with open(paths[0]) as f:
        assert json.load(f)["cell"]["baseline"] is True
    write_summary(load_results(paths), str(tmp_path / "summary.csv"))
    summary = read_summary(str(tmp_path / "summary.csv"))
    assert dict(zip(summary["cell"], summary["baseline"], strict=True)) == {
        "num_workers-1": True,
        "num_workers-0": False,
    }
    found = verdict.summarize_experiment(summary, CONFIG["experiments"]["workers"]["matrix"])
    assert found["baseline"]["cell"] == matrix.baseline(cells, "workers").id == "num_workers-1"
    assert found["speedup"] is not None and found["note"] is None


def test_an_old_result_without_the_label_still_aggregates(tmp_path):
    """A result.json from before the label: the row is there, its baseline empty (unknown), and the
    verdict says why."""
    out = tmp_path / "cells" / "old" / "base" / "rep1"
    run(
        {
            "scenario": "loader",
            "model": "none",
            "image_size": 16,
            "batch_size": 16,
            "num_samples": 64,
            "steps": 3,
            "warmup_steps": 1,
            "torch_threads": 1,
            "device": "cpu",
            "experiment": "old",
            "cell": "base",
            "repeat": 1,
        },
        str(out),
    )
    with open(out / "result.json") as f:
        result = json.load(f)
    assert result["cell"]["baseline"] is None and result["status"] == "ok"
    row = result_row(record_of(result, str(out / "result.json")))
    assert row["baseline"] is None and row["samples_per_s"] > 0
    found = verdict.summarize_experiment(load_results([str(out / "result.json")]))
    assert (
        found["best"]["cell"] == "base"
        and found["speedup"] is None
        and "written before" in found["note"]
    )


def assigned_names(path: str) -> set[str]:
    with open(path) as f:
        tree = ast.parse(f.read())
    assigns = [node for node in ast.walk(tree) if isinstance(node, ast.Assign)]
    return {t.id for node in assigns for t in node.targets if isinstance(t, ast.Name)}


def test_phases_are_defined_once():
    homes = [
        os.path.relpath(os.path.join(folder, name), PACKAGE)
        for folder, _, names in os.walk(PACKAGE)
        for name in names
        if name.endswith(".py") and "PHASES" in assigned_names(os.path.join(folder, name))
    ]
    assert homes == [os.path.join("core", "metrics.py")]
    # The harness's per-scenario mapping is derived from the one tuple, in its order.
    for phases in harness.PHASES_OF.values():
        assert list(phases) == [p for p in CLOCKED_PHASES if p in phases] and set(phases) <= set(
            PHASES
        )
    row = result_row(record_of({"status": "ok", "metrics": {"phases": {}}}, "result.json"))
    assert all(f"{p}_ms" in row and f"{p}_share" in row for p in PHASES)


def test_names_say_what_they_hold():
    assert callable(provenance.machine_facts) and not hasattr(provenance, "provenance")
    assert callable(report.provenance_table) and not hasattr(report, "provenance")
    assert report.verdict is verdict and not hasattr(report, "analysis")
