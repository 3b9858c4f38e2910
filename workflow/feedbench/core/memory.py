"""The memory a cell may use, and how fast its loader's memory grows toward it (docs/harness.md,
"Memory").

The limit is the smallest of three, each read as this process sees it:

    ram     the machine's physical memory (os.sysconf: SC_PHYS_PAGES x SC_PAGE_SIZE)
    cgroup  memory.max of its cgroup v2 and of every parent (the smallest; "max" is none), or cgroup
            v1's memory.limit_in_bytes at the hierarchy's root (Docker --memory, Kubernetes limits,
            Slurm's cgroup)
    slurm   SLURM_MEM_PER_NODE (--mem), else SLURM_MEM_PER_CPU (--mem-per-cpu) x the job's CPUs on
            this node (SLURM_CPUS_ON_NODE, else core.cores.slurm_cpus); Slurm's MB are MiB

Growth is the slope of a process's USS against the samples the loader delivered, fitted by least
squares. A worker slot's successive processes (its workers restarted at each epoch boundary without
persistent_workers) are runs of one series: each run keeps its own intercept and they share one
slope, so a restart's drop is not read as shrinking.

Plain Python (the core): the harness fits the monitor's series with it, the analysis reads its
floor, and the planner can ask the limit (issue #25: what to ask Slurm for).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from . import cgroup
from .cores import CGROUP_ROOT, slurm_cpus

MB = 2**20
# cgroup v1 says "no limit" with a page-rounded 2^63 - 1; anything this large is no limit.
NO_LIMIT = 2**60
# A fitted growth is read as growth (not a batch in flight, not noise) when it is at least this many
# MB over a process's life in the window (summed over the workers), and the fit explains at least
# GROWTH_R2 of its variance.
GROWTH_FLOOR_MB = 16.0
GROWTH_R2 = 0.5


def ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not POSIX
        return None


def _limit(text: str | None) -> int | None:
    """Bytes from memory.max ("max" or a number) or v1's memory.limit_in_bytes; None without a
    limit."""
    if not text or not text.isdigit():
        return None
    value = int(text)
    return value if 0 < value < NO_LIMIT else None


def cgroup_bytes(root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup") -> int | None:
    """The smallest memory limit of this process's cgroup and its parents (v2), or v1's at its root;
    None without."""
    limits = [_limit(text) for text in cgroup.up_the_tree("memory.max", root, proc)]
    limits.append(_limit(cgroup.read(os.path.join(root, "memory", "memory.limit_in_bytes"))))
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def slurm_bytes(env: Mapping[str, str] = os.environ) -> int | None:
    """Slurm's memory for the job on this node: --mem, else --mem-per-cpu x its CPUs here; None
    outside Slurm."""
    per_node = env.get("SLURM_MEM_PER_NODE", "")
    if per_node.isdigit() and int(per_node) > 0:
        return int(per_node) * MB
    per_cpu, on_node = env.get("SLURM_MEM_PER_CPU", ""), env.get("SLURM_CPUS_ON_NODE", "")
    cpus = int(on_node) if on_node.isdigit() else slurm_cpus(env)
    if per_cpu.isdigit() and int(per_cpu) > 0 and cpus:
        return int(per_cpu) * cpus * MB
    return None


def memory_limit(
    env: Mapping[str, str] = os.environ, root: str = CGROUP_ROOT, proc: str = "/proc/self/cgroup"
):
    """Each source's MB, the smallest of them (`limit_mb`) and which one that is (`bound_by`: ram
    when nothing narrows it); for a result."""
    sources = {"ram": ram_bytes(), "cgroup": cgroup_bytes(root, proc), "slurm": slurm_bytes(env)}
    known = {name: n for name, n in sources.items() if n is not None}
    bound_by = (
        min(known, key=lambda name: (known[name], list(sources).index(name))) if known else None
    )
    mb = {f"{name}_mb": round(n / MB, 1) if n is not None else None for name, n in sources.items()}
    return {"limit_mb": mb.get(f"{bound_by}_mb"), "bound_by": bound_by, **mb}


def fit(runs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict | None:
    """One slope (MB per sample) through runs of (samples delivered, MB), each run with its own
    intercept: the within-run least squares. With `r2`, the share of the runs' variance it explains,
    `ss`, that variance (MB^2 summed: weights to pool several fits' r2), `span`, the samples the
    runs cover (their widths summed), and `runs`, how many were fitted. None while no run spans two
    distinct sample counts."""
    sxy = sxx = syy = span = 0.0
    fitted = 0
    for xs, ys in runs:
        if len(xs) < 2:
            continue
        fitted += 1
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxy += sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
        sxx += sum((x - mx) ** 2 for x in xs)
        syy += sum((y - my) ** 2 for y in ys)
        span += max(xs) - min(xs)
    if sxx <= 0:
        return None
    slope = sxy / sxx
    r2 = slope * sxy / syy if syy > 0 else 0.0
    return {"mb_per_sample": slope, "r2": r2, "ss": syy, "span": span, "runs": fitted}


def growing(grown_mb: float | None, r2: float | None) -> bool:
    """Whether a fitted growth is growth: at least GROWTH_FLOOR_MB over the window, with a fit that
    explains it."""
    return (
        grown_mb is not None and r2 is not None and grown_mb >= GROWTH_FLOOR_MB and r2 >= GROWTH_R2
    )


def samples_to_limit(limit_mb: float | None, used_mb: float, mb_per_sample: float) -> int | None:
    """Samples until `used_mb` reaches `limit_mb` at `mb_per_sample`; 0 when already there; None
    without a limit or without growth."""
    if limit_mb is None or mb_per_sample <= 0:
        return None
    return max(int((limit_mb - used_mb) / mb_per_sample), 0)
