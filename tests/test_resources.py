"""feedbench.resources: a cell's resources from its knobs, for the rules and the launcher alike."""

from __future__ import annotations

import subprocess
import sys

import pytest
from feedbench import resources
from feedbench.cell import parse_cell

DDP_2X2 = {"parallel": "ddp", "gpus_per_node": 2, "nodes": 2, "num_workers": 2, "device": "auto"}


def test_the_module_imports_no_torch():
    # The Snakefile imports it on every parse, where torch may be missing or slow to load.
    code = "import sys, feedbench.resources; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_mapping_takes_the_harness_defaults_for_missing_knobs():
    assert resources.ranks({}) == 1
    assert resources.threads({}) == 1 and resources.cpus_per_task({}) == 1
    assert resources.gpus({}) == 1  # device auto, one GPU per node, one node
    assert resources.mem_mb({}) == 2048


def test_a_mapping_and_the_harness_cell_give_the_same_resources():
    cell = parse_cell(dict(DDP_2X2, scenario="train", dataset="memory", model="mlp"))
    for name in ("ranks", "nodes", "threads", "mem_mb", "cpus_per_task", "gpus", "tasks", "tasks_per_node", "mpi"):
        assert getattr(resources, name)(cell) == getattr(resources, name)(DDP_2X2), name


@pytest.mark.parametrize(
    "knobs, expected",
    [
        # one process: the whole cell is one task of threads CPUs
        ({"num_workers": 3}, dict(ranks=1, threads=4, cpus_per_task=4, tasks=1, tasks_per_node=0, mpi="", gpus=1)),
        # dp: one process drives both GPUs
        (
            {"parallel": "dp", "gpus_per_node": 2, "num_workers": 1},
            dict(ranks=1, threads=4, cpus_per_task=4, tasks=1, tasks_per_node=0, mpi="", gpus=2),
        ),
        # ddp, one GPU per node over 2 nodes: --ntasks=2
        (
            {"parallel": "ddp", "nodes": 2, "num_workers": 1},
            dict(ranks=2, threads=2, cpus_per_task=2, tasks=2, tasks_per_node=0, mpi="srun", gpus=2),
        ),
        # ddp 2 GPUs x 2 nodes: --ntasks-per-node=2, so no node gets 3 of the 4 ranks
        (DDP_2X2, dict(ranks=4, threads=6, cpus_per_task=3, tasks=0, tasks_per_node=2, mpi="srun", gpus=4)),
        # no GPUs on a cpu cell, however many "GPUs" (gloo processes) per node
        (
            {"parallel": "ddp", "gpus_per_node": 2, "device": "cpu"},
            dict(ranks=2, threads=2, cpus_per_task=1, tasks=0, tasks_per_node=2, mpi="srun", gpus=0),
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
