"""The workflow through `snakemake --profile profiles/slurm` on the localhost Slurm cluster.

The shipped profile, with only what a site would change given on the command
line (partition, account, a short status interval). Every cell must reach the
cluster through sbatch, which accounting (sacct) shows, and the run must end
with the summary and the report.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from helpers.cells import tiny_mlp_base
from helpers.slurm_cluster import submitted_bench_jobs
from helpers.snakemake_run import copy_workflow, snakemake_env

# the session fixture slurm_cluster: one cluster per session
pytest_plugins = ["helpers.slurm_cluster"]

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TINY = {
    "defaults": {"repeats": 1, "steps": 3, "warmup_steps": 1, "device": "cpu"},
    "experiments": {
        "mlp": {
            "title": "A tiny mlp on the Slurm cluster",
            "base": tiny_mlp_base(),
            "matrix": {"hidden_layers": [1, 2]},
            "plot": {"x": "hidden_layers", "kind": "bar"},
        },
        "ddp": {
            # device auto: the job asks Slurm for the 4 (fake) GPUs, 2 per node, and the ranks run
            # on gloo.
            "title": "ddp with 2 GPUs x 2 nodes",
            "base": tiny_mlp_base(
                num_samples=64,
                parallel="ddp",
                gpus_per_node=2,
                nodes=2,
                comm_probe_steps=2,
                device="auto",
            ),
            "plot": {"x": "nodes", "kind": "bar"},
        },
    },
}
CELLS = [("ddp", "base"), ("mlp", "hidden_layers-1"), ("mlp", "hidden_layers-2")]


@pytest.fixture(scope="module")
def run(slurm_cluster, tmp_path_factory):
    """The tiny matrix run to the report through profiles/slurm; (workdir, snakemake's process)."""
    workflow = copy_workflow(tmp_path_factory.mktemp("workflow"))
    workdir = tmp_path_factory.mktemp("slurm-run")
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(TINY, sort_keys=False))
    # Jobs inherit this environment (sbatch --export=ALL): the venv's python first.
    env = snakemake_env(slurm_cluster.env)
    command = [
        sys.executable, "-m", "snakemake", "-s", os.path.join(workflow, "Snakefile"), "--directory", str(workdir),  # noqa: E501
        "--configfile", str(config),
        "--profile", os.path.join(workflow, "profiles", "slurm"),
        # What a site adapts, on the command line (it replaces the profile's default-resources).
        "--default-resources", f"slurm_partition={slurm_cluster.partition}", f"slurm_account={slurm_cluster.account}",  # noqa: E501
        "runtime=10", "mem_mb=500",
        "--slurm-init-seconds-before-status-checks", "2",
        # The test nodes have 4000 MB: less than the 2 GiB per rank a bench job asks for by default.
        # Their GPUs are typed, as on the cluster: every cell names the model
        # (--gpus=tesla:N).
        "--set-resources", "bench:mem_mb=1000", "bench:gpu_model=tesla",
        "--slurm-keep-successful-logs",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    return workdir, proc


def test_workflow_completes_through_the_slurm_profile(run):
    workdir, proc = run
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = list(csv.DictReader(open(workdir / "results" / "summary.csv")))
    assert sorted((r["experiment"], r["cell"], r["status"]) for r in rows) == [
        (e, cell, "ok") for e, cell in CELLS
    ]
    html = (workdir / "results" / "report" / "index.html").read_text()
    assert "A tiny mlp on the Slurm cluster" in html


def test_ddp_cell_ran_four_ranks_on_two_nodes_through_srun(run):
    workdir, proc = run
    result = json.loads(
        (workdir / "results" / "cells" / "ddp" / "base" / "rep1" / "result.json").read_text()
    )
    assert result["status"] == "ok", result["error"]
    ranks = result["metrics"]["ranks"]
    assert [(r["rank"], r["node"]) for r in ranks] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert result["provenance"]["slurm_job_id"]
    assert (workdir / "results" / "cells" / "ddp" / "base" / "rep1" / "ranks" / "srun.log").exists()


def test_every_cell_went_through_sbatch(slurm_cluster, run):
    workdir, proc = run
    assert proc.returncode == 0, proc.stderr[-6000:]
    # The plugin names every job of a run after the run's id, and logs each job's id with its
    # wildcards.
    [run_id] = {
        line.split("SLURM run ID: ")[1].strip()
        for line in proc.stderr.splitlines()
        if "SLURM run ID: " in line
    }
    submitted = submitted_bench_jobs(proc.stderr)
    assert sorted(submitted) == sorted(f"{e}_{cell}_1" for e, cell in CELLS), proc.stderr[-6000:]
    named = slurm_cluster.run(
        "sacct", "-n", "-P", "-X", "--starttime", "now-1days", "--name", run_id, "-o", "JobIDRaw"
    )
    # The rest of the matrix (aggregate, plots, report) is light: localrules, no cluster jobs.
    assert sorted(named.stdout.split()) == sorted(submitted.values()), named.stdout
    jobs = slurm_cluster.jobs(submitted.values(), "State,Submit,End,AllocTRES")
    assert {job["State"] for job in jobs.values()} == {"COMPLETED"}, jobs
    bench = list(jobs.values())
    # The 2-GPU x 2-node ddp cell got its 4 GPUs (issue #9: --ntasks-per-gpu beside
    # --ntasks-per-node was refused).
    ddp = jobs[submitted["ddp_base_1"]]
    assert "gres/gpu=4" in ddp["AllocTRES"].split(","), ddp
    # Cells are queued together: the workflow profile's one-cell-at-a-time
    # limit (bench_slots) counts per job on a cluster (set-resource-scopes).
    assert max(job["Submit"] for job in bench) < min(job["End"] for job in bench), bench


# A cell that would run for minutes, in jobs given one minute of runtime.
LONG = {
    "defaults": {"repeats": 1, "warmup_steps": 1, "device": "cpu"},
    "experiments": {
        "limit": {
            "title": "A cell longer than its job's runtime",
            "base": {
                "scenario": "train",
                "dataset": "memory",
                "model": "sleep",
                "input_size": 16,
                "batch_size": 8,
                "num_samples": 64,
                "steps": 3,
            },
            "matrix": {"compute_ms": [10, 1000]},
            "include": [{"compute_ms": 1000, "steps": 10000}],
        },
    },
}


@pytest.fixture(scope="module")
def timed_out(slurm_cluster, tmp_path_factory):
    """LONG through profiles/slurm with `runtime=1` (minute) for every cell: (workdir, snakemake's
    process)."""
    workflow = copy_workflow(tmp_path_factory.mktemp("workflow"))
    workdir = tmp_path_factory.mktemp("slurm-limit")
    (workdir / "config.yaml").write_text(yaml.safe_dump(LONG, sort_keys=False))
    env = snakemake_env(slurm_cluster.env)
    command = [
        sys.executable, "-m", "snakemake", "-s", os.path.join(workflow, "Snakefile"), "--directory", str(workdir),  # noqa: E501
        "--configfile", str(workdir / "config.yaml"), "--profile", os.path.join(workflow, "profiles", "slurm"),  # noqa: E501
        "--default-resources", f"slurm_partition={slurm_cluster.partition}", f"slurm_account={slurm_cluster.account}",  # noqa: E501
        "runtime=10", "mem_mb=500",
        "--slurm-init-seconds-before-status-checks", "2",
        "--set-resources", "bench:mem_mb=1000", "bench:runtime=1",
    ]  # fmt: skip
    return workdir, subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def test_a_cell_longer_than_its_job_is_recorded_failed_and_the_job_completes(
    slurm_cluster, timed_out
):
    workdir, proc = timed_out
    # The job completes, the cell failed: the run names it and exits 1.
    assert proc.returncode == 1, proc.stderr[-6000:]
    [failed] = [line for line in proc.stderr.splitlines() if line.startswith("limit / ")]
    assert failed.startswith(
        "limit / compute_ms-1000_steps-10000 (rep1): Terminated: time limit of "
    ), failed
    rows = {r["cell"]: r for r in csv.DictReader(open(workdir / "results" / "summary.csv"))}
    assert {cell: row["status"] for cell, row in rows.items()} == {
        "compute_ms-10": "ok",
        "compute_ms-1000": "ok",
        "compute_ms-1000_steps-10000": "failed",
    }
    long = rows["compute_ms-1000_steps-10000"]
    # One minute of runtime, of which Slurm and Snakemake took some: the cell stops itself a quarter
    # of its time left before the job's own end (squeue's; feedbench.plan.job.margin_s), with the
    # steps it measured.
    assert long["error_type"] == "Terminated" and re.match(
        r"time limit of \d+ s reached", long["error_message"]
    ), long
    assert int(float(long["measured_steps"])) > 5
    jobs = slurm_cluster.jobs(submitted_bench_jobs(proc.stderr).values(), "State,Timelimit")
    assert len(jobs) == 3 and {(j["State"], j["Timelimit"]) for j in jobs.values()} == {
        ("COMPLETED", "00:01:00")
    }, jobs
    assert "Failed cells" in (workdir / "results" / "report" / "index.html").read_text()
