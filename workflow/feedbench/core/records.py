"""A run's results read once: each result.json validated (core.result.read_result) into a typed
`Record`.

Rule aggregate reads every result this way and writes the records, in the summary's order, to
results/records.json (`write_records`) beside the summary; the report (its provenance, failures, the
section "On <target>" and its loader curves) and the run's end (feedbench.plan.failures) read that
one file (`load_records`), so no later rule opens a result.json again. A record keeps a result's
values as it holds them: a result written before a metric existed has no value there, as the summary
has none.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields

from .columns import LABELS
from .knobs import KNOBS
from .metric_table import METRICS, row_of
from .result import UnusableResult, atomic_write, read_result

# The monitor's parts the analysis reads beyond the metric table: stats per series, each worker's
# CPU and wall time, the cores the mask offered (analysis.loader_scaling, analysis.target_view).
MONITOR = ("stats", "workers", "cpu_offered")
# The metrics of the table a record keeps by name: one value each (the expanded ones are in
# `columns`).
NAMED = tuple(name for name, metric in METRICS.items() if metric.expand is None)


@dataclass(frozen=True)
class Record:
    """One result.json as the analysis reads it. `cell`: the knobs and labels as the cell ran (None
    where it never validated); `metrics`: each metric of core.metric_table by name, as the result
    holds it; `columns`: the summary's metric columns (metric_table.row_of); `damaged`: the result
    was unusable (UnusableResult), kept as a failed record labelled by its path that says why."""

    path: str
    status: str | None
    labels: dict
    cell: dict | None = None
    requested: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    columns: dict = field(default_factory=dict)
    error: dict = field(default_factory=dict)
    adjustments: list = field(default_factory=list)
    provenance: dict = field(default_factory=dict)
    monitor: dict = field(default_factory=dict)
    # torch_threads, torch_threads_source, launch_threads
    threads: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)
    shm: dict = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    damaged: bool = False

    @property
    def knobs(self) -> dict:
        """Every knob of core.knobs as the cell ran (as requested where it never validated); None
        where absent."""
        found = self.cell or self.requested or {}
        return {name: found.get(name) for name in KNOBS}

    @property
    def key(self) -> str:
        """`<experiment>/<cell>`: the key of results/target.json's cells and of the planner's
        map."""
        return f"{self.labels.get('experiment')}/{self.labels.get('cell')}"


def _labels(result: dict, path: str) -> dict:
    """The cell's labels, else experiment, cell, repeat from
    results/cells/<experiment>/<cell>/rep<k>/result.json.

    `baseline` is True or False as feedbench.plan.matrix marked the cell; a result written before
    cells carried the label leaves it empty (unknown): the verdict then names no baseline and says
    why.
    """
    parts = os.path.normpath(path).split(os.sep)
    from_path = {}
    if (
        len(parts) >= 4
        and parts[-1] == "result.json"
        and parts[-2].startswith("rep")
        and parts[-2][3:].isdigit()
    ):
        from_path = {"experiment": parts[-4], "cell": parts[-3], "repeat": int(parts[-2][3:])}
    labels = {}
    for name in LABELS:
        value = (result.get("cell") or {}).get(name)
        if value is None:
            value = (result.get("requested") or {}).get(name)
        labels[name] = value if value is not None else from_path.get(name)
    if labels["baseline"] is not None:
        labels["baseline"] = labels["baseline"] is True
    return labels


def record_of(result: dict, path: str, damaged: bool = False) -> Record:
    """The record of one parsed result (already validated) found at `path`."""
    monitor = result.get("monitor") or {}
    return Record(
        path=str(path),
        status=result.get("status"),
        labels=_labels(result, str(path)),
        cell=result.get("cell"),
        requested=result.get("requested") or {},
        metrics={name: METRICS[name].at(result) for name in NAMED},
        columns=row_of(result),
        error=result.get("error") or {},
        adjustments=result.get("adjustments") or [],
        provenance=result.get("provenance") or {},
        monitor={name: monitor[name] for name in MONITOR if name in monitor},
        threads={
            name: result.get(name)
            for name in ("torch_threads", "torch_threads_source", "launch_threads")
        },
        cpu=result.get("cpu") or {},
        shm=result.get("shm") or {},
        started_at=result.get("started_at"),
        finished_at=result.get("finished_at"),
        damaged=damaged,
    )


def read_record(path: str) -> Record:
    """One result.json read and validated (read_result); an unusable one is a failed record saying
    why, so one bad cell never hides the rest of the matrix."""
    try:
        return record_of(read_result(path), path)
    except UnusableResult as damage:
        error = {"type": "UnusableResult", "message": str(damage), "reason": damage.reason}
        return record_of({"status": "failed", "error": error}, path, damaged=True)


def as_records(results) -> list[Record]:
    """Records as given, and result files (paths) read once each (read_record)."""
    return [found if isinstance(found, Record) else read_record(str(found)) for found in results]


def by_cell(records: list[Record]) -> dict[str, list[Record]]:
    """`<experiment>/<cell>` -> its records that can be trusted (not damaged), in order."""
    found: dict[str, list[Record]] = {}
    for record in records:
        if not record.damaged:
            found.setdefault(record.key, []).append(record)
    return found


def write_records(records: list[Record], path: str) -> None:
    """The records as one JSON file (a list, one mapping per record), written atomically."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    # vars(), not asdict(): the fields as they are, without asdict's deep copy of every nested
    # mapping (3x slower).
    atomic_write(path, json.dumps([vars(record) for record in records], default=str) + "\n")


def load_records(path: str) -> list[Record]:
    """The records write_records wrote, in its order; one clear line where the file is not such a
    list."""
    with open(path, encoding="utf-8") as f:
        found = json.load(f)
    names = {f.name for f in fields(Record)}
    if not isinstance(found, list) or not all(
        isinstance(r, dict) and set(r) <= names for r in found
    ):
        raise ValueError(
            f"{path}: not a list of result records (written by rule aggregate: core.records)"
        )
    return [Record(**record) for record in found]
