"""examples/own-pipeline through real Snakemake: the user's shards, collate, CNN and step, to a
report with a verdict (#11)."""

from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import sys

import pytest
import yaml
from conftest import ROOT
from feedbench.core.fit import cuda_possible
from helpers.snakemake_run import copy_workflow, run_snakemake, snakemake_env

pytestmark = [
    pytest.mark.slow,  # one real Snakemake run of 8 small cells and a transfer probe
    pytest.mark.xdist_group("own_pipeline"),  # one worker: that run is a module fixture
]

EXAMPLE = os.path.join(ROOT, "examples", "own-pipeline")


def snakemake(workflow, workdir, configfile, *args):
    return run_snakemake(workflow, workdir, "--configfile", str(configfile), *args)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example's config (shrunk to 6 steps, device cpu) beside a copy of its project, run to the
    report."""
    workflow = copy_workflow(tmp_path_factory.mktemp("workflow"))
    project = tmp_path_factory.mktemp("project")
    shutil.copytree(
        os.path.join(EXAMPLE, "src"), project / "src", ignore=shutil.ignore_patterns("__pycache__")
    )
    with open(os.path.join(EXAMPLE, "config.yaml")) as f:
        config = yaml.safe_load(f)
    config["defaults"].update(steps=6, warmup_steps=1, device="cpu")
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = tmp_path_factory.mktemp("run")
    run = snakemake(workflow, workdir, project / "config.yaml")
    assert run.returncode == 0, run.stderr[-4000:]
    return workflow, workdir, project, run


def test_every_cell_measured_and_named_by_its_axes(example):
    _, workdir, _, _ = example
    with open(workdir / "results" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert all(r["status"] == "ok" for r in rows), rows
    assert {r["cell"] for r in rows if r["experiment"] == "shapes"} == {
        f"num_workers-{w}_pin_memory-{p}_dataset_args.shards-{s}"
        for w in (0, 2)
        for p in ("false", "true")
        for s in (1, 4)
    }


def test_pinned_cells_take_their_twins_results_on_a_machine_without_cuda(example):
    """pin_memory does nothing without CUDA, so each pinned cell's job took the result of its
    unpinned twin (feedbench.plan.twins) instead of measuring the same loader again."""
    if cuda_possible():
        pytest.skip("this machine may have CUDA: every cell is measured")
    _, workdir, _, _ = example
    with open(workdir / "results" / "summary.csv") as f:
        rows = {
            (r["cell"], r["repeat"]): r for r in csv.DictReader(f) if r["experiment"] == "shapes"
        }
    pinned = [key for key in rows if "pin_memory-true" in key[0]]
    assert len(pinned) == 4, rows.keys()
    for cell, repeat in pinned:
        twin = cell.replace("pin_memory-true", "pin_memory-false")
        assert rows[(cell, repeat)]["adjustments"].endswith(
            f"not measured again: cell {twin} runs alike here, on the CPU, so its result "
            "stands for this cell"
        ), rows[(cell, repeat)]["adjustments"]
        assert rows[(cell, repeat)]["samples_per_s"] == rows[(twin, repeat)]["samples_per_s"]


def test_every_job_ran_though_path_lacks_the_venv(example):
    """The README's command, `.venv/bin/snakemake --configfile ...`, with the venv off PATH
    (run_snakemake: as a user who never activated it has): every job ran the workflow's Python, not
    the first `python` on PATH."""
    _, workdir, _, _ = example
    path = snakemake_env()["PATH"].split(os.pathsep)
    assert os.path.dirname(os.path.abspath(sys.executable)) not in [
        os.path.abspath(p) for p in path
    ]
    results = list((workdir / "results" / "cells").glob("*/*/rep*/result.json"))
    assert len(results) >= 9, results  # 8 cells and the transfer probe
    statuses = {str(r.relative_to(workdir)): json.loads(r.read_text())["status"] for r in results}
    assert set(statuses.values()) == {"ok"}, statuses


def test_the_transfer_cell_times_a_real_batch_of_the_users_collate(example):
    _, workdir, _, _ = example
    with open(workdir / "results" / "cells" / "shapes-copy" / "base" / "rep1" / "result.json") as f:
        result = json.load(f)
    assert result["status"] == "ok", result["error"]
    user = result["metrics"]["transfer"]["user_batch"]
    assert (
        user["structure"] == "dict of 2 tensors"
        and user["to_device"] == "feedbench.harness.batches:move_batch"
    )
    # float images, int64 labels
    assert user["by_pinning"][0]["bytes"] == 16 * 3 * 56 * 56 * 4 + 16 * 8
    assert any(
        a.startswith("transfer: also timed a real batch (dict of 2 tensors, ")
        and "from dataset shapes.data:build_dataset and collate shapes.data:collate" in a
        for a in result["adjustments"]
    ), result["adjustments"]


def test_the_report_verdict_names_the_bound(example):
    _, workdir, _, _ = example
    html = (workdir / "results" / "report" / "index.html").read_text()
    verdict = html.split('id="verdict"', 1)[1].split("</section>", 1)[0]
    assert re.search(r"\b(data|transfer|compute)\b", verdict), verdict[:2000]


def test_the_runs_end_prints_each_experiments_verdict(example):
    """The report's three lines per experiment, as text beside it and in the terminal at the run's
    end: a user on a machine with no browser reads them there."""
    _, workdir, _, run = example
    text = (workdir / "results" / "report" / "verdict.txt").read_text()
    assert f"feedbench: the verdict (results/report/index.html):\n{text}" in run.stdout
    shapes = text.split("\n")[:4]
    assert shapes[0] == "shapes" and [line.split(":")[0] for line in shapes[1:]] == [
        "  Finding",
        "  Where",
        "  Fix",
    ]
    # The page's text without its tags: the glossary links a term's first use ("waits for data")
    # inside the line.
    page = html.unescape(
        re.sub(r"<[^>]+>", "", (workdir / "results" / "report" / "index.html").read_text())
    )
    assert shapes[1].removeprefix("  Finding: ") in page  # the report's own line, word for word


def test_a_change_to_the_users_code_reruns_its_preflights_then_its_cells(example):
    """The experiments' preflights (feedbench.core.preflight) run again first: their cells are
    planned once they pass, and then every cell runs again."""
    workflow, workdir, project, _ = example
    assert (
        "Nothing to be done"
        in snakemake(workflow, workdir, project / "config.yaml", "--dry-run").stdout
    )
    with open(project / "src" / "shapes" / "train.py", "a") as f:
        f.write("\n# edited\n")
    dry = snakemake(workflow, workdir, project / "config.yaml", "--dry-run")
    assert set(re.findall(r"output: results/preflight/(\S+)\.json", dry.stdout)) == {
        "shapes",
        "shapes-copy",
    }
    assert "results/cells/" not in dry.stdout, dry.stdout[-3000:]
    preflights = ["results/preflight/shapes.json", "results/preflight/shapes-copy.json"]
    ran = run_snakemake(
        workflow, workdir, *preflights, "--configfile", str(project / "config.yaml")
    )
    assert ran.returncode == 0, ran.stderr[-4000:]
    dry = snakemake(workflow, workdir, project / "config.yaml", "--dry-run")
    assert len(set(re.findall(r"output: results/cells/(\S+)/result\.json", dry.stdout))) == 9, (
        dry.stdout[-3000:]
    )


def test_a_target_that_does_not_import_stops_before_any_job(example, tmp_path):
    workflow, _, project, _ = example
    config = yaml.safe_load((project / "config.yaml").read_text())
    config["experiments"]["shapes"]["base"]["dataset"] = "myproj.data:build_dataset"
    (project / "bad.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = snakemake(workflow, tmp_path, project / "bad.yaml")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert (
        "bad config: experiments.shapes.base.dataset: cannot import 'myproj.data:build_dataset' "
        "(ModuleNotFoundError: No module named 'myproj')"
    ) in run.stderr
    assert not (tmp_path / "results").exists()
