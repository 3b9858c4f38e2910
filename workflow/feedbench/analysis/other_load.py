"""Whether other work shared the CPUs a cell was measured on: the verdict's other-load sentence.

Over each cell's window the harness reads the CPU time other processes took on the CPUs of its
affinity mask (harness.monitor.Offered: the summary's `other_load_cores`, in cores, beside
`affinity_cores`). A cell measured beside other load reads slower than on a quiet machine: its
loader workers wait for a core, and PyTorch's intra-op threads wait at each parallel region for the
one whose core is busy (a training cell measured a seventh of its quiet throughput beside one
spinning process on a 2-core machine, docs/performance.md). The verdict says so once for the run,
so that a figure taken on a shared login node, or beside another job, is not read as the
pipeline's own.

Left out: a cell of several processes (`world_size` over 1), whose other ranks on the host are its
own work that rank 0's monitor counts as other, and a cell that took another's result
(`measured_as`), named once as that cell.
"""

from __future__ import annotations

import pandas as pd

# Other load worth a sentence: a tenth of the cell's CPUs, and at least a fifth of one (below it,
# the machine's own daemons).
SHARE, LEAST = 0.10, 0.2


def _numbers(ok: pd.DataFrame, column: str) -> pd.Series:
    if column not in ok:
        return pd.Series(dtype=float)
    return pd.to_numeric(ok[column], errors="coerce").dropna()


def figures(ok: pd.DataFrame) -> dict:
    """A cell's other load over its finished repeats: the most of any repeat (one disturbed repeat
    is enough to move a median of three), its mask's CPUs and its ranks; None each where the
    summary has no value."""
    other, cores, ranks = (
        _numbers(ok, c) for c in ("other_load_cores", "affinity_cores", "world_size")
    )
    return {
        "other_load_cores": float(other.max()) if len(other) else None,
        "affinity_cores": int(cores.max()) if len(cores) else None,
        "world_size": int(ranks.max()) if len(ranks) else None,
    }


def disturbed(cells: pd.DataFrame) -> list[dict]:
    """The cells measured beside other load (SHARE of their CPUs and at least LEAST cores), the
    most disturbed first."""
    found = []
    for cell in cells.to_dict("records"):
        other, cores = cell.get("other_load_cores"), cell.get("affinity_cores")
        if other is None or pd.isna(other) or not cores or pd.isna(cores):
            continue
        if (cell.get("world_size") or 1) > 1 or isinstance(cell.get("measured_as"), str):
            continue
        if other >= max(LEAST, SHARE * cores):
            found.append(cell)
    return found


def note(found: list[tuple[str, dict]]) -> str | None:
    """The run's sentence, from every experiment's disturbed cells ((experiment, cell) pairs): the
    most disturbed cell's other load, how many more had some, and what it means for their figures;
    None when no cell was measured beside other load. Other load is the machine's, not one
    experiment's: the verdict says it once, under every experiment's lines."""
    if not found:
        return None
    found = sorted(found, key=lambda pair: -pair[1]["other_load_cores"] / pair[1]["affinity_cores"])
    (experiment, worst), more = found[0], len(found) - 1
    other, cores = worst["other_load_cores"], int(worst["affinity_cores"])
    besides = (
        f"; {more} more cell{'' if more == 1 else 's'} also ran beside other load" if more else ""
    )
    cpus = f"{cores} CPU{'' if cores == 1 else 's'}"
    return (
        f"Measured beside other load: other processes took {other:.1f} of the {cpus} cell "
        f"{worst['cell']} of {experiment} ran on ({100 * other / cores:.0f} %){besides}. Those "
        "figures are lower than a quiet machine gives; rerun them alone before comparing them."
    )
