"""A run's failed cells, one line each, and its experiments stopped by their preflight, for the end of the run (the
Snakefile's onsuccess and onerror).

A bench job always succeeds, so that the matrix goes on and the report lists a failed cell (plan.job). Snakemake then
sees a run of successful jobs; the run's end reads the cells' results to say which failed, and the Snakefile makes
the run exit 1 on them, as it does after lost Slurm jobs. No torch and no Snakemake here: the Snakefile gives the
cells.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..core.result import UnusableResult, read_result
from .job import CELL_LOG, result_path


def failure_line(experiment: str, cell: str, repeat: int, ran: bool) -> str | None:
    """`experiment / cell (repN): Type: the error's first line (log: ...)` for a cell whose result failed or is
    damaged, else None (measured, or no result: a cell the run's targets did not reach). `ran`: whether this run ran
    the cell's job; a failed result of an earlier run still counts, since the report still lists it."""
    path = result_path(experiment, cell, repeat)
    if not os.path.exists(path):
        return None
    try:
        result = read_result(path)
    except UnusableResult as damage:
        error = f"UnusableResult: {damage.reason}"
    else:
        if result["status"] == "ok":
            return None
        found = result.get("error") or {}
        message = (found.get("message") or "").strip().splitlines()
        error = ": ".join(part for part in (found.get("type"), message[0] if message else None) if part)
    log = CELL_LOG.format(experiment=experiment, cell=cell, repeat=repeat)
    where = f"log: {log}" if ran else f"an earlier run's result, not run again this time; log: {log}"
    return f"{experiment} / {cell} (rep{repeat}): {error or 'failed, no error recorded'} ({where})"


def failed_cells_message(
    cells: Iterable[tuple[str, str, int, bool]], report: str | None, stopped: Iterable[str] = ()
) -> str | None:
    """The run's end in words when any of `cells` (experiment, cell, repeat, ran by this run) failed, or an experiment
    was stopped by its preflight, else None: one line per stopped experiment (`stopped`, feedbench.core.preflight:
    stopped_line); then how many cells failed, where the report that lists them is (None: a run that ended on an error
    may have made none), and one line per failed cell."""
    cells, stopped = list(cells), list(stopped)
    lines = [line for line in (failure_line(*cell) for cell in cells) if line]
    if not lines and not stopped:
        return None
    listed = f"; the report lists them ({report})" if report else ""
    if not lines:  # the report lists the stopped experiments' cells
        listed = f"; the report lists its cells ({report})" if report else ""
        return "\n".join([*stopped[:-1], stopped[-1] + listed])
    return "\n".join([*stopped, f"feedbench: {len(lines)} of {len(cells)} cell runs failed{listed}:", *lines])
