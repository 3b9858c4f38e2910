"""Flatten cell results into one tidy table: one row per cell x repeat.

The summary is the product the plots, the report and any notebook start from,
so it keeps failed cells (with their error) beside measured ones: nothing
is dropped on the way from result.json to summary.csv.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd

from ..core.ceilings import (
    CEILING_EXPERIMENTS,
    CEILINGS,
    batch_bytes,
    ceiling_knobs,
    ceiling_map,
    nearest_size,
    user_probe_knobs,
)
from ..core.columns import (
    CPU_COLUMNS,
    LABELS,
    ORDER,
    PREDICTION_COLUMNS,
    PROVENANCE_COLUMNS,
    SHM_COLUMNS,
    STATUS,
)
from ..core.knobs import KNOBS, STAGE_WHATIFS, WHATIF_ONLY, KnobError, user_batch
from ..core.knobs import LABELS as CELL_LABELS
from ..core.planned_cell import PlannedCell, effective
from ..core.records import Record, as_records
from ..core.result import atomic_write
from . import other_load
from .predict import predict
from .whatifs import predict_cell, whatifs_of


def _knobs(knobs: dict) -> dict:
    """Every knob of `knobs` (a record's: core.records.Record.knobs); lists as JSON text."""
    row = {}
    for name in KNOBS:
        value = knobs.get(name)
        row[name] = json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value
    return row


def _requested_text(knobs: dict) -> str:
    """The `requested` column as the CSV holds it: the knobs as JSON text (read_summary gives the
    mapping back)."""
    return json.dumps(knobs, sort_keys=True, default=str)


def _cpu(load: dict) -> dict:
    """The result's `cpu` (core.cores.cpu_load) as its summary columns, in CPU_COLUMNS' order."""
    keys = [
        "usable_cores",
        "demand_cores",
        "trainer_cores",
        "cpu_share",
        "runnable_share",
        "kind",
        "oversubscribed",
    ]
    return {column: load.get(key) for column, key in zip(CPU_COLUMNS, keys, strict=True)}


def result_row(record: Record) -> dict:
    """One summary row from one result's record (core.records)."""
    error, provenance = record.error, record.provenance
    return {
        **record.labels,
        "status": record.status,
        "error_type": error.get("type"),
        "error_message": error.get("message"),
        "adjustments": "; ".join(record.adjustments) or None,
        **_knobs(record.knobs),
        **record.columns,
        **{name: provenance.get(name) for name in PROVENANCE_COLUMNS},
        "torch_threads_used": record.threads.get("torch_threads"),
        "torch_threads_source": record.threads.get("torch_threads_source"),
        "torch_threads_launch": record.threads.get("launch_threads"),
        **_cpu(record.cpu),
        **{column: record.shm.get(column[4:]) for column in SHM_COLUMNS},
        # The knobs as the workflow asked for them: a cell fitted to the machine (pin_memory on a
        # CPU) ran otherwise.
        "requested": _requested_text(
            {k: v for k, v in record.requested.items() if k not in CELL_LABELS}
        ),
        "result": record.path,
    }


def planned_row(experiment: str, cell: str, knobs: dict, device: str | None) -> dict:
    """A training cell not run yet, as a summary row on `device` (as its ceilings ran): what
    with_predictions needs to predict it from ceilings already measured, joined on the planner's map
    by its experiment and cell (feedbench.core.search asks this before choosing the cells to
    run)."""
    ran = {**{name: knob.default for name, knob in KNOBS.items()}, **knobs, "device": device}
    labels = {"experiment": experiment, "cell": cell}
    return {
        **labels,
        "status": "planned",
        "samples_per_s": None,
        **_knobs(ran),
        "scenario": "train",
    }


def load_results(results: list, links: dict | None = None) -> pd.DataFrame:
    """Every result into the tidy summary, sorted by experiment, cell, repeat: `results` are the
    run's records, or result files, each read and validated once here (core.records.as_records, as
    the workflow's retries validate): an unusable one becomes a failed row labelled by its path and
    saying why, so one bad cell never hides the rest."""
    rows = [result_row(record) for record in as_records(results)]
    # Columns only some cells have (transfer sizes, monitor series) are empty elsewhere.
    frame = pd.DataFrame(rows, columns=None if rows else [*LABELS, *STATUS, *KNOBS])
    frame = frame.sort_values(ORDER, kind="stable", na_position="last").reset_index(drop=True)
    return with_predictions(frame, links)


def python_value(value):
    """A knob value as Python and the CSV both give it back: None for empty, bool, int for whole
    numbers, else text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str) and value in ("True", "False", "true", "false"):
        return value in ("True", "true")
    if hasattr(value, "item"):
        value = value.item()  # numpy scalars
    if isinstance(value, bool):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return int(number) if number.is_integer() else number


def _median(values) -> float | None:
    values = pd.to_numeric(pd.Series(list(values)), errors="coerce").dropna()
    return float(values.median()) if len(values) else None


def _copy_rate(probe: pd.DataFrame, size: int | None, pinned: bool) -> float | None:
    """The transfer probe's median GB/s at its probed size that stands for `size`
    (core.ceilings.nearest_size)."""
    prefix = f"transfer_gb_per_s_{'pinned' if pinned else 'pageable'}_"
    sizes = [
        int(c[len(prefix) :]) for c in probe if c.startswith(prefix) and probe[c].notna().any()
    ]
    nearest = nearest_size(sizes, size)
    return _median(probe[f"{prefix}{nearest}"]) if nearest else None


def _user_copy(probe: pd.DataFrame, pinned: bool) -> tuple[int | None, float | None]:
    """(bytes, GB/s) of the user's real batch as the transfer probe of the cell's own pipeline
    copied it: median bytes and ms over its repeats, pinned or pageable as the cell."""
    kind = "pinned" if pinned else "pageable"
    columns = [f"transfer_user_batch_bytes_{kind}", f"transfer_user_batch_ms_{kind}"]
    if probe.empty or any(c not in probe for c in columns):
        return None, None
    size, ms = (_median(probe[column]) for column in columns)
    if not size or not ms:
        return None, None
    return int(size), size / (ms / 1000) / 1e9


def _or_default(value, name: str):
    """A knob's value as the summary holds it (lists and dicts as JSON text, as _knobs writes them),
    its default where empty."""
    value = python_value(value)
    value = KNOBS[name].default if value is None else value
    return python_value(
        json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value
    )


def _planned(ok: pd.DataFrame, links: dict):
    """row -> (loader samples/s, compute samples/s, the transfer probe's rows) of the cells the
    planner's map (feedbench.core.ceilings.ceiling_map) names for the row's cell."""
    names = [
        f"{experiment}/{cell}"
        for experiment, cell in zip(ok["experiment"], ok["cell"], strict=True)
    ]
    by_cell = (
        dict(tuple(ok.groupby(pd.Series(names, index=ok.index, dtype=object)))) if len(ok) else {}
    )

    def find(row, knobs: dict):
        bounds = links.get(f"{row.get('experiment')}/{row.get('cell')}") or {}
        rows = {s: by_cell.get(bounds.get(s)) for s in (*CEILINGS, "transfer")}
        # each ceiling's quiet repeats where it has any (analysis.other_load.kept)
        kept = {s: other_load.kept(rows[s]) for s in CEILINGS if rows[s] is not None}
        loader, compute = (
            _median(kept[s].rows["samples_per_s"]) if s in kept else None for s in CEILINGS
        )
        disturbed = any(k.disturbed for k in kept.values()) if kept else None
        return loader, compute, rows["transfer"], disturbed

    return find


def _ran(row) -> dict:
    """The knobs a summary row ran with, as Python values (lists and mappings parsed back from
    _knobs' JSON text)."""
    knobs = {}
    for name, knob in KNOBS.items():
        value = python_value(row.get(name))
        if isinstance(value, str) and knob.type in (list, dict):
            value = json.loads(value)
        if value is not None:
            knobs[name] = value
    return knobs


def _as_planned(row) -> dict | None:
    """A row's cell as the planner would have planned it: the knobs the workflow asked for
    (`requested`; as it ran where the result has none), a loader or compute ceiling as ceiling_knobs
    derives it from the training cells it bounds, a transfer probe as user_probe_knobs (its device
    and the knobs of the user's batch); None where they do not check (a cell that failed
    validation)."""
    asked = requested(row.get("requested"))
    knobs = {k: v for k, v in asked.items() if k in KNOBS} if asked else _ran(row)
    try:
        effective(knobs)
    except (KnobError, ValueError, TypeError):
        return None
    scenario = knobs.get("scenario", KNOBS["scenario"].default)
    if scenario in CEILINGS:
        return ceiling_knobs(knobs, scenario)
    return (
        user_probe_knobs({"device": KNOBS["device"].default, **knobs})
        if scenario == "transfer"
        else knobs
    )


def rebuilt_map(frame: pd.DataFrame) -> dict:
    """The planner's map (feedbench.core.ceilings.ceiling_map) of a summary rebuilt from results
    alone: each cell planned over again from the knobs it asked for (_as_planned), so that its
    ceilings are the cells the planner's own rule (ceilings.Bounds) finds. Where another
    experiment's cell measures the same ceiling as a derived one, the derived one is kept (given
    last: Bounds keeps the last of equal cells), as in the run."""
    cells: dict[tuple, PlannedCell] = {}
    for row in frame.to_dict("records"):
        key = (str(row.get("experiment")), str(row.get("cell")))
        knobs = None if key in cells else _as_planned(row)
        if knobs is not None:
            cells[key] = PlannedCell(*key, knobs, {})
    derived = set(CEILING_EXPERIMENTS.values())
    return ceiling_map(sorted(cells.values(), key=lambda cell: cell.experiment in derived))


def _whatif_baselines(ok: pd.DataFrame):
    """row -> the finished rows of its stage what-if's baseline: the training cell of its experiment
    with the same knobs but no what-if; None where the row has no what-if or no such cell ran."""

    def key(row) -> tuple:
        rest = tuple((k, _or_default(row.get(k), k)) for k in KNOBS if k not in WHATIF_ONLY)
        return (row.get("experiment"), rest)

    train = ok[ok["scenario"] == "train"] if "scenario" in ok else ok.iloc[0:0]
    plain = [
        i
        for i, row in train.iterrows()
        if not whatifs_of({k: python_value(row.get(k)) for k in STAGE_WHATIFS})
    ]
    groups: dict[tuple, list] = {}
    for index in plain:
        groups.setdefault(key(train.loc[index]), []).append(index)
    return lambda row: train.loc[groups[key(row)]] if key(row) in groups else None


def _predict_row(row, knobs: dict, rates: tuple, copy: tuple, baseline_of) -> tuple:
    """(samples/s, bound, where from) of a training row: from its ceilings, or, for a stage what-if,
    from its baseline's stage profile (analysis.whatifs) with the same ceilings."""
    workers, batch = int(knobs.get("num_workers", 0)), int(knobs.get("batch_size", 1))
    if not whatifs_of(knobs):
        predicted, bound, _terms = predict(
            *rates, workers, batch, *copy, knobs.get("device_prefetch") == "stream"
        )
        return predicted, bound, "ceilings"
    baseline = baseline_of(row)
    if baseline is None:
        return None, None, None
    predicted, bound, _terms = predict_cell(
        knobs, baseline, rates, copy, python_value(row.get("whatif_device_ms"))
    )
    return predicted, bound, f"stage what-if of {baseline['cell'].iloc[0]}"


def with_predictions(frame: pd.DataFrame, links: dict | None = None) -> pd.DataFrame:
    """Add PREDICTION_COLUMNS: each single-process training cell predicted from its ceilings
    (analysis.predict), and the measured samples/s against it: 100 x (measured / predicted - 1). The
    ceilings are the cells the planner's map names (links: feedbench.core.ceilings.ceiling_map,
    results/ceilings.json); without a map, the map planned again from the cells the rows asked for
    (rebuilt_map)."""
    frame = frame.copy()
    for column in PREDICTION_COLUMNS:
        frame[column] = None
    if frame.empty or "scenario" not in frame:
        return frame
    ok = frame[frame["status"] == "ok"]
    # a failed ceiling bounds nothing
    ok_or_train = (frame["status"] == "ok") | (frame["scenario"] == "train")
    find = _planned(ok, rebuilt_map(frame[ok_or_train]) if links is None else links)
    baseline_of = _whatif_baselines(ok)
    for index, row in frame.iterrows():
        if row["scenario"] != "train" or python_value(row.get("parallel")) not in (None, "none"):
            continue
        knobs = {k: python_value(row.get(k)) for k in KNOBS if python_value(row.get(k)) is not None}
        loader, compute, probe, disturbed = find(row, knobs)
        pinned, size, copy, source = bool(knobs.get("pin_memory")), None, None, None
        if knobs.get("device") not in (None, "cpu") and probe is not None:
            if user_batch(knobs):  # a user batch: its real copy, timed by its own probe
                size, copy = _user_copy(probe, pinned)
                source = "user batch" if copy else None
            else:
                size = batch_bytes(knobs)
                copy = _copy_rate(probe, size, pinned)
                source = "sweep" if copy else None
        predicted, bound, source_of = _predict_row(
            row, knobs, (loader, compute), (size, copy), baseline_of
        )
        frame.at[index, "ceiling_loader_samples_per_s"] = loader
        frame.at[index, "ceiling_compute_samples_per_s"] = compute
        frame.at[index, "ceiling_copy_gb_per_s"] = copy
        frame.at[index, "ceiling_copy_from"] = source
        frame.at[index, "ceilings_disturbed"] = disturbed
        if predicted is None:
            continue
        frame.at[index, "predicted_samples_per_s"] = predicted
        frame.at[index, "predicted_bound"] = bound
        frame.at[index, "predicted_from"] = source_of
        measured = python_value(row.get("samples_per_s"))
        if row["status"] == "ok" and isinstance(measured, (int, float)):
            frame.at[index, "prediction_error_pct"] = 100 * (measured / predicted - 1)
    numbers = [
        c
        for c in PREDICTION_COLUMNS
        if c not in ("predicted_bound", "ceiling_copy_from", "predicted_from", "ceilings_disturbed")
    ]
    frame[numbers] = frame[numbers].apply(pd.to_numeric)
    return frame


def write_summary(frame: pd.DataFrame, path: str) -> None:
    """Write the summary CSV atomically (a reader never sees half a table)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if "requested" in frame:  # a summary read back (read_summary) holds mappings there
        frame = frame.assign(
            requested=[_requested_text(v) if isinstance(v, dict) else v for v in frame["requested"]]
        )
    atomic_write(path, frame.to_csv(index=False))


# The pandas type of a knob's column, by the type its Knob declares: nullable, as a failed cell may
# lack the knob. Text knobs stay text, and lists and mappings the JSON text _knobs writes
# (comparable, as plots and verdicts group cells by them).
_DTYPES = {bool: "boolean", int: "Int64", float: "float64"}


def _typed(column: pd.Series, dtype: str) -> pd.Series:
    """A knob's column as `dtype`; as read where a value does not fit (a cell that failed validation
    keeps the value it asked for, say num_workers 'many')."""
    values = column.dropna()
    if dtype == "boolean" and not all(isinstance(v, (bool, np.bool_)) for v in values):
        return column
    try:
        return column.astype(dtype)
    except (TypeError, ValueError):
        return column


def typed(frame: pd.DataFrame) -> pd.DataFrame:
    """The summary with each knob's column typed as its Knob declares (bools as booleans, integers
    as nullable integers), the baseline label as a boolean and `requested` as the mapping of knobs
    the cell asked for."""
    knobs = [name for name, knob in KNOBS.items() if name in frame and knob.type in _DTYPES]
    columns = {name: _typed(frame[name], _DTYPES[KNOBS[name].type]) for name in knobs}
    for name in ("baseline", "oversubscribed", "ceilings_disturbed"):
        if name in frame:
            columns[name] = _typed(frame[name], "boolean")
    if "requested" in frame:
        columns["requested"] = frame["requested"].map(requested).astype(object)
    return frame.assign(**columns)


def read_summary(path: str) -> pd.DataFrame:
    """The summary CSV as plots, report, views and verdicts read it: typed by typed(), so none types
    a value again. A summary written before the knobs were typed reads the same way."""
    return typed(pd.read_csv(path))


def requested(value) -> dict:
    """The knobs a row's cell asked for, from its `requested` column: a mapping as read_summary
    gives it, the JSON text result_row writes, {} where empty."""
    if isinstance(value, dict):
        return value
    return json.loads(value) if isinstance(value, str) and value else {}


def as_requested(rows: pd.DataFrame, knobs: list[str]) -> pd.DataFrame:
    """The rows with `knobs` as the workflow asked for them: a pin_memory=true cell fitted to a CPU
    ran with false, yet belongs in its column."""
    if "requested" not in rows or rows.empty:
        return rows
    asked = [requested(value) for value in rows["requested"]]
    return rows.assign(
        **{
            k: [a.get(k, v) for a, v in zip(asked, rows[k], strict=True)]
            for k in knobs
            if k in rows
        }
    )


def knob_value(row, name: str):
    """Knob `name` of a summary row (a dict or a pandas row), its default where the row has none (a
    failed cell that never validated, a result written before the knob existed)."""
    value = row.get(name)
    missing = value is None or (not isinstance(value, (list, dict)) and pd.isna(value))
    return KNOBS[name].default if missing else value


def is_true(value) -> bool:
    """Whether a boolean value of the typed summary is set: True (Python's or numpy's), not False or
    missing."""
    return isinstance(value, (bool, np.bool_)) and bool(value)
