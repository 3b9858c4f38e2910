"""examples/text-pipeline through real Snakemake: a plain train.py's classes named by import path,
with no adapter, no step and no mark, measured to a report that says whether it waits on its loader
and where."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT
from helpers.snakemake_run import copy_workflow, run_snakemake, snakemake_env

pytestmark = [
    pytest.mark.slow,  # one real Snakemake run of 2 small cells
    pytest.mark.xdist_group("text_pipeline"),  # one worker: that run is a module fixture
]

EXAMPLE = os.path.join(ROOT, "examples", "text-pipeline")


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example as a user has it (its train.py, src and data), its config shrunk to 8 steps and 2
    cells on the CPU with 1 trainer thread, run to the report."""
    project = tmp_path_factory.mktemp("project") / "text-pipeline"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    config = yaml.safe_load((project / "config.yaml").read_text())
    config["defaults"].update(steps=8, warmup_steps=2, device="cpu", torch_threads=1)
    config["experiments"]["reviews"]["matrix"]["num_workers"] = [0, 2]
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = tmp_path_factory.mktemp("run")
    run = run_snakemake(
        copy_workflow(tmp_path_factory.mktemp("workflow")),
        workdir,
        "--configfile",
        str(project / "config.yaml"),
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return project, workdir


def test_the_plain_script_trains_on_its_own(example):
    """train.py is the user's, with no feedbench in it: it runs as `python train.py`."""
    project, _ = example
    code = "".join(p.read_text() for p in project.rglob("*.py"))
    assert "import feedbench" not in code and "from feedbench" not in code
    run = subprocess.run(
        [sys.executable, str(project / "train.py"), "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "samples/s" in run.stdout


def test_the_readmes_command_ran_every_job_with_the_venv_off_path(example):
    """README "Your own pipeline in ten minutes": `.venv/bin/snakemake --configfile
    examples/text-pipeline/...` as a user who never activated the venv runs it (run_snakemake takes
    the venv off PATH): every job ran."""
    _, workdir = example
    path = [os.path.abspath(p) for p in snakemake_env()["PATH"].split(os.pathsep)]
    assert os.path.dirname(os.path.abspath(sys.executable)) not in path
    results = list((workdir / "results" / "cells").glob("*/*/rep*/result.json"))
    assert results and all(json.loads(r.read_text())["status"] == "ok" for r in results), results


def test_every_cell_ran_the_users_classes_with_adamw(example):
    _, workdir = example
    with open(workdir / "results" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    reviews = {r["cell"]: r["status"] for r in rows if r["experiment"] == "reviews"}
    assert reviews == {"num_workers-0": "ok", "num_workers-2": "ok"}
    result = json.loads(
        (
            workdir / "results" / "cells" / "reviews" / "num_workers-0" / "rep1" / "result.json"
        ).read_text()
    )
    assert (
        result["cell"]["optimizer"] == "adamw"
        and result["cell"]["model"] == "reviews.model:ReviewClassifier"
    )
    assert result["metrics"]["stall_pct"] >= 10, "the tokenizer makes the step wait on its loader"


def test_the_report_names_the_tokenizer_without_a_mark(example):
    """No Compose, no feedbench.stage span: the profile of a worker's __getitem__ names the
    tokenizer's function."""
    _, workdir = example
    report = (workdir / "results" / "report" / "index.html").read_text()
    assert "reviews.tokenizer:BPETokenizer.encode" in report, (
        "the verdict names the tokenizer's function"
    )
    result = json.loads(
        (
            workdir / "results" / "cells" / "reviews" / "num_workers-0" / "rep1" / "result.json"
        ).read_text()
    )
    # the test pins 1 thread: where the launch gives more, the report says so
    if result["launch_threads"] != 1:
        assert "ran the trainer with 1 intra-op thread(s) (knob torch_threads)" in report


def test_the_function_the_profile_named_is_cached_by_its_name_predicted_and_measured(example):
    """reviews-cache names the profile's function in the config (stage_functions), with no change to
    the code: its cache is measured, and predicted from its baseline's stage profile."""
    _, workdir = example
    with open(workdir / "results" / "summary.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["experiment"] == "reviews-cache"]
    cached = next(r for r in rows if r["cache_after"] == "BPETokenizer.encode")
    # a lookup
    assert cached["status"] == "ok" and float(cached["stage_BPETokenizer.encode_ms"]) < 0.1
    report = (workdir / "results" / "report" / "index.html").read_text()
    assert "cache_after-BPETokenizer.encode" in report and "predicted" in report


def test_the_examples_verdict_can_be_judged_or_names_what_to_rerun(example):
    """The example runs 1 repeat a cell (README, #49): a gain it cannot judge from one run says in
    plain words what to rerun to judge it, in the terminal's verdict too."""
    _, workdir = example
    text = (workdir / "results" / "report" / "verdict.txt").read_text()
    fixes = [line for line in text.splitlines() if line.startswith("  Fix: ")]
    assert fixes, text
    for line in fixes:
        assert "cannot be judged" not in line or "set repeats: 3 and rerun to judge " in line, line
