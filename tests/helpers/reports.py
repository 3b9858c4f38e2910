"""The report rule's work on real results (helpers.real_results), in this process: for the report's
own tests and the ones that read what it shows (the browser, the stages, the Slurm records)."""

from __future__ import annotations

import json
import os

import pytest
from feedbench.analysis.aggregate import load_results, read_summary, write_summary
from feedbench.analysis.plots import plot_experiment
from feedbench.analysis.report import write_report

from helpers.real_results import EXPERIMENTS

EVIL = "<script>alert(1)</script>"


def make_report(root, paths, config, name="index.html") -> str:
    """The report rule's work on real results, the plots included."""
    summary = os.path.join(root, "summary.csv")
    write_summary(load_results(paths), summary)
    frame = read_summary(summary)
    svgs = []
    for experiment, spec in config["experiments"].items():
        svg = os.path.join(root, "plots", f"{experiment}.svg")
        plot_experiment(frame, experiment, spec["plot"], svg, spec.get("title", ""))
        svgs.append(svg)
    html = os.path.join(root, "report", name)
    write_report(summary, svgs, paths, config, "c0ffee42", html)
    with open(html) as f:
        return f.read()


def text_report(root: str, paths: list[str], config: dict) -> str:
    """The report rule's work on real results (no plots: this is about the text)."""
    summary = os.path.join(root, "summary.csv")
    write_summary(load_results(paths), summary)
    html = os.path.join(root, "index.html")
    write_report(summary, [], paths, config, "c0ffee42", html)
    with open(html) as f:
        return f.read()


@pytest.fixture(scope="module")
def config():
    # The experiment's title and a knob value carry markup: both must come out as text.
    experiments = json.loads(json.dumps(EXPERIMENTS))
    experiments["train"]["title"] = EVIL
    experiments["broken"] = {
        "title": "A dataset with a truncated JPEG",
        "base": {"dataset": "images"},
        "matrix": {"model": ["resnet18"]},
        "plot": {"x": "model", "y": "samples_per_s", "kind": "bar"},
    }
    return {"defaults": {"steps": 6, "note": EVIL}, "experiments": experiments}
