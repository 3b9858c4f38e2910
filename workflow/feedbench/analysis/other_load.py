"""Whether other work shared the CPUs the cells were measured on: the verdict's other-load sentence.

Over each cell's window the harness reads the CPU time other work took on the CPUs of its affinity
mask (harness.monitor.Offered: the summary's `other_load_cores`, in cores, beside
`affinity_cores`): other processes, the kernel's threads, a hypervisor's steal. A cell measured
beside other load reads slower than on a quiet machine: its loader workers wait for a core, and
PyTorch's intra-op threads wait at each parallel region for the one whose core is busy (a training
cell measured a seventh of its quiet throughput beside one spinning process on a 2-core machine,
docs/performance.md). Other load is the machine's, not one experiment's: the verdict says it once
for the run, ceilings included, so that a figure taken on a shared login node, or beside another
job, is not read as the pipeline's own.

Left out: a cell of several processes (`world_size` over 1), whose other ranks on the host are its
own work that rank 0's monitor counts as other; a cell that took another's result (core.fit's
twin), named once as that cell; and a window under MIN_WINDOW_S, too short for the kernel's 10 ms
clock ticks in which every CPU time is read.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from ..core.fit import twin_of
from .stages import column_median

# Other load worth a sentence: a tenth of the cell's CPUs, and at least half of one. A default run
# on a 2-core VM with nothing else running read up to 0.31 core (the median of a cell's repeats; the
# candidates: the kernel's threads, the run's own Snakemake and its other jobs, a busy time the
# kernel samples tick by tick); beside one CPU hog, 0.7 to 1.1 (docs/performance.md).
SHARE, LEAST = 0.10, 0.5
# Each CPU time is read in 10 ms ticks, a mask's CPUs and each process of the cell at both ends of
# the window: over a 1 s window with 2 CPUs and 3 processes the reading may be 0.1 core off; over
# the 20 ms of a fast loader ceiling, several cores.
MIN_WINDOW_S = 1.0


def cells(summary: pd.DataFrame) -> list[dict]:
    """Each single-process cell of the run that measured its other load over a long enough window:
    its experiment, cell, and the medians over its finished repeats (the figures the report shows
    are medians too) of its other load, its mask's CPUs and its window."""
    if "other_load_cores" not in summary or "affinity_cores" not in summary:
        return []  # results written before the harness read it
    found = []
    ok = summary[summary["status"] == "ok"]
    for (experiment, cell), rows in ok.groupby(["experiment", "cell"], sort=False):
        ranks = column_median(rows, "world_size")
        if twin_of(rows["adjustments"].iloc[0] if "adjustments" in rows else None):
            continue
        figures = {
            "experiment": experiment,
            "cell": cell,
            "other_load_cores": column_median(rows, "other_load_cores"),
            "affinity_cores": column_median(rows, "affinity_cores"),
            "window_s": column_median(rows, "window_s"),
        }
        if (ranks or 1) <= 1 and None not in figures.values():
            found.append(figures)
    return found


def disturbed(found: list[dict]) -> list[dict]:
    """The cells measured beside other load (SHARE of their CPUs and at least LEAST cores, over at
    least MIN_WINDOW_S), the largest share first."""
    return sorted(
        (
            c
            for c in found
            if c["window_s"] >= MIN_WINDOW_S
            and c["other_load_cores"] >= max(LEAST, SHARE * c["affinity_cores"])
        ),
        key=lambda c: -c["other_load_cores"] / c["affinity_cores"],
    )


def note(summary: pd.DataFrame, name: Callable[[str], str] = str) -> str | None:
    """The run's sentence: the most disturbed cell's other load, how many more had some, and what
    it means for their figures; None when no cell was measured beside other load. `name`: a cell id
    as the report shows it (its tables cut a long one, a ceiling's of a user's pipeline runs to 200
    characters)."""
    found = disturbed(cells(summary))
    if not found:
        return None
    worst, more = found[0], len(found) - 1
    other, cores = worst["other_load_cores"], int(worst["affinity_cores"])
    besides = (
        f"; {more} more cell{'' if more == 1 else 's'} also ran beside other load" if more else ""
    )
    cpus, cell = f"{cores} CPU{'' if cores == 1 else 's'}", name(worst["cell"])
    return (
        f"Measured beside other load: other work took {other:.1f} of the {cpus} cell "
        f"{cell} of {worst['experiment']} ran on ({100 * other / cores:.0f} %){besides}. "
        "Those figures are lower than a quiet machine gives; rerun them alone before comparing "
        "them."
    )
