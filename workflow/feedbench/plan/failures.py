"""A run's failed cells, one line each, and its experiments stopped by their preflight, for the end
of the run (the Snakefile's onsuccess and onerror).

A bench job always succeeds, so that the matrix goes on and the report lists a failed cell
(plan.job). Snakemake then sees a run of successful jobs; the run's end reads the cells' records
(core.records, where the run's aggregate made them; else their results) to say which failed, and the
Snakefile makes the run exit 1 on them, as it does after lost Slurm jobs. No torch and no Snakemake
here: the Snakefile gives the cells.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..core.records import Record, load_records, read_record
from .job import CELL_LOG, result_path


def failure_line(
    experiment: str, cell: str, repeat: int, ran: bool, record: Record | None = None
) -> str | None:
    """`experiment / cell (repN): Type: the error's first line (log: ...)` for a cell whose result
    failed or is damaged, else None (measured, or no result: a cell the run's targets did not
    reach). `ran`: whether this run ran the cell's job; a failed result of an earlier run still
    counts, since the report still lists it. `record`: the result's record where the run has it
    (core.records), else the result is read."""
    path = result_path(experiment, cell, repeat)
    if record is None:
        if not os.path.exists(path):
            return None
        record = read_record(path)
    if record.damaged:
        error = f"UnusableResult: {record.error.get('reason')}"
    else:
        if record.status == "ok":
            return None
        found = record.error
        message = (found.get("message") or "").strip().splitlines()
        error = ": ".join(
            part for part in (found.get("type"), message[0] if message else None) if part
        )
    log = CELL_LOG.format(experiment=experiment, cell=cell, repeat=repeat)
    where = (
        f"log: {log}" if ran else f"an earlier run's result, not run again this time; log: {log}"
    )
    return f"{experiment} / {cell} (rep{repeat}): {error or 'failed, no error recorded'} ({where})"


def failed_cells_message(
    cells: Iterable[tuple[str, str, int, bool]],
    report: str | None,
    stopped: Iterable[str] = (),
    records: str | None = None,
) -> str | None:
    """The run's end in words when any of `cells` (experiment, cell, repeat, ran by this run)
    failed, or an experiment was stopped by its preflight, else None: one line per stopped
    experiment (`stopped`, feedbench.core.preflight: stopped_line); then how many cells failed,
    where the report that lists them is (None: a run that ended on an error may have made none), and
    one line per failed cell."""
    cells, stopped = list(cells), list(stopped)
    found = (
        {os.path.normpath(r.path): r for r in load_records(records)}
        if records and os.path.exists(records)
        else {}
    )
    lines = [
        failure_line(*cell, found.get(os.path.normpath(result_path(*cell[:3])))) for cell in cells
    ]
    lines = [line for line in lines if line]
    if not lines and not stopped:
        return None
    listed = f"; the report lists them ({report})" if report else ""
    if not lines:  # the report lists the stopped experiments' cells
        listed = f"; the report lists its cells ({report})" if report else ""
        return "\n".join([*stopped[:-1], stopped[-1] + listed])
    return "\n".join(
        [*stopped, f"feedbench: {len(lines)} of {len(cells)} cell runs failed{listed}:", *lines]
    )
