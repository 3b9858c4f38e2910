"""The CPU load of a cell's loader workers over its finished repeats, from the summary's columns
(core.cores.cpu_load wrote them per repeat): what the verdict says of oversubscription, and what
a search (core.search, workflow/scripts/search.py) reads of each level's loader ceiling."""

from __future__ import annotations

import pandas as pd

from ..core.cores import crowded
from .stages import column_median


def workers_cpu(ok: pd.DataFrame) -> dict:
    """The kind of a cell's loader workers over its finished repeats (core.cores.cpu_load: CPU-bound
    or waiting, the most frequent), their median CPU and runnable shares, its cores asked and
    usable, and whether any repeat was oversubscribed; None each where the summary has no such
    column or value."""
    kinds = ok["workers_kind"].dropna() if "workers_kind" in ok else pd.Series(dtype=object)
    flags = ok["oversubscribed"].dropna() if "oversubscribed" in ok else pd.Series(dtype=object)
    load = {
        "cpu_share": column_median(ok, "workers_cpu_share"),
        "runnable_share": column_median(ok, "workers_runnable_share"),
        "demand_cores": column_median(ok, "demand_cores"),
        "usable_cores": column_median(ok, "usable_cores"),
        "trainer_cores": column_median(ok, "trainer_cores"),
    }
    # core.cores' rule on the medians too: results written before it counted the workers' CPU
    workers = column_median(ok, "num_workers") or 0
    again = crowded(
        load["demand_cores"],
        load["usable_cores"],
        load["runnable_share"],
        load["cpu_share"],
        int(workers),
        int(load["trainer_cores"] or 1),
    )
    marked = bool(flags.astype(bool).any()) if len(flags) else None
    return {
        "workers_kind": str(kinds.mode().iloc[0]) if len(kinds) else None,
        **load,
        "oversubscribed": None if marked is None and again is None else bool(marked or again),
    }


def loader_cpu(ceilings: pd.DataFrame, paths: list[str]) -> dict:
    """The CPU load of the results at `paths` (a searched level's loader ceiling, for core.search)
    over their finished repeats, as workers_cpu gives it, with whole core counts (a loader cell's
    trainer is always one core: not repeated)."""
    rows = (
        ceilings[ceilings["result"].isin(paths) & (ceilings["status"] == "ok")]
        if len(ceilings)
        else ceilings
    )
    load = {k: v for k, v in workers_cpu(rows).items() if k != "trainer_cores"}
    return {k: (int(v) if k.endswith("_cores") and v is not None else v) for k, v in load.items()}
