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

The same rule, read repeat by repeat (`disturbed_rows`, `kept`), keeps a repeat measured beside
other load out of every verdict figure where quiet repeats of its cell exist (analysis.verdict): the
verdict's lines then say how many they left out, or, where every repeat was disturbed, say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


def beside_other_load(other_cores: float, affinity_cores: float, window_s: float) -> bool:
    """The one rule: other work took SHARE of the CPUs and at least LEAST cores, over a window of at
    least MIN_WINDOW_S."""
    return window_s >= MIN_WINDOW_S and other_cores >= max(LEAST, SHARE * affinity_cores)


def disturbed(found: list[dict]) -> list[dict]:
    """The cells measured beside other load (beside_other_load, on the medians of their repeats),
    the largest share first."""
    return sorted(
        (
            c
            for c in found
            if beside_other_load(c["other_load_cores"], c["affinity_cores"], c["window_s"])
        ),
        key=lambda c: -c["other_load_cores"] / c["affinity_cores"],
    )


def disturbed_rows(rows: pd.DataFrame) -> pd.Series:
    """Per summary row, whether that repeat ran beside other load (beside_other_load on its own
    readings); False where it cannot be read as such: a cell of several processes, a row without
    the readings (results written before the harness read them)."""
    columns = ("other_load_cores", "affinity_cores", "window_s")
    if any(c not in rows for c in columns):
        return pd.Series(False, index=rows.index)
    other, cores, window = (pd.to_numeric(rows[c], errors="coerce") for c in columns)
    ranks = pd.to_numeric(rows.get("world_size", pd.Series(1, index=rows.index)), errors="coerce")
    read = other.notna() & cores.notna() & window.notna() & (ranks.fillna(1) <= 1)
    beside = (window >= MIN_WINDOW_S) & (other >= (SHARE * cores).clip(lower=LEAST))
    return read & beside


@dataclass(frozen=True)
class Kept:
    """The repeats of one cell that its verdict figures stand on (`rows`): its quiet ones where any
    exist, else all of them; how many disturbed ones it `left_out`; whether every repeat it has ran
    beside other load (`disturbed`)."""

    rows: pd.DataFrame
    left_out: int
    disturbed: bool


def kept(rows: pd.DataFrame) -> Kept:
    """The finished repeats of one cell (`rows`) a verdict figure may stand on (Kept)."""
    beside = disturbed_rows(rows)
    if not beside.any():
        return Kept(rows, 0, False)
    if beside.all():
        return Kept(rows, 0, True)
    return Kept(rows[~beside], int(beside.sum()), False)


def note(
    summary: pd.DataFrame, name: Callable[[str, str], str] = lambda _e, cell: f"cell {cell}"
) -> str | None:
    """The run's sentence: the most disturbed cell's other load, how many more had some, and what
    it means for their figures; None when no cell was measured beside other load. `name`: a cell
    of an experiment in words, as the report names it ("cell num_workers=2"; a ceiling's id of a
    user's pipeline runs to 200 characters)."""
    found = disturbed(cells(summary))
    if not found:
        return None
    worst, more = found[0], len(found) - 1
    other, cores = worst["other_load_cores"], int(worst["affinity_cores"])
    besides = (
        f"; {more} more cell{'' if more == 1 else 's'} also ran beside other load" if more else ""
    )
    cpus = f"{cores} CPU{'' if cores == 1 else 's'}"
    cell = name(worst["experiment"], worst["cell"])
    return (
        f"Measured beside other load: other work took {other:.1f} of the {cpus} {cell} of "
        f"{worst['experiment']} ran on ({100 * other / cores:.0f} %){besides}. "
        "Those figures are lower than a quiet machine gives; rerun them alone before comparing "
        "them."
    )


def words_of(cells: list[tuple[dict | None, str]]) -> str | None:
    """What a verdict line says of the repeats beside other load of the cells it stands on, each
    (cell-table row, name): each one's left out (words), and those with no quiet repeat together;
    None where none ran beside other load."""
    left = [said for cell, name in cells if (said := words(cell, name)) and " left out" in said]
    none = [name for cell, name in cells if (said := words(cell, name)) and " left out" not in said]
    if len(none) > 1:
        left.append(
            f"{' and '.join(none)} have no quiet repeat (every repeat of theirs ran beside other "
            "load), so their figures are lower than a quiet machine gives"
        )
    else:
        left += [words(cell, name) for cell, name in cells if name in none]
    return "; ".join(left) or None


def words(cell: dict | None, name: str) -> str | None:
    """What a verdict line says of a cell's repeats beside other load (its cell-table row: Kept's
    left_out and disturbed, n its repeats used), named `name`; None where none was."""
    if not cell:
        return None
    left, used = int(cell.get("left_out") or 0), int(cell.get("n") or 0)
    if left:
        verb = "is" if left == 1 else "are"
        return f"{left} of {name}'s {left + used} repeats ran beside other load and {verb} left out"
    flag = cell.get("disturbed")
    if flag is not None and not pd.isna(flag) and bool(flag):
        every = "its only repeat" if used == 1 else f"all {used} of its repeats"
        return (
            f"{name} has no quiet repeat ({every} ran beside other load), so its figures are lower "
            "than a quiet machine gives"
        )
    return None
