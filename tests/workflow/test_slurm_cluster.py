"""Real jobs on the localhost Slurm cluster: what the workflow's Slurm profile relies on.

Two nodes with two fake GPUs each; every job goes through sbatch and its final
state is read back from accounting (sacct), as the executor plugin does. The
four jobs are submitted together at the start, so the one that must run out of
time (Slurm's smallest limit is a minute) overlaps the others.
"""

from __future__ import annotations

import textwrap

import pytest

# The cluster of tests/slurm/cluster.sh: two nodes, each with gres gpu:tesla:2.
NODES = ("n1", "n2")
GPUS_PER_NODE = 2

# The session fixture `slurm_cluster`, registered once for every module that asks:
# one cluster per test session.
pytest_plugins = ["helpers.slurm_cluster"]

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# Every task prints one line of the environment a distributed launch reads.
TASK_LINE = (
    'echo "task procid=$SLURM_PROCID nodeid=$SLURM_NODEID localid=$SLURM_LOCALID '
    "node=$SLURMD_NODENAME ntasks=$SLURM_NTASKS nodelist=$SLURM_JOB_NODELIST "
    'launch_ip=$SLURM_LAUNCH_NODE_IPADDR gpus=${CUDA_VISIBLE_DEVICES-unset}"'
)

JOBS = {
    "one_node": (
        ["--nodes=1", "--ntasks=1", "--time=2"],
        f"srun bash -c '{TASK_LINE}'",
    ),
    "two_nodes": (
        ["--nodes=2", "--ntasks-per-node=2", f"--gpus-per-node={GPUS_PER_NODE}", "--time=2"],
        # The rendezvous host: the first node of the allocation, as a DDP launcher finds it.
        'echo "first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"\nsrun '
        f"bash -c '{TASK_LINE}'",
    ),
    "timeout": (
        ["--nodes=1", "--ntasks=1", "--time=1"],  # minutes
        "srun sleep 600",
    ),
    "failing": (
        ["--nodes=1", "--ntasks=1", "--time=2"],
        "srun bash -c 'echo about to fail; exit 3'",
    ),
}


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    """Submit every job at once; name -> (job id, path of its output)."""
    folder = tmp_path_factory.mktemp("slurm-jobs")
    submitted = {}
    for name, (options, body) in JOBS.items():
        script = folder / f"{name}.sh"
        script.write_text("#!/bin/bash\n" + textwrap.dedent(body) + "\n")
        out = folder / f"{name}.out"
        job_id = slurm_cluster.sbatch(
            script, *options, f"--job-name={name}", f"--output={out}", f"--chdir={folder}"
        )
        submitted[name] = (job_id, out)
    return submitted


def task_lines(out) -> list[dict[str, str]]:
    """The `task key=value ...` lines of a job's output, as dicts, by rank."""
    tasks = [
        dict(field.split("=", 1) for field in line.split()[1:])
        for line in out.read_text().splitlines()
        if line.startswith("task ")
    ]
    return sorted(tasks, key=lambda t: int(t["procid"]))


def test_one_node_job_completes(slurm_cluster, jobs):
    job_id, out = jobs["one_node"]
    row = slurm_cluster.wait(job_id)
    assert row["State"] == "COMPLETED", row
    assert row["ExitCode"] == "0:0"
    [task] = task_lines(out)
    assert task["procid"] == "0" and task["ntasks"] == "1"
    assert task["node"] in NODES and row["NodeList"] == task["node"]


def test_two_node_job_gets_gpus_and_rendezvous_environment(slurm_cluster, jobs):
    job_id, out = jobs["two_nodes"]
    row = slurm_cluster.wait(job_id)
    assert row["State"] == "COMPLETED", (row, out.read_text())
    # slurmctld tells slurmdbd a job's start and end in separate messages: a job
    # over in a second can show its final state before its whole node list.
    row = slurm_cluster.wait_sacct(job_id, lambda r: r["NodeList"] == "n[1-2]", timeout=20)
    # Accounting records the GPUs the job was given: 2 per node.
    assert f"gres/gpu={2 * GPUS_PER_NODE}" in row["AllocTRES"].split(","), row["AllocTRES"]

    tasks = task_lines(out)
    assert [t["procid"] for t in tasks] == ["0", "1", "2", "3"]
    # Block distribution: ranks 0-1 on the first node, 2-3 on the second.
    assert [(t["nodeid"], t["localid"]) for t in tasks] == [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
    ]
    assert [t["node"] for t in tasks] == ["n1", "n1", "n2", "n2"]
    for t in tasks:
        assert t["ntasks"] == "4" and t["nodelist"] == "n[1-2]", t
        # Nodes are names only Slurm knows: the rendezvous address comes from Slurm.
        assert t["launch_ip"] == "127.0.0.1", t
        assert sorted(t["gpus"].split(",")) == [str(i) for i in range(GPUS_PER_NODE)], t
    assert "first_node=n1" in out.read_text()

    steps = {r["JobID"]: r for r in slurm_cluster.sacct(job_id, steps=True)}
    assert (
        steps[f"{job_id}.0"]["State"] == "COMPLETED"
        and steps[f"{job_id}.0"]["NodeList"] == "n[1-2]"
    ), steps


def test_job_past_its_time_limit_is_timeout(slurm_cluster, jobs):
    job_id, _ = jobs["timeout"]
    # One minute of limit, then slurmctld's periodic check (about 30 s) and the kill.
    row = slurm_cluster.wait(job_id, timeout=240)
    assert row["State"] == "TIMEOUT", row


def test_job_whose_task_fails_is_failed(slurm_cluster, jobs):
    job_id, out = jobs["failing"]
    row = slurm_cluster.wait(job_id)
    assert row["State"] == "FAILED", row
    assert row["ExitCode"] == "3:0", row
    assert "about to fail" in out.read_text()
