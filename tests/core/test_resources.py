"""feedbench.core.resources: a cell's resources from its knobs, for the rules and the launcher
alike."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT
from feedbench.core import resources
from feedbench.core.cell import parse_cell

DDP_2X2 = {"parallel": "ddp", "gpus_per_node": 2, "nodes": 2, "num_workers": 2, "device": "auto"}


def test_the_module_imports_no_torch():
    # The Snakefile imports it on every parse, where torch may be missing or slow to load.
    code = "import sys, feedbench.core.resources; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_a_mapping_takes_the_harness_defaults_for_missing_knobs():
    assert resources.ranks({}) == 1
    # unset: Slurm takes the threads
    assert resources.threads({}) == 1 and resources.cpus_per_task({}) is None
    assert resources.gpus({}) == 1  # device auto, one GPU per node, one node
    assert resources.mem_mb({}) == 2048


def test_a_mapping_and_the_harness_cell_give_the_same_resources():
    cell = parse_cell(dict(DDP_2X2, scenario="train", dataset="memory", model="mlp"))
    for name in (
        "ranks",
        "nodes",
        "threads",
        "mem_mb",
        "cpus_per_task",
        "gpus",
        "tasks",
        "tasks_per_node",
        "mpi",
    ):
        assert getattr(resources, name)(cell) == getattr(resources, name)(DDP_2X2), name


@pytest.mark.parametrize(
    "knobs, expected",
    [
        # one process: the whole cell is one task of threads CPUs (cpus_per_task unset: the plugin
        # takes the threads)
        (
            {"num_workers": 3},
            dict(ranks=1, threads=4, cpus_per_task=None, tasks=1, tasks_per_node=0, mpi="", gpus=1),
        ),
        # dp: one process drives both GPUs
        (
            {"parallel": "dp", "gpus_per_node": 2, "num_workers": 1},
            dict(ranks=1, threads=4, cpus_per_task=None, tasks=1, tasks_per_node=0, mpi="", gpus=2),
        ),
        # ddp, one GPU per node over 2 nodes: --ntasks=2
        (
            {"parallel": "ddp", "nodes": 2, "num_workers": 1},
            dict(
                ranks=2, threads=2, cpus_per_task=2, tasks=2, tasks_per_node=0, mpi="srun", gpus=2
            ),
        ),
        # ddp 2 GPUs x 2 nodes: --ntasks-per-node=2, so no node gets 3 of the 4 ranks
        (
            DDP_2X2,
            dict(
                ranks=4, threads=6, cpus_per_task=3, tasks=0, tasks_per_node=2, mpi="srun", gpus=4
            ),
        ),
        # no GPUs on a cpu cell, however many "GPUs" (gloo processes) per node
        (
            {"parallel": "ddp", "gpus_per_node": 2, "device": "cpu"},
            dict(
                ranks=2, threads=2, cpus_per_task=1, tasks=0, tasks_per_node=2, mpi="srun", gpus=0
            ),
        ),
    ],
)
def test_resources_of_a_cell(knobs, expected):
    assert {name: getattr(resources, name)(knobs) for name in expected} == expected
    # Never --ntasks-per-gpu: Slurm refuses it beside --ntasks-per-node.
    assert resources.TASKS_PER_GPU == 0


def test_memory_counts_ranks_and_the_workers_of_the_threads_given():
    assert resources.mem_mb(DDP_2X2) == 2 * 2048 + 4 * 1024
    assert resources.mem_mb(DDP_2X2, 2) == 2 * 2048  # Snakemake capped the threads at --cores


def test_srun_options_place_gpus_per_node_tasks_on_each_node():
    assert resources.srun_options(DDP_2X2, cuda=True) == [
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--cpus-per-task=3",
        "--kill-on-bad-exit=1",
        "--gpus-per-task=1",
    ]
    assert "--gpus-per-task=1" not in resources.srun_options(DDP_2X2, cuda=False)


def test_a_cell_wider_than_a_node_is_refused_with_the_partition_and_its_cpus():
    assert resources.node_fit_error({"num_workers": 1}, node_cpus=2, partition="gpu") is None
    error = resources.node_fit_error({"num_workers": 2}, node_cpus=2, partition="gpu")
    assert error == (
        "asks for 3 CPUs per node (1 rank(s) x (num_workers 2 + 1)); "
        "allowed: at most 2, the CPUs of a node in Slurm partition 'gpu' (sinfo)"
    )
    assert "6 CPUs per node" in resources.node_fit_error(DDP_2X2, node_cpus=4, partition="debug")


def planned(tmp_path, matrix: dict) -> dict[str, dict[str, str]]:
    """cell -> the resources (and threads) a dry run gives its bench job, as Snakemake prints
    them."""
    config = {
        "defaults": {"repeats": 1, "steps": 2, "device": "cpu"},
        "experiments": {
            "x": {
                "base": {"scenario": "train", "dataset": "memory", "model": "mlp"},
                "matrix": matrix,
            }
        },
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        os.path.join(ROOT, "Snakefile"),
        "--directory",
        str(tmp_path),
    ]
    command += ["--configfile", str(tmp_path / "config.yaml"), "--cores", "16", "--dry-run"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    jobs, cell = {}, None
    for line in (line.strip() for line in run.stdout.splitlines()):
        if line.startswith("rule "):
            cell = None
        elif line.startswith("wildcards:") and "cell=" in line:
            cell = line.split("cell=")[1].split(",")[0]
            jobs[cell] = {}
        elif cell and line.startswith("threads:"):
            jobs[cell]["threads"] = line.split(":", 1)[1].strip()
        elif cell and line.startswith("resources:"):
            jobs[cell].update(
                item.split("=", 1) for item in line.split(":", 1)[1].strip().split(", ")
            )
    return jobs


def test_the_bench_rule_gives_one_process_cells_no_slurm_task_resources(tmp_path):
    """Resources every cell of the run shares are constants of the rule (cheap at 10,000 cells); the
    threads vary."""
    jobs = planned(tmp_path, {"num_workers": [0, 3]})
    assert set(jobs) == {"num_workers-0", "num_workers-3"}
    assert jobs["num_workers-3"]["threads"] == "4" and jobs["num_workers-3"]["mem_mb"] == str(
        2048 + 3 * 1024
    )
    for job in jobs.values():
        assert "cpus_per_task" not in job  # unset: the Slurm plugin asks for the job's threads
        assert (job["gpu"], job["nodes"], job["tasks"], job["tasks_per_node"], job["mpi"]) == (
            "0",
            "1",
            "1",
            "0",
            "",
        )


def test_the_bench_rule_gives_each_cell_its_own_resources_in_a_mixed_run(tmp_path):
    jobs = planned(tmp_path, {"parallel": ["dp", "ddp"], "gpus_per_node": [2], "num_workers": [1]})
    # one process driving 2 "GPUs", and 2 ranks
    one, ddp = (
        jobs["gpus_per_node-2_num_workers-1_parallel-dp"],
        jobs["gpus_per_node-2_num_workers-1_parallel-ddp"],
    )
    assert "cpus_per_task" not in one and (one["threads"], one["tasks"], one["mpi"]) == (
        "4",
        "1",
        "",
    )
    assert (
        ddp["threads"],
        ddp["cpus_per_task"],
        ddp["tasks"],
        ddp["tasks_per_node"],
        ddp["mpi"],
    ) == (
        "4",
        "2",
        "0",
        "2",
        "srun",
    )
