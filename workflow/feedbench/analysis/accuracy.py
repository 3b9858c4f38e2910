"""How well the prediction held: the error over all predicted cells, and predicted against measured
on a figure.

The report shows both (analysis.report); the prediction itself is analysis.predict's, in the
summary's predicted_samples_per_s and prediction_error_pct columns. A cell counts once: its median
over repeats.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ..core.ceilings import batch_bytes
from . import verdict
from .aggregate import knob_value
from .plots import plain, plain_text, svg_text
from .predict import predict
from .stages import column_median


def what_if(row, cpu: float = 1.0, copy: float = 1.0) -> float | None:
    """The prediction of a summary row on hardware the user does not have: `cpu` times the CPU cores
    for the loader (a loader with workers scales with them; the main process of num_workers 0 does
    not) and `copy` times the host-to-device bandwidth. A prediction, never a measurement."""
    knobs = {k: row.get(k) for k in ("model", "dataset", "input_size", "image_size", "batch_size")}
    workers = knob_value(row, "num_workers")
    loader = row.get("ceiling_loader_samples_per_s")
    bandwidth = row.get("ceiling_copy_gb_per_s")
    size = batch_bytes(knobs) if bandwidth and not pd.isna(bandwidth) else None
    predicted, _bound, _terms = predict(
        loader * (cpu if workers else 1.0),
        row.get("ceiling_compute_samples_per_s"),
        workers,
        knob_value(row, "batch_size"),
        size,
        bandwidth * copy if size else None,
        row.get("device_prefetch") == "stream",
    )
    return predicted


def predicted_cells(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per predicted cell with a measurement: experiment, cell, measured and predicted
    medians, error %, and the what-ifs: the prediction with 2x CPU cores for the loader and with 2x
    copy bandwidth."""
    columns = [
        "experiment",
        "cell",
        "measured",
        "predicted",
        "error_pct",
        "bound",
        "source",
        "with_2x_cpu",
        "with_2x_copy",
    ]
    if "prediction_error_pct" not in summary:
        return pd.DataFrame(columns=columns)
    rows = summary[(summary["status"] == "ok") & summary["prediction_error_pct"].notna()]
    cells = (
        rows.groupby(["experiment", "cell"], sort=False)
        .agg(
            measured=("samples_per_s", "median"),
            predicted=("predicted_samples_per_s", "median"),
            error_pct=("prediction_error_pct", "median"),
            bound=("predicted_bound", "first"),
            source=("predicted_from", "first")
            if "predicted_from" in rows
            else ("predicted_bound", lambda _: None),
        )
        .reset_index()
    )
    first = rows.drop_duplicates(["experiment", "cell"]).to_dict("records")
    # A stage what-if's ceilings are its baseline's: doubling them predicts the baseline, not the
    # cell. Left out.
    ceilings = [
        not str(row.get("predicted_from") or "").startswith("stage what-if") for row in first
    ]
    cells["with_2x_cpu"] = [
        what_if(row, cpu=2) if own else None for row, own in zip(first, ceilings, strict=True)
    ]
    cells["with_2x_copy"] = [
        what_if(row, copy=2) if own else None for row, own in zip(first, ceilings, strict=True)
    ]
    return in_units(cells, summary)[columns + ["unit"]]


def in_units(cells: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """The cells' rates (measured, predicted, the what-ifs), counted in samples/s, in their
    experiment's unit (verdict.unit: tokens/s where the pipeline counts tokens), with that unit; the
    error is the same in either."""
    cells = cells.copy()
    factors, measured, units = [], [], []
    for experiment, cell in zip(cells["experiment"], cells["cell"], strict=True):
        own = summary[summary["experiment"] == experiment]
        ok, metric = own[(own["cell"] == cell) & (own["status"] == "ok")], verdict.objective(own)
        factors.append(verdict.per_sample(ok, metric))
        measured.append(column_median(ok, metric))  # as the experiment's cell table shows it
        units.append(verdict.unit(own))
    # NaN where a cell counts no tokens to scale by
    factor = pd.Series(factors, index=cells.index, dtype=float)
    for column in ("predicted", "with_2x_cpu", "with_2x_copy"):
        cells[column] = pd.to_numeric(cells[column], errors="coerce") * factor
    cells["measured"], cells["unit"] = pd.Series(measured, index=cells.index, dtype=float), units
    return cells


def error_summary(cells: pd.DataFrame) -> dict | None:
    """Cells predicted, the median error and the worst one (largest in size, with its sign and
    cell); None if none."""
    if cells.empty:
        return None
    worst = cells.loc[cells["error_pct"].abs().idxmax()]
    return {
        "cells": len(cells),
        "median_pct": float(cells["error_pct"].median()),
        "median_abs_pct": float(cells["error_pct"].abs().median()),
        "worst_pct": float(worst["error_pct"]),
        "worst_cell": f"{worst['experiment']}/{worst['cell']}",
    }


def figure(cells: pd.DataFrame) -> Figure:
    """Measured against predicted, one point per cell in its experiment's unit (named in the
    legend), log-log, with the identity line (a perfect model)."""
    with plain_text():
        fig = Figure(figsize=(5.5, 5), layout="constrained")
        ax = fig.subplots()
        low = min(cells["measured"].min(), cells["predicted"].min()) / 1.2
        high = max(cells["measured"].max(), cells["predicted"].max()) * 1.2
        ax.plot(
            [low, high],
            [low, high],
            color="0.5",
            linestyle="--",
            label="identity: measured = predicted",
        )
        for (experiment, unit), group in cells.groupby(["experiment", "unit"], sort=False):
            ax.scatter(group["predicted"], group["measured"], label=plain(f"{experiment} [{unit}]"))
        ax.set(
            xscale="log",
            yscale="log",
            xlim=(low, high),
            ylim=(low, high),
            xlabel="predicted (from the ceilings)",
            ylabel="measured (median of repeats)",
        )
        ax.legend(fontsize="small")
    return fig


def whatif_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The predicted cells that ran a stage what-if, predicted from their baseline's profile
    (analysis.whatifs)."""
    return cells[cells["source"].astype(str).str.startswith("stage what-if")]


def report_context(summary: pd.DataFrame) -> dict | None:
    """What the report's prediction section shows: the error summary (and that of the stage what-ifs
    alone), the cells and the figure; None with no cell."""
    cells = predicted_cells(summary)
    found = error_summary(cells)
    if found is None:
        return None
    whatifs = error_summary(whatif_cells(cells))
    return {
        **found,
        "whatifs": whatifs,
        "rows": cells.to_dict("records"),
        "svg": svg_text(figure(cells), salt="prediction"),
    }
