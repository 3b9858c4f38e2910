"""Whether a cell's loader workers grow in memory as they read, and why: the verdict's memory
sentence.

A cell's figures are the medians over its finished repeats of the summary's memory columns (the
harness fits each worker's USS against the samples delivered: harness.memory, core.memory). Its
workers grow when the fitted growth passes core.memory.growing (at least GROWTH_FLOOR_MB over a
worker's life, with a fit that explains it): a batch in flight comes and goes and does not. Growth
in forked workers is copy-on-access: a forked worker shares the main process's pages until it writes
one, and reading a Python object writes its reference count, so every page of a dataset held as
Python lists and dicts that the worker reads becomes its own copy, in every worker (pytorch/pytorch
#13246). A NumPy array or an Arrow table is one object whose items carry no reference count: reading
them writes nothing. Workers started by spawn or forkserver share no Python objects with the main
process, so their growth is the dataset's own (a cache, a leak), and the sentence says that instead.
"""

from __future__ import annotations

import pandas as pd

from ..core.memory import growing
from .labels import words

COLUMNS = {
    "growth_mb_per_1k": "workers_uss_growth_mb_per_1k",
    "grown_mb": "workers_uss_grown_mb",
    "growth_r2": "workers_uss_growth_r2",
    "memory_limit_mb": "memory_limit_mb",
    "samples_to_limit": "samples_to_memory_limit",
}
COPY_ON_ACCESS_FIX = (
    "store the dataset in NumPy arrays or Arrow tables instead of Python lists and dicts "
    "(pytorch/pytorch #13246)"
)


def _first(rows: pd.DataFrame, column: str):
    values = rows[column].dropna() if column in rows else ()
    return values.iloc[0] if len(values) else None


def figures(ok: pd.DataFrame) -> dict:
    """A cell's memory figures from its finished repeats (medians; the limit's source and the start
    method as run)."""
    found = {}
    for key, column in COLUMNS.items():
        values = pd.to_numeric(ok[column], errors="coerce").dropna() if column in ok else ()
        found[key] = float(values.median()) if len(values) else None
    found["memory_limit_by"] = _first(ok, "memory_limit_by")
    found["start_method"] = _first(ok, "workers_start_method")
    return found


def sentence(cell: dict) -> str | None:
    """What the cell's workers' memory does, with its cause and fix; None when it does not grow."""
    cell = {
        key: None if not isinstance(value, str) and pd.isna(value) else value
        for key, value in cell.items()
    }
    if not growing(cell.get("grown_mb"), cell.get("growth_r2")):
        return None
    text = (
        f"the workers' memory (USS, summed) grows {cell['growth_mb_per_1k']:.1f} MB per "
        "1,000 samples"
    )
    if cell.get("start_method") == "fork":
        text += (
            " by copy-on-access: each forked worker writes the reference count of every Python "
            f"object it reads, so the pages it reads become its own copies; {COPY_ON_ACCESS_FIX}"
        )
    else:
        method = cell.get("start_method") or "non-forked"
        text += (
            f" as the dataset is read: not copy-on-access ({method} workers share no Python "
            "objects with the main process), so the dataset keeps what it reads (a cache or a "
            "leak)"
        )
    left, limit = cell.get("samples_to_limit"), cell.get("memory_limit_mb")
    if left is not None and limit is not None:
        text += (
            f"; at that rate the cell reaches the {limit:,.0f} MB it may use ("
            f"{cell.get('memory_limit_by')}) after about {left:,.0f} more samples"
        )
    return text


def note(cells: pd.DataFrame) -> str | None:
    """The verdict's memory note: a sentence for each cell whose workers grow; None when none
    does."""
    found = (
        [(words(c), sentence(c)) for c in cells.to_dict("records")] if "grown_mb" in cells else []
    )
    parts = [f"cell {cell}: {text}" for cell, text in found if text]
    return ". ".join(parts) + "." if parts else None
