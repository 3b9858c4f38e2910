"""The cores this process may use: the fewest of its affinity mask, its cgroup's CPU quota and
Slurm's CPUs.

os.cpu_count() is the machine's; a container or a Slurm job gets fewer, and loader workers beyond
them wait for a core instead of loading (pytorch-caney #44: a "slow Lustre" that was Slurm giving
the workers no CPUs). Each source is read as this process sees it:

    affinity  os.sched_getaffinity(0): the CPUs the scheduler may run it on (taskset, Slurm's
              task/affinity, Docker --cpuset-cpus)
    cgroup    cpu.max of its cgroup v2 and of every parent (quota / period, the smallest), or cgroup
              v1's cpu.cfs_quota_us / cpu.cfs_period_us (Docker --cpus, Kubernetes limits): a share
              of time, not CPUs, rounded down to whole cores (at least 1)
    slurm     SLURM_CPUS_PER_TASK (a rank and its workers), else SLURM_CPUS_ON_NODE (the job's CPUs
              on this node)

Plain Python (the core): the job records it in its result's provenance (harness.provenance).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from . import cgroup
from .metrics import median_of_known
from .shm import loaders

CGROUP_ROOT = cgroup.ROOT


def affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def _quota(text: str) -> float | None:
    """Cores from cgroup v2's cpu.max ("max 100000" or "200000 100000"); None without a limit."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    quota, period = int(parts[0]), int(parts[1]) if len(parts) > 1 else 100_000
    return quota / period if quota > 0 and period > 0 else None  # cgroup v1 says -1 for no limit


def cgroup_cores(root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> float | None:
    """The smallest CPU quota (in cores) of this process's cgroup and its parents; None without
    one."""
    limits = [_quota(text) if text else None for text in cgroup.up_the_tree("cpu.max", root, proc)]
    v1_quota, v1_period = (
        cgroup.read(os.path.join(root, "cpu", "cpu.cfs_quota_us")),
        cgroup.read(os.path.join(root, "cpu", "cpu.cfs_period_us")),
    )
    if v1_quota and v1_period:
        limits.append(_quota(f"{v1_quota} {v1_period}"))
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def slurm_cpus(env: Mapping[str, str] = os.environ) -> int | None:
    """Slurm's CPUs for this task (SLURM_CPUS_PER_TASK), else for the job on this node
    (SLURM_CPUS_ON_NODE)."""
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def usable_cores(
    env: Mapping[str, str] = os.environ, root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup"
):
    """Each source's cores, the fewest of them (`usable`) and which one that is (`bound_by`: machine
    when nothing narrows it); for a result."""
    cgroup = cgroup_cores(root, proc)
    sources = {
        "machine": os.cpu_count(),
        "affinity": affinity(),
        "cgroup": max(1, math.floor(cgroup)) if cgroup is not None else None,
        "slurm": slurm_cpus(env),
    }
    known = {name: n for name, n in sources.items() if n is not None}
    bound_by = (
        min(known, key=lambda name: (known[name], list(sources).index(name))) if known else None
    )
    return {"usable": known.get(bound_by), "bound_by": bound_by, **sources, "cgroup_quota": cgroup}


# The one threshold that names a cell's loader workers CPU-bound: runnable (on a core, or waiting in
# the run queue for one) in at least this share of the monitor's samples, the median worker. Below
# it they mostly wait: on storage, a network, a sleep, or a full prefetch queue. The runnable share,
# not the CPU share, decides: three CPU-bound workers on one core each get a third of its time (CPU
# share 0.33) and are runnable all of it (harness.monitor).
CPU_BOUND_SHARE = 0.5
KINDS = {True: "CPU-bound", False: "waiting"}
# Workers that mostly wait (a full prefetch queue) still crowd the cores by the CPU they use: a cell
# is oversubscribed when that CPU and its trainer's cores exceed its usable cores by this many. The
# Lightning job of issue #49 (2 workers beside a trainer of 2 threads on 2 cores, its workers
# waiting on a full queue) measured half its 0-worker rate; 8 sleeping workers at 2 % of a core
# each beside a main process on 1 core take 0.16, which crowds nothing.
CROWDED_CORES = 0.5


def ranks_sharing(knobs, env: Mapping[str, str] = os.environ) -> int:
    """The cell's ranks that share this process's usable cores: one where Slurm gives each task its
    own CPUs (SLURM_CPUS_PER_TASK), else every rank on this host (as core.shm counts its
    loaders)."""
    if env.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return 1
    return loaders(knobs, local="SLURM_JOB_ID" not in env)[0]


def trainer_cores(scenario: str, device: str, torch_threads: int | None) -> int:
    """The cores a rank's trainer asks for: its intra-op threads where its model computes on the CPU
    (a train cell on device cpu), else 1, its main process (a loader cell does not compute; on a GPU
    the threads mostly wait)."""
    return max(torch_threads or 1, 1) if scenario == "train" and device == "cpu" else 1


def cpu_load(
    workers: list[dict], usable: int | None, ranks: int, num_workers: int, trainer: int = 1
) -> dict | None:
    """A cell's CPU demand against its usable cores, for its result's `cpu`: the cores it asks for
    (ranks x (workers + the trainer's cores, trainer_cores)), the median worker's CPU and runnable
    shares, which kind its workers are (KINDS, by CPU_BOUND_SHARE) and whether it is oversubscribed
    (crowded). None without loader workers; kind and oversubscribed None when no worker was
    sampled."""
    if num_workers == 0:
        return None
    runnable = median_of_known([w.get("runnable_share") for w in workers])
    cpu = median_of_known([w.get("cpu_share") for w in workers])
    bound = None if runnable is None else runnable >= CPU_BOUND_SHARE
    demand = ranks * (num_workers + trainer)
    return {
        "demand_cores": demand,
        "usable_cores": usable,
        "trainer_cores": trainer,
        "cpu_share": cpu,
        "runnable_share": runnable,
        "kind": None if bound is None else KINDS[bound],
        "oversubscribed": crowded(demand, usable, runnable, cpu, num_workers, trainer),
    }


def crowded(demand, usable, runnable, cpu_share, workers: int, trainer: int) -> bool | None:
    """Whether a cell is oversubscribed: it asks for more cores than it may use (`demand`, ranks x
    (workers + the trainer's cores)), and its workers are CPU-bound (the median one `runnable` at
    least CPU_BOUND_SHARE) or the CPU they use (`cpu_share` each, in cores) beside the trainer's
    cores exceeds it by CROWDED_CORES: workers that wait on a full queue still take a trainer's
    thread's core while they work. None where it cannot tell (no worker sampled, no usable
    count)."""
    if usable is None or demand is None or (runnable is None and cpu_share is None):
        return None
    if demand <= usable:
        return False
    if runnable is not None and runnable >= CPU_BOUND_SHARE:
        return True
    ranks = demand / (workers + trainer) if workers + trainer else 1
    used = None if cpu_share is None else ranks * (workers * cpu_share + trainer)
    return used is not None and used - usable >= CROWDED_CORES


def most_workers(usable: int, ranks: int, trainer: int = 1) -> int:
    """The most loader workers per rank whose cell does not ask for more than `usable` cores
    (cpu_load's demand)."""
    return max(usable // ranks - trainer, 0)
