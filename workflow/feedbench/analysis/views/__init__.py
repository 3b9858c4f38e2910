"""Study views: one experiment shown the way its published study showed it, with the study's numbers
beside ours.

An experiment opts in with `view: <name>` (and `reference: <csv>`, the name
of report/references/<csv>.csv; default: the view's name). A view builder
takes the experiment's summary rows (every status), the published table (or
None) and the experiment's spec, and returns a View: a short text saying what
it shows, tables (measured, published, side by side), an optional matplotlib
figure and a verdict line. The report renders it under the experiment; the
figure goes through the same SVG check as every other plot.

Absolute numbers are always labelled with the hardware they came from
(`hardware(rows)` for ours, the reference's `hardware` column for theirs):
speedups and efficiencies compare across machines, samples per second do not.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd
from matplotlib.figure import Figure

from ..verdict import gpu_count

# The views, by name; each lives in its own module of this package and registers its builder.
NAMES = ("prefetch", "workers", "scaling", "nmt", "breakdown", "datastall")


@dataclass
class Table:
    """A table for the page: a caption, column headings and rows of plain values (the template
    formats numbers)."""

    caption: str
    columns: list[str]
    rows: list[list]

    @classmethod
    def of(cls, frame: pd.DataFrame, caption: str) -> "Table":
        """From a DataFrame: its columns as headings, NaN as None (shown as '–')."""
        rows = [
            [None if not isinstance(v, (str, list, dict)) and pd.isna(v) else v for v in row]
            for row in frame.itertuples(index=False)
        ]
        return cls(caption, [str(c) for c in frame.columns], rows)


@dataclass
class View:
    name: str
    text: str  # what the view shows and how to read it (plain text; blank lines split paragraphs)
    tables: list[Table] = field(default_factory=list)
    figure: Figure | None = None
    verdict: str | None = None  # one line: the answer of this view
    # caveats: what could not be measured here and why
    notes: list[str] = field(default_factory=list)


Builder = Callable[[pd.DataFrame, "pd.DataFrame | None", dict], View]


def builder(name: str) -> Builder:
    """The `build(rows, reference, spec)` function of view `name` (module
    feedbench.analysis.views.<name>)."""
    if name not in NAMES:
        raise ValueError(f"view {name!r} is not one of {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}").build


def read_reference(path: str) -> pd.DataFrame:
    """A published table (report/references/<name>.csv); lines starting with # are comments."""
    return pd.read_csv(path, comment="#")


def measured(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows that measured something (status ok)."""
    return rows[rows["status"] == "ok"] if "status" in rows else rows


def hardware(rows: pd.DataFrame) -> str:
    """Where our numbers came from, for labels: 'NVIDIA H100 80GB HBM3 (host gpu7)' or 'CPU only
    (host laptop)'."""
    ok = measured(rows)
    gpus = sorted({str(g) for g in ok.get("gpu", pd.Series(dtype=object)).dropna()})
    hosts = sorted({str(h) for h in ok.get("host", pd.Series(dtype=object)).dropna()})
    where = f" (host {', '.join(hosts)})" if hosts else ""
    return (", ".join(gpus) if gpus else "CPU only") + where


def median_by(rows: pd.DataFrame, keys: list[str], values: list[str]) -> pd.DataFrame:
    """Median over repeats of each value column, per combination of keys (measured rows only), keys
    sorted naturally."""
    ok = measured(rows)
    if ok.empty:
        return pd.DataFrame(columns=[*keys, *values])
    present = [v for v in values if v in ok]
    frame = ok.groupby(keys, dropna=False)[present].median().reset_index()
    for v in values:
        if v not in frame:
            frame[v] = None
    return frame


# Helpers several views share.


def with_gpus(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with a `gpus` column: the GPUs each cell trains on
    (feedbench.analysis.verdict.gpu_count)."""
    return rows.assign(
        gpus=[gpu_count(r) for r in rows.to_dict("records")] if len(rows) else pd.Series(dtype=int)
    )


def unfinished(rows: pd.DataFrame, keys: list[str]) -> list[str]:
    """A note per cell none of whose repeats finished, named by its keys (those cells are missing
    from the view's tables)."""
    finished = set(measured(rows)["cell"]) if "cell" in rows else set()
    lost = (
        rows[~rows["cell"].isin(finished)].drop_duplicates("cell")
        if "cell" in rows
        else rows.iloc[0:0]
    )
    return [
        f"no repeat of {', '.join(f'{k}={r[k]}' for k in keys if k in r)} finished "
        f"({r.get('error_type') or 'failed'}): it is missing from the tables (see Failed cells)"
        for r in lost.to_dict("records")
    ]


def cpu_only(rows: pd.DataFrame) -> bool:
    """True when measured rows exist and none ran on a GPU (no `gpu` in their provenance)."""
    ok = measured(rows)
    return not ok.empty and ("gpu" not in ok or ok["gpu"].isna().all())


def common_notes(
    rows: pd.DataFrame, reference: pd.DataFrame | None, spec: dict, name: str
) -> list[str]:
    """Notes a view owes its reader when nothing was measured or no published table was given."""
    notes = (
        []
        if not measured(rows).empty
        else ["No cell of this experiment measured anything: the measured tables are empty."]
    )
    if reference is None:
        notes.append(
            f"No published table (report/references/{spec.get('reference') or name}.csv) was "
            "given to the report: only measured numbers are shown."
        )
    return notes
