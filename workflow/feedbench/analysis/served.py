"""The ceilings an experiment's training cells were predicted from, shown under that experiment in
the report.

`ceilings: true` adds cells of its own (feedbench.core.ceilings: the experiments `ceilings-loader`,
`ceilings-compute`, `ceilings-transfer`). They are not experiments anyone asked a question of: as
sections of their own they read as verdict rows with "no baseline". The report folds them under the
experiment they serve instead, with the cells of other experiments that serve it too (a `compute`
cell that is another's compute ceiling): which ceiling, which cell, the training cells it bounds,
and what it measured.

Which cells bound which training cell is the planner's map (results/ceilings.json,
feedbench.core.ceilings.ceiling_map). A report made without it folds each derived experiment under
every experiment whose config asks for ceilings (or a search, which needs them), without the cells
each one bounds.
"""

from __future__ import annotations

import pandas as pd

from ..core.ceilings import CEILING_EXPERIMENTS
from . import verdict

KINDS = ("loader", "compute", "transfer")  # the order a served experiment lists its ceilings in


def wanting(config: dict) -> list[str]:
    """The experiments whose config asks for ceilings, as feedbench.core.ceilings.ceiling_cells
    reads it."""
    experiments = (config or {}).get("experiments") or {}
    return [
        name
        for name, spec in experiments.items()
        if (spec or {}).get("ceilings") or (spec or {}).get("search")
    ]


def served(summary: pd.DataFrame, config: dict, links: dict | None) -> dict[str, list[dict]]:
    """Experiment -> its ceilings: [{kind, experiment, cell, derived, serves: [cell ids] or None}],
    loader first."""
    found: dict[str, dict[tuple, dict]] = {}
    if links is not None:
        for training, bounds in links.items():
            experiment, cell = training.split("/", 1)
            for kind in KINDS:
                if bounds.get(kind):
                    row = _row(found, experiment, kind, bounds[kind])
                    row["serves"].append(cell)
    else:
        present = (
            set(summary["experiment"].dropna().astype(str)) if "experiment" in summary else set()
        )
        for kind, name in CEILING_EXPERIMENTS.items():
            rows = summary[summary["experiment"] == name] if name in present else summary.iloc[0:0]
            for cell in rows["cell"].dropna().astype(str).unique():
                for experiment in wanting(config):
                    _row(found, experiment, kind, f"{name}/{cell}")["serves"] = None
    return {
        name: sorted(rows.values(), key=lambda r: KINDS.index(r["kind"]))
        for name, rows in found.items()
    }


def _row(found: dict, experiment: str, kind: str, source: str) -> dict:
    name, cell = source.split("/", 1)
    rows = found.setdefault(experiment, {})
    return rows.setdefault(
        (kind, source),
        {
            "kind": kind,
            "experiment": name,
            "cell": cell,
            "derived": name in CEILING_EXPERIMENTS.values(),
            "serves": [],
        },
    )


def folded(ceilings: dict[str, list[dict]]) -> set[str]:
    """The derived experiments shown under the experiments they serve, not as sections of their
    own."""
    return {row["experiment"] for rows in ceilings.values() for row in rows if row["derived"]}


def copied(summary: pd.DataFrame, experiment: str) -> set[str]:
    """The cells of `experiment` whose prediction has a copy term (the summary's ceiling_copy_from):
    a cell that ran on a CPU copies nothing, so the transfer probe the plan gave it (device auto)
    bounds nothing there."""
    if "ceiling_copy_from" not in summary:
        return set()
    rows = summary[(summary["experiment"] == experiment) & summary["ceiling_copy_from"].notna()]
    return set(rows["cell"].astype(str))


def measured(
    summary: pd.DataFrame, experiment: str, rows: list[dict], labels: dict[str, str]
) -> list[dict]:
    """The ceiling rows of `experiment` with what each cell measured (its cell table's median and 95
    % interval over the repeats, in its experiment's metric) and the short labels of the training
    cells it bounds (labels: cell id -> label); a transfer probe only where some cell's prediction
    used it (copied)."""
    tables: dict[str, pd.DataFrame] = {}
    out = []
    with_copy = copied(summary, experiment)
    for row in rows:
        if row["kind"] == "transfer":
            if not with_copy:
                continue
            row = {
                **row,
                "serves": None
                if row["serves"] is None
                else [c for c in row["serves"] if c in with_copy],
            }
            if row["serves"] == []:
                continue
        if row["experiment"] not in tables:
            own = summary[summary["experiment"] == row["experiment"]]
            tables[row["experiment"]] = (
                verdict.cell_table(own) if len(own) else pd.DataFrame(columns=["cell"])
            )
        table = tables[row["experiment"]]
        match = table[table["cell"] == row["cell"]].to_dict("records")
        cell = match[0] if match else {}
        serves = row["serves"]
        out.append(
            {
                **row,
                "serves": None if serves is None else [labels.get(c, c) for c in serves],
                "median": _value(cell.get("median")),
                "low": _value(cell.get("low")),
                "high": _value(cell.get("high")),
                "n": cell.get("n", 0),
                "repeats": cell.get("repeats", 0),
                # the ceiling experiment's own (verdict.unit)
                "unit": verdict.UNITS.get(cell.get("metric"), ""),
            }
        )
    return out


def _value(value):
    return None if value is None or pd.isna(value) else float(value)
