"""`target: {compute: measured, partition: P}`: the cells measured on the target's GPU (experiment
target-compute) are jobs of rule bench_target, which asks for partition P; every other cell stays
rule bench, with the profile's partition. A dry run shows the plan; one small run on the localhost
Slurm cluster shows where the jobs ran (sacct).
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
from conftest import ROOT
from helpers.slurm_cluster import GPU_PARTITION, submitted_bench_jobs
from helpers.snakemake_run import run_snakemake, snakemake_env, workflow_copy

# the session fixture slurm_cluster, for the test marked slurm
pytest_plugins = ["helpers.slurm_cluster"]

MLP = {
    "model": "mlp",
    "dataset": "memory",
    "input_size": 16,
    "width": 16,
    "batch_size": 8,
    "num_samples": 32,
}
TARGET = {
    "gpu": "H100",
    "cores_per_gpu": 2,
    "cpu_speed": 1.0,
    "compute": "measured",
    "partition": GPU_PARTITION,
}
CONFIG = {
    "defaults": {"repeats": 1, "steps": 2, "warmup_steps": 1, "device": "cpu", "torch_threads": 1},
    "target": TARGET,
    "experiments": {"w": {"base": {**MLP, "scenario": "train", "num_workers": 0}}},
}


def write_config(folder, config: dict) -> str:
    path = os.path.join(folder, "config.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path


def planned_jobs(stdout: str) -> dict[str, tuple[str, str | None, str]]:
    """experiment -> (rule, slurm_partition or None, resources) of each cell's job a dry run lists
    (one per experiment here)."""
    jobs = {}
    for block in re.split(r"^rule ", stdout, flags=re.M)[1:]:
        experiment = re.search(r"wildcards: experiment=([^,\s]+)", block)
        if experiment:
            resources = re.search(r"resources: (.*)", block)[1]
            partition = re.search(r"slurm_partition=([^,\s]+)", resources)
            jobs[experiment[1]] = (block.split(":", 1)[0], partition and partition[1], resources)
    return jobs


def test_the_targets_cells_are_planned_as_rule_bench_target_with_its_partition(tmp_path):
    # The profile's default partition, as a site gives it (profiles/slurm's default-resources).
    site = ("--dry-run", "--default-resources", "slurm_partition=debug")
    run = run_snakemake(ROOT, tmp_path, *site, "--configfile", write_config(tmp_path, CONFIG))
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    jobs = planned_jobs(run.stdout)
    assert {e: job[:2] for e, job in jobs.items()} == {
        "w": ("bench", "debug"),
        "target-compute": ("bench_target", "gpu"),
    }
    # Everything else bench asks for, bench_target asks for too: the measurement's GPU among it.
    own, measured = (
        dict(kv.split("=", 1) for kv in jobs[e][2].split(", ")) for e in ("w", "target-compute")
    )
    assert measured.pop("gpu") == "1" and own.pop("gpu") == "0", (own, measured)
    assert measured.pop("slurm_partition") == "gpu" and own.pop("slurm_partition") == "debug"
    assert measured == own, (own, measured)
    # Without a partition, bench_target asks for none of its own: the profile's default, as every
    # other cell.
    without = {**CONFIG, "target": {k: v for k, v in TARGET.items() if k != "partition"}}
    run = run_snakemake(ROOT, tmp_path, *site, "--configfile", write_config(tmp_path, without))
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    assert planned_jobs(run.stdout)["target-compute"][:2] == ("bench_target", "debug")


@pytest.mark.slurm
@pytest.mark.slow
def test_one_command_runs_the_targets_cells_on_its_partition_and_the_rest_on_the_default(
    slurm_cluster, tmp_path
):
    workflow, workdir = workflow_copy(tmp_path)
    env = snakemake_env(slurm_cluster.env)
    command = [
        sys.executable, "-m", "snakemake", "-s", os.path.join(workflow, "Snakefile"), "--directory", str(workdir),  # noqa: E501
        "--configfile", write_config(workdir, CONFIG),
        "--profile", os.path.join(workflow, "profiles", "slurm"),
        "--default-resources", f"slurm_partition={slurm_cluster.partition}", f"slurm_account={slurm_cluster.account}",  # noqa: E501
        "runtime=10", "mem_mb=500",
        "--slurm-init-seconds-before-status-checks", "2",
        # The test cluster's GPUs are typed: the measurement names the model, on a set-resources
        # line of its own rule.
        "--set-resources", "bench_target:gpu_model=tesla",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    # No GPU here: the measured compute cell fails (below), so the run names it and exits 1.
    assert proc.returncode == 1, proc.stderr[-6000:]
    [failed] = [line for line in proc.stderr.splitlines() if line.startswith("target-compute / ")]
    assert "knob 'device': value 'cuda' is not available" in failed, failed
    submitted = submitted_bench_jobs(proc.stderr)
    [measured] = [key for key in submitted if key.startswith("target-compute_")]
    assert sorted(submitted) == sorted(["w_base_1", measured]), proc.stderr[-6000:]
    jobs = slurm_cluster.jobs(submitted.values(), "Partition,State")
    where = {key: (jobs[job]["Partition"], jobs[job]["State"]) for key, job in submitted.items()}
    assert where == {"w_base_1": ("debug", "COMPLETED"), measured: (GPU_PARTITION, "COMPLETED")}, (
        where
    )
    # No GPU here: the measurement fails in one line and the run completes, the section saying so.
    rows = {r["experiment"]: r for r in csv.DictReader(open(workdir / "results" / "summary.csv"))}
    assert rows["w"]["status"] == "ok" and rows["target-compute"]["status"] == "failed", rows
    (entry,) = json.loads((workdir / "results" / "target.json").read_text())["cells"].values()
    assert entry["measured"].startswith("failed: knob 'device': value 'cuda' is not available"), (
        entry
    )
