"""examples/own-pipeline through `snakemake --profile profiles/slurm` on the localhost Slurm
cluster.

Two cells of the example (shard counts 1 and 4, no workers, 1 repeat) so that it costs little. The
user's project sits outside the workflow and off PYTHONPATH: the jobs import it only through the
config's python_path, which must reach each Slurm job (shared filesystem: localhost here).
"""

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
from helpers.snakemake_run import copy_workflow, snakemake_env

EXAMPLE = os.path.join(ROOT, "examples", "own-pipeline")

# the session fixture slurm_cluster: one cluster per session
pytest_plugins = ["helpers.slurm_cluster"]

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CELLS = ["dataset_args.shards-1", "dataset_args.shards-4"]


@pytest.fixture(scope="module")
def run(slurm_cluster, tmp_path_factory):
    """The example, shrunk to two cells, run to the report through profiles/slurm: (workdir,
    project, process)."""
    workflow = copy_workflow(tmp_path_factory.mktemp("workflow"))
    project = tmp_path_factory.mktemp("project")
    shutil.copytree(
        os.path.join(EXAMPLE, "src"), project / "src", ignore=shutil.ignore_patterns("__pycache__")
    )
    with open(os.path.join(EXAMPLE, "config.yaml")) as f:
        config = yaml.safe_load(f)
    config["defaults"].update(steps=4, warmup_steps=1, device="cpu", repeats=1)
    config["experiments"]["shapes"]["base"].update(num_workers=0, pin_memory=False)
    config["experiments"]["shapes"]["matrix"] = {"dataset_args.shards": [1, 4]}
    del config["experiments"]["shapes-copy"]  # the transfer cell: test_own_pipeline runs it
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = tmp_path_factory.mktemp("slurm-own")
    # Jobs inherit this environment (sbatch --export=ALL): the venv's python first, and not the
    # user's project.
    env = snakemake_env(slurm_cluster.env)
    assert str(project) not in env.get("PYTHONPATH", "")
    command = [
        sys.executable, "-m", "snakemake", "-s", os.path.join(workflow, "Snakefile"), "--directory", str(workdir),  # noqa: E501
        "--configfile", str(project / "config.yaml"),
        "--profile", os.path.join(workflow, "profiles", "slurm"),
        "--default-resources", f"slurm_partition={slurm_cluster.partition}",
        f"slurm_account={slurm_cluster.account}", "runtime=10", "mem_mb=500",
        "--slurm-init-seconds-before-status-checks", "2",
        "--set-resources", "bench:mem_mb=1000",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    return workdir, project, proc


def test_the_example_completes_through_the_slurm_profile(run):
    workdir, _, proc = run
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = list(csv.DictReader(open(workdir / "results" / "summary.csv")))
    assert sorted((r["cell"], r["status"]) for r in rows) == [(cell, "ok") for cell in CELLS], rows
    assert (workdir / "results" / "report" / "index.html").exists()


def test_each_job_ran_on_slurm_with_the_users_code_from_python_path(run):
    workdir, project, proc = run
    assert proc.returncode == 0, proc.stderr[-6000:]
    for cell in CELLS:
        result = json.loads(
            (workdir / "results" / "cells" / "shapes" / cell / "rep1" / "result.json").read_text()
        )
        assert result["status"] == "ok", result["error"]
        assert result["provenance"]["slurm_job_id"]
        assert result["cell"]["dataset"] == "shapes.data:build_dataset"
        assert [f["path"] for f in result["provenance"]["user_code"]] == [str(project / "src")]
        assert result["metrics"]["samples"] > 0
    # The experiment's preflight (feedbench.core.preflight) ran first, as a Slurm job of its own,
    # and passed.
    with open(workdir / "results" / "preflight" / "shapes.json") as f:
        preflight = json.load(f)
    assert preflight["status"] == "ok" and preflight["slurm_job_id"], preflight
    assert [c["cell"] for c in preflight["checked"]] == CELLS
