"""The command examples through real Snakemake (examples/plain-loop, lightning, hf-trainer): each
script run as it is, in its own loop (a plain loop, Lightning's Trainer.fit, Hugging Face's
Trainer), over a num_workers matrix, to one report; and a command with a typo in its own arguments
stopped by its preflight in one line, with no bench job."""

from __future__ import annotations

import csv
import os
import shutil

import pytest
import yaml
from conftest import ROOT
from helpers.snakemake_run import copy_workflow, run_snakemake

pytestmark = [
    pytest.mark.slow,  # one real Snakemake run: 3 preflights, 6 cells, a plain run, a typo
    pytest.mark.xdist_group("command_examples"),  # one worker: that run is a module fixture
]

EXAMPLES = ("plain-loop", "lightning", "hf-trainer")
STEPS, WARMUP = 5, 3


def example_experiment(project) -> tuple[str, dict]:
    """An example's experiment as its config.yaml has it, shrunk: a window of STEPS after WARMUP,
    its command as long (the whole command is measured), the baseline's plain run for fidelity
    kept for the plain loop alone."""
    config = yaml.safe_load((project / "config.yaml").read_text())
    ((name, experiment),) = config["experiments"].items()
    base = experiment["base"]
    base["command"] = base["command"].replace("--max-steps 25", f"--max-steps {STEPS + WARMUP}")
    base["workdir"] = str(project)
    if project.name != "plain-loop":
        base["fidelity"] = False
    return name, experiment


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    projects = tmp_path_factory.mktemp("projects")
    experiments = {}
    for example in EXAMPLES:
        project = projects / example
        shutil.copytree(os.path.join(ROOT, "examples", example), project)
        name, experiment = example_experiment(project)
        experiments[name] = experiment
    typo = dict(experiments["plain-loop"], base=dict(experiments["plain-loop"]["base"]))
    typo["base"]["command"] = typo["base"]["command"].replace("--max-steps", "--max-stpes")
    experiments["typo"] = typo
    config = {
        "defaults": {
            "repeats": 1,
            "steps": STEPS,
            "warmup_steps": WARMUP,
            "torch_threads": 1,
            "device": "cpu",
        },
        "experiments": experiments,
    }
    path = projects / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = tmp_path_factory.mktemp("run")
    done = run_snakemake(
        copy_workflow(tmp_path_factory.mktemp("workflow")), workdir, "--configfile", str(path)
    )
    return done, workdir


def summary(workdir) -> list[dict]:
    with open(workdir / "results" / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_every_examples_cells_are_measured_in_its_own_loop(run):
    done, workdir = run
    rows = {(r["experiment"], r["cell"]): r for r in summary(workdir)}
    for experiment in ("plain-loop", "lightning", "hf-trainer"):
        for workers in (0, 2):
            row = rows[(experiment, f"num_workers-{workers}")]
            assert row["status"] == "ok", row["error_message"]
            assert float(row["workers_in_window"]) == workers
            assert float(row["asked_num_workers"]) == 0
            assert row["training_loader"].split(" in ")[1] in ("main", "train_dataloader")
    # the plain loop's baseline ran the command plain, then instrumented, both whole
    baseline = rows[("plain-loop", "num_workers-0")]
    assert float(baseline["fidelity_ratio"]) > 0 and float(baseline["plain_samples_per_s"]) > 0


def test_the_verdict_names_lightnings_costliest_transform_and_says_which_loader(run):
    _, workdir = run
    verdict = (workdir / "results" / "report" / "verdict.txt").read_text()
    lightning = verdict.split("lightning\n")[1].split("\n\n")[0]
    assert "ColorJitter" in lightning.split("Where:")[1].splitlines()[0]
    assert "Your loop: it trains on the loader built at train.py:" in lightning
    assert "in train_dataloader" in lightning
    assert "Fidelity: run whole, start-up included" in verdict.split("plain-loop\n")[1]


def test_a_typo_in_the_commands_arguments_stops_its_experiment_in_one_line(run):
    done, workdir = run
    assert done.returncode == 1
    lines = [
        line
        for line in done.stderr.splitlines()
        if line.startswith("feedbench: experiment typo stopped by its preflight")
    ]
    assert len(lines) == 1
    assert "unrecognized arguments: --max-stpes" in lines[0]
    assert "exited with code 2 before its first training step" in lines[0]
    cells = workdir / "results" / "cells" / "typo"
    assert not list(cells.rglob("result.json"))  # no bench job of it ran
    assert list(cells.rglob("stopped.json"))
