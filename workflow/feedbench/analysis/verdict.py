"""From the summary to answers: per-cell intervals, the baseline, the best cell, and what bounds it.

Statistics over repeats
    The centre is the median of the repeats (robust to one slow repeat). The
    95 % interval is Student's t interval of the mean, mean +- t(0.975, n-1) *
    sd / sqrt(n): with the 3 to 5 repeats a benchmark can afford, a bootstrap
    has too few distinct resamples to mean anything, while the t interval is
    honest about how little 3 numbers say (it is wide). For n <= 6 the median
    always lies inside it. One repeat gives no interval.

Bound classification (of a `train` cell, from the medians over its repeats)
    data      stall_pct >= 10: the trainer waits on the loader for at least
              10 % of each step (removing a 10 % stall gains at most 1.11x, so
              below that the input pipeline is not worth tuning);
    transfer  else the host-to-device copy takes >= 10 % of the step, counted
              only when the copy runs on the compute stream (device_prefetch
              none): a side-stream copy overlaps compute and bounds nothing by
              its share;
    compute   otherwise: the model itself is the limit.
    Whatever the bound, a cell whose trainer spends >= 10 % of each step on
    its own device work while it fetches the batch (device_prep:
    device_stages, torchvision-cuda) says so in its why, with its fix: that
    time is the trainer's, not the loader's (`device_prep_note`).
    Loader, compute and transfer cells are ceilings, not training runs: they
    are labelled `ceiling` and never classified. A data cell whose repeats
    timed their stages (knob stage_timing) adds its costliest stage to the
    why (analysis.stages.culprit).

Wording of a gain (`gain_wording`)
    A cell with fewer than 2 repeats has no interval, so its gain cannot be
    judged: the verdict says so instead of "within noise". When both
    intervals exist and overlap, it adds a rough power estimate: the fewest
    repeats per cell, more than were run, at which the best cell's 95 % t
    interval would lie above the baseline's (the test the verdict itself
    applies) with 80 % power, if the means and spreads stayed as measured:
    sqrt(n) gain >= t(0.975, n-1) (sd_best + sd_base) + z(0.8) sqrt(sd_best^2 + sd_base^2),
    solved by counting n up. Using the interval's own t quantiles keeps the
    estimate from naming a count that already overlaps. It is rough (3
    repeats estimate sd poorly) and the report says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import pandas as pd

from ..core.ceilings import LOADER_REACHES
from ..core.fit import twin_of
from ..core.knobs import KNOBS, PAYS_OFF
from . import cores, growth, other_load, stages
from .aggregate import as_requested, is_true, knob_value
from .labels import cell_labels, words
from .stages import column_median
from .time_lost import time_lost, time_lost_note
from .values import number, text
from .whatifs import changed_data
from .worker_load import workers_cpu

# by objective
UNITS = {"samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "transfer_peak_gb_per_s": "GB/s"}
DATA_STALL_PCT = 10.0
TRANSFER_SHARE = 0.10
# the trainer's device work while it fetches a batch is named from this share of the step
DEVICE_PREP_SHARE = 0.10

# Two-sided 95 % critical values of Student's t, t(0.975, df), from the standard table.
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}


def t975(df: int) -> float:
    """t(0.975, df); between tabulated values the next lower df is used (a slightly wider, safe
    interval)."""
    if df < 1:
        raise ValueError("an interval needs at least 2 values")
    if df > 120:
        return 1.960
    return _T975[max(k for k in _T975 if k <= df)]


@dataclass(frozen=True)
class Interval:
    n: int
    median: float | None
    mean: float | None
    low: float | None
    high: float | None
    # the t interval reached below zero for values that cannot (a throughput, a time): cut at 0
    cut: bool = False

    @property
    def below(self) -> float:
        """How far the interval reaches under the median: an error bar's lower arm (0 without an
        interval)."""
        return max(self.median - self.low, 0) if self.low is not None else 0.0

    @property
    def above(self) -> float:
        """How far the interval reaches over the median: an error bar's upper arm (0 without an
        interval)."""
        return max(self.high - self.median, 0) if self.high is not None else 0.0


def interval(values) -> Interval:
    """Median, mean and 95 % t interval of the mean over the finite values given. Of values none of
    which is negative (a throughput, a time), the interval never goes below zero: where the t
    interval's spread would take it there (3 repeats of which one ran far slower), it is cut at 0
    and says so (`cut`)."""
    finite = [
        float(v) for v in values if v is not None and not pd.isna(v) and math.isfinite(float(v))
    ]
    n = len(finite)
    if n == 0:
        return Interval(0, None, None, None, None)
    mean = statistics.fmean(finite)
    if n == 1:
        return Interval(1, finite[0], mean, None, None)
    half = t975(n - 1) * statistics.stdev(finite) / math.sqrt(n)
    cut = min(finite) >= 0 and mean - half < 0
    low = 0.0 if cut else mean - half
    return Interval(n, statistics.median(finite), mean, low, mean + half, cut)


def classify(
    scenario: str, stall_pct: float | None, h2d_share: float | None, device_prefetch: str | None
) -> tuple[str, str]:
    """(bound, why) for one cell from the medians of its repeats; the rule is in the module
    docstring."""
    if scenario != "train":
        return "ceiling", f"a {scenario} cell measures a ceiling, not a training run"
    stall = None if stall_pct is None or pd.isna(stall_pct) else float(stall_pct)
    h2d = None if h2d_share is None or pd.isna(h2d_share) else float(h2d_share)
    if stall is not None and stall >= DATA_STALL_PCT:
        return "data", f"waits on the loader {stall:.0f} % of each step (>= {DATA_STALL_PCT:.0f} %)"
    if h2d is not None and device_prefetch != "stream" and h2d >= TRANSFER_SHARE:
        return (
            "transfer",
            f"host-to-device copy takes {100 * h2d:.0f} % of each step (>= "
            f"{100 * TRANSFER_SHARE:.0f} %)",
        )
    stall_text = "unknown" if stall is None else f"{stall:.0f} %"
    return "compute", f"stall {stall_text} < {DATA_STALL_PCT:.0f} % and the copy is not the limit"


def device_prep_note(share: float | None) -> str | None:
    """The trainer's own device work between steps, where it costs DEVICE_PREP_SHARE of the step or
    more: it is the trainer's time, not the loader's, so more loader workers cannot shorten it. None
    below that, or unmeasured."""
    if share is None or pd.isna(share) or share < DEVICE_PREP_SHARE:
        return None
    return (
        "the trainer's device work on each batch (device_prep: device_stages, GPU decode) takes "
        f"{100 * share:.0f} % of each step: the trainer's time, not the loader's, so more "
        "workers cannot help; move the stages back to the loader's workers, or overlap them "
        "with the step on a side stream"
    )


def objective(rows: pd.DataFrame) -> str:
    """The throughput an experiment's configurations are judged by (higher is better), and so the
    unit of every rate the report shows for it (unit): tokens_per_s where its pipeline counts tokens
    (the built-in `tokens` dataset; a user's pipeline counts samples), the peak GB/s of a transfer
    probe, else samples_per_s."""
    if "scenario" in rows and len(rows) and (rows["scenario"] == "transfer").all():
        return "transfer_peak_gb_per_s"
    if "tokens_per_s" in rows and rows["tokens_per_s"].notna().any():
        return "tokens_per_s"
    return "samples_per_s"


def unit(rows: pd.DataFrame) -> str:
    """The unit of every rate of an experiment: its verdict, cell and what-if tables, the prediction
    and target sections, its plots' axes. Tokens/s everywhere or nowhere: decided here alone, from
    objective."""
    return UNITS[objective(rows)]


def per_sample(ok: pd.DataFrame, metric: str) -> float | None:
    """What a samples/s figure of a cell (a prediction, a ceiling, an estimate) is multiplied by to
    be in `metric`'s unit: 1, or where the pipeline counts tokens the cell's tokens per sample (its
    measured tokens/s over its samples/s); None where the cell measured neither."""
    if metric != "tokens_per_s":
        return 1.0
    tokens, samples = column_median(ok, "tokens_per_s"), column_median(ok, "samples_per_s")
    return tokens / samples if tokens and samples else None


def with_objectives(rows: pd.DataFrame) -> pd.DataFrame:
    """Add transfer_peak_gb_per_s: the best of pinned and pageable, the transfer cell's one
    number."""
    rows = rows.copy()
    peaks = [
        c for c in ("transfer_peak_gb_per_s_pinned", "transfer_peak_gb_per_s_pageable") if c in rows
    ]
    rows["transfer_peak_gb_per_s"] = rows[peaks].max(axis=1) if peaks else float("nan")
    return rows


def varying_knobs(rows: pd.DataFrame, first: list[str] | tuple = ()) -> list[str]:
    """Knobs whose value differs between the cells of an experiment (not between repeats of a cell);
    `first` (the matrix axes) lead."""
    per_cell = rows.groupby("cell", sort=False).first()
    order = [k for k in first if k in KNOBS] + [k for k in KNOBS if k not in first]
    return [
        k
        for k in order
        if k in per_cell and k != "seed" and knob_texts(per_cell[k], k).nunique() > 1
    ]


def knob_texts(column: pd.Series, knob: str) -> pd.Series:
    """A knob's values as text to compare, an unset one (cache_after of every cell but the cached
    one) as its default's: pandas' string columns keep NaN through astype(str), and nunique or ==
    would not count it."""
    if knob not in KNOBS:
        return column.map(lambda value: str(None if value is None or pd.isna(value) else value))
    return column.map(lambda value: str(knob_value({knob: value}, knob)))


def baseline_cell(rows: pd.DataFrame) -> str | None:
    """The cell labelled as its experiment's baseline (feedbench.plan.matrix marks it; the label
    travels through cell.yaml and result.json to the summary's `baseline` column). None when no row
    carries the label."""
    if "baseline" not in rows:
        return None
    cells = rows.loc[rows["baseline"].map(is_true), "cell"].unique()
    return cells[0] if len(cells) else None


def _no_baseline(rows: pd.DataFrame) -> str:
    """Why an experiment has no baseline: unlabelled results (written before the label existed) or
    none labelled."""
    if "baseline" not in rows or rows["baseline"].isna().all():
        return (
            "no baseline: these results do not say which cell is the baseline (they were written "
            "before results carried the label); rerun them for speedups"
        )
    return "no baseline: no cell of this experiment is labelled as its baseline"


def cell_table(rows: pd.DataFrame, axes: list[str] | tuple = ()) -> pd.DataFrame:
    """One row per cell of one experiment: its knobs that vary, repeats, the objective's interval,
    phases and bound."""
    rows = with_objectives(rows)
    metric = objective(rows)
    knobs = varying_knobs(rows, axes)
    table = []
    for cell, group in rows.groupby("cell", sort=False):
        # its quiet repeats where it has any: every figure of the row stands on the same ones
        quiet = other_load.kept(group[group["status"] == "ok"])
        ok = quiet.rows
        first = group.iloc[0]
        stats = interval(ok[metric]) if len(ok) else Interval(0, None, None, None, None)
        bound, why = classify(
            first.get("scenario"),
            column_median(ok, "stall_pct"),
            column_median(ok, "h2d_share"),
            first.get("device_prefetch"),
        )
        # the stage that costs the most, with stage timing
        culprit = stages.culprit(ok) if bound == "data" else None
        why += f"; {culprit}" if culprit else ""
        prep = device_prep_note(column_median(ok, "device_prep_share"))
        why += f"; {prep}" if prep else ""
        table.append(
            {
                "cell": cell,
                **{k: first[k] for k in knobs},
                "repeats": len(group),
                "failed": int((group["status"] != "ok").sum()),
                "metric": metric,
                "median": stats.median,
                "mean": stats.mean,
                "low": stats.low,
                "high": stats.high,
                "low_cut": stats.cut,
                "n": stats.n,
                "left_out": quiet.left_out,
                "disturbed": quiet.disturbed if stats.n else None,
                "ceilings_disturbed": _any_flag(ok, "ceilings_disturbed"),
                "step_ms": column_median(ok, "step_ms_median"),
                "stall_pct": column_median(ok, "stall_pct"),
                "h2d_share": column_median(ok, "h2d_share"),
                "device_prep_share": column_median(ok, "device_prep_share"),
                "gpus": gpu_count(first),
                # its loader workers, whether or not they vary (the time lost's first batch)
                "workers_ran": knob_value(first, "num_workers"),
                **time_lost(ok),  # the first batch, the epoch boundaries and the wait's tail
                # the workers' memory growth and the samples to the cell's memory limit
                **growth.figures(ok),
                # which kind its workers are, and whether they outnumber the cores
                **workers_cpu(ok),
                # analysis.predict's prediction from the cell's ceilings, when the summary has them
                # (else None).
                "predicted": in_unit(ok, metric, "predicted_samples_per_s"),
                "predicted_bound": first.get("predicted_bound")
                if isinstance(first.get("predicted_bound"), str)
                else None,
                "error_pct": column_median(ok, "prediction_error_pct"),
                "predicted_from": text(first.get("predicted_from")),
                # what a stage what-if traded (harness.whatif)
                "trades": text(first.get("whatif_trades")),
                "ceiling_loader": in_unit(ok, metric, "ceiling_loader_samples_per_s"),
                "ceiling_compute": in_unit(ok, metric, "ceiling_compute_samples_per_s"),
                "culprit": culprit,
                # the cell whose result this one took, where this machine runs both alike
                "measured_as": twin_of(first.get("adjustments")),
                "bound": bound if stats.n else "failed",
                "why": why if stats.n else "no repeat of this cell finished",
            }
        )
    table = pd.DataFrame(table)
    return (
        table.sort_values(knobs, key=natural_order, kind="stable").reset_index(drop=True)
        if knobs
        else table
    )


def _any_flag(ok: pd.DataFrame, column: str) -> bool | None:
    """Whether any of the rows sets a yes/no column; None where none holds a value."""
    flags = ok[column].dropna() if column in ok else ()
    return bool(flags.astype(bool).any()) if len(flags) else None


def in_unit(ok: pd.DataFrame, metric: str, column: str) -> float | None:
    """A samples/s column of a cell (a prediction, a ceiling) in the experiment's unit: where the
    pipeline counts tokens, times the cell's tokens per sample (its measured tokens/s over its
    samples/s), so that every figure of the experiment is in tokens/s or none is."""
    value, factor = column_median(ok, column), per_sample(ok, metric)
    return value * factor if value is not None and factor is not None else None


def gpu_count(row) -> int:
    """GPUs (or gloo "GPUs") a cell trains on: gpus_per_node x nodes unless it is one plain
    process."""
    parallel = knob_value(row, "parallel")
    if parallel == "none":
        return 1
    nodes = knob_value(row, "nodes") if parallel != "dp" else 1
    return int(knob_value(row, "gpus_per_node")) * int(nodes)


def add_scaling(cells: pd.DataFrame, base: dict) -> pd.DataFrame:
    """Speedup of every cell over the baseline; and, where the GPU count varies, the scaling
    efficiency: speedup / (GPUs / the baseline's GPUs), 1.0 being the ideal line."""
    cells = cells.copy()
    base_median = float(base["median"])
    cells["speedup"] = [
        float(m) / base_median if m is not None and not pd.isna(m) and base_median else None
        for m in cells["median"]
    ]
    if cells["gpus"].nunique() > 1:
        cells["efficiency"] = [
            s / (g / base["gpus"]) if s is not None else None
            for s, g in zip(cells["speedup"], cells["gpus"], strict=True)
        ]
    return cells


Z80 = 0.8416  # z(0.8): 80 % power
MOST_REPEATS = 1000  # above this the estimate says "more than 1,000"


def _sd(cell: dict) -> float | None:
    """The standard deviation over a cell's repeats, recovered from its t interval's upper half
    (half = t sd / sqrt(n); the lower one may be cut at 0)."""
    n, mean, high = cell.get("n"), cell.get("mean"), cell.get("high")
    if not n or n < 2 or mean is None or high is None or pd.isna(mean) or pd.isna(high):
        return None
    return (float(high) - float(mean)) / t975(int(n) - 1) * math.sqrt(int(n))


def repeats_to_separate(best: dict, base: dict) -> int | None:
    """Rough repeats per cell, always more than were run, at which the two 95 % t intervals would
    stop overlapping with 80 % power at the measured means and spreads (see the module docstring);
    MOST_REPEATS + 1 when even MOST_REPEATS would not; None without two intervals or without a
    gain."""
    sds = [_sd(best), _sd(base)]
    if None in sds or best.get("mean") is None or base.get("mean") is None:
        return None
    gain = float(best["mean"]) - float(base["mean"])
    if gain <= 0:
        return None
    run = min(int(best["n"]), int(base["n"]))
    for n in range(run + 1, MOST_REPEATS + 1):
        if math.sqrt(n) * gain >= t975(n - 1) * (sds[0] + sds[1]) + Z80 * math.hypot(*sds):
            return n
    return MOST_REPEATS + 1


def gain_wording(best: dict, base: dict, clear: bool) -> str:
    """What the verdict may honestly say about the gain of `best` over `base` (two cell-table
    rows)."""
    if best["cell"] == base["cell"]:
        return "this is the baseline"
    fewest = min(int(best.get("n") or 0), int(base.get("n") or 0))
    if fewest < 2:
        return (
            f"cannot be judged from {'one run' if fewest == 1 else 'no run'}: with fewer than 2 "
            "repeats a cell has no interval; 3 or more repeats give one, and their spread tells "
            "how many a gain this size needs"
        )
    if clear:
        return "clear: the 95 % intervals do not overlap"
    needed = repeats_to_separate(best, base)
    if needed is None:
        return "within noise: the 95 % intervals overlap"
    amount = f"more than {MOST_REPEATS:,}" if needed > MOST_REPEATS else f"about {needed}"
    return (
        f"within noise: the 95 % intervals overlap; {amount} repeats per cell would separate a "
        "gain this size at the measured spread (a rough power estimate: the intervals apart "
        "with 80 % power)"
    )


def natural_order(column: pd.Series) -> pd.Series:
    """Sort key: numbers by value (16 before 128), anything else by its text."""
    numbers = pd.to_numeric(column, errors="coerce")
    return numbers if numbers.notna().all() else column.astype(str)


def label_cells(rows: pd.DataFrame, cells: pd.DataFrame, axes: list[str]) -> list[str]:
    """The label of each cell of the cell table `cells` (analysis.labels): its matrix axes, then any
    other knob that varies, each as the matrix asked for it, so that two cells that differ only in
    a knob the harness adjusted (pin_memory on a CPU) keep different labels, as they keep their own
    bars in the plot."""
    knobs = varying_knobs(rows, axes)
    columns = [k for k in axes if k in rows] + [k for k in knobs if k not in axes]
    asked = as_requested(rows, columns)
    labelled = varying_knobs(asked, axes)
    asked = asked.drop_duplicates("cell").set_index("cell")
    sources = [
        asked.loc[cell["cell"]] if cell["cell"] in asked.index else cell
        for cell in cells.to_dict("records")
    ]
    return cell_labels(sources, labelled)


def labels_of(rows: pd.DataFrame, axes: dict | list | None = None) -> dict[str, str]:
    """Cell id -> its label, for an experiment's rows (a ceiling experiment's too)."""
    if rows.empty:
        return {}
    cells = rows.drop_duplicates("cell")
    return dict(zip(cells["cell"], label_cells(rows, cells, list(axes or [])), strict=True))


def summarize_experiment(rows: pd.DataFrame, axes: dict | list | None = None) -> dict:
    """The verdict of one experiment: its best cell, the speedup over the baseline, and what bounds
    the best cell.

    `axes` (the experiment's matrix, or its axis names) only orders the knobs; the baseline is the
    labelled cell.
    """
    axes = list(axes or [])
    cells = cell_table(rows, axes)
    # each cell in words (analysis.labels), as every sentence and the report name it
    cells["label"] = label_cells(rows, cells, axes)
    measured = cells[cells["median"].notna()]
    base_id = baseline_cell(rows)
    verdict = {
        "metric": objective(with_objectives(rows)),
        "knobs": varying_knobs(rows, axes),
        "cells": cells,
        "best": None,
        "baseline": None,
        "speedup": None,
        "clear": False,
        "note": None,
        "recommendation": None,
        "wording": None,
        "time_lost": None,
        "memory": None,
        "cores": None,
    }
    if measured.empty:
        verdict["note"] = "no cell of this experiment finished"
        return verdict
    # A cell that skipped stages (skip_stages) measured other data: never the best configuration or
    # the fix, unless all did.
    changed = changed_data(rows)
    kept = measured[~measured["cell"].isin(changed)]
    kept = measured if kept.empty else kept
    best = kept.loc[kept["median"].astype(float).idxmax()]
    verdict["best"] = best.to_dict()
    base = cells[cells["cell"] == base_id]
    if base_id is None:
        verdict["note"] = _no_baseline(rows)
    elif base["median"].isna().all():
        verdict["note"] = f"no speedup: the baseline, cell {words(base.iloc[0])}, did not finish"
    else:
        base = base.iloc[0]
        verdict["baseline"] = base.to_dict()
        verdict["cells"] = add_scaling(cells, verdict["baseline"])
        verdict["speedup"] = (
            float(best["median"]) / float(base["median"]) if base["median"] else None
        )
        # The gain is clear when the two 95 % intervals do not overlap.
        verdict["clear"] = bool(
            best["cell"] != base["cell"]
            and best["low"] is not None
            and base["high"] is not None
            and not pd.isna(best["low"])
            and not pd.isna(base["high"])
            and best["low"] > base["high"]
        )
        verdict["wording"] = gain_wording(verdict["best"], verdict["baseline"], verdict["clear"])
    fixes = verdict["cells"][~verdict["cells"]["cell"].isin(changed)]
    verdict["recommendation"] = recommend(fixes, verdict["baseline"], verdict["best"])
    verdict["time_lost"] = time_lost_note(verdict["best"], verdict["baseline"], verdict["cells"])
    verdict["memory"] = growth.note(cells)  # every cell whose workers grow, whichever is best
    # why more workers than the best's do not help, if the cores
    verdict["cores"] = cores.note(cells, verdict["best"])
    return verdict


def other_load_apart(cell: dict | None) -> bool:
    """Whether a cell's figures and its ceilings' ran under another load: one beside other load, the
    other not (analysis.other_load). A ceiling is never divided by such a figure."""
    mine, theirs = (cell or {}).get("disturbed"), (cell or {}).get("ceilings_disturbed")
    known = all(v is not None and not pd.isna(v) for v in (mine, theirs))
    return known and bool(mine) != bool(theirs)


def headspace(cell: dict | None) -> float | None:
    """How much faster the cell would train with free data by its compute ceiling: ceiling /
    measured - 1 (SPDL's headspace); None where the two ran under another load
    (other_load_apart)."""
    if not cell or other_load_apart(cell):
        return None
    ceiling, measured = number(cell.get("ceiling_compute")), number(cell.get("median"))
    return ceiling / measured - 1 if ceiling and measured else None


def wait_allows(cell: dict | None) -> float | None:
    """The most a cell could gain with free data by its own wait share: 1 / (1 - stall), the step
    without its wait; None where the wait was not measured."""
    stall = number((cell or {}).get("stall_pct"))
    return 100 / (100 - stall) if stall is not None and 0 <= stall < 100 else None


def free_data(cell: dict | None) -> tuple[float | None, str | None]:
    """How many times faster the cell could train with free data, from the same repeats as its wait
    share: the compute ceiling over its median, never above what its wait share allows
    (wait_allows); and, where the ceiling reaches further, why the rest is not the data's. (None,
    None) without a headspace."""
    room = headspace(cell)
    if room is None:
        return None, None
    factor, allows = 1 + room, wait_allows(cell)
    if allows is None or round(factor, 1) <= round(allows, 1):
        return min(factor, allows or factor), None
    return allows, (
        f"its compute ceiling runs {factor:.1f}x its speed, but the rest is the step's own "
        "compute, slower in training than alone (other load, or loader workers on its cores)"
    )


def headspace_text(cell: dict) -> str | None:
    """A cell's headspace in plain words: how many times faster training could run with free data
    (free_data). A negative one is no headspace: the cell measured above its compute ceiling (noise,
    or a ceiling measured under other load), so the ceiling does not bound it and the sentence says
    so. None without a headspace."""
    value = headspace(cell)
    if value is None:
        return None
    if value >= 0:
        factor, rest = free_data(cell)
        return f"with free data, training could run {factor:.1f}x faster" + (
            f"; {rest}" if rest else ""
        )
    above = 1 / (1 + value) - 1  # measured / ceiling - 1
    return (
        f"measured above its compute ceiling by {100 * above:.0f} %: the ceiling is not a bound "
        "here (noise, or a ceiling measured under other load); rerun the ceilings beside it"
    )


def _same_but(cells: pd.DataFrame, cell: dict, knob: str) -> pd.DataFrame:
    """The cells that differ from `cell` in `knob` alone (among the knobs the cell table shows)."""
    others = [k for k in cells.columns if k in KNOBS and k != knob]
    mask = knob_texts(cells[knob], knob) != str(knob_value(cell, knob))
    for k in others:
        mask &= knob_texts(cells[k], k) == str(knob_value(cell, k))
    return cells[mask & cells["median"].notna()]


def _span(cell: dict) -> str:
    return f"{float(cell['low']):,.0f}-{float(cell['high']):,.0f}"


def pays_off(cells: pd.DataFrame, cell: dict) -> list[str]:
    """Whether pinning and stream prefetch pay for themselves, each measured beside `cell`: the gain
    of the cell with the knob on over the same cell with it off, and what its 95 % intervals allow
    one to say (gain_wording)."""
    found = []
    for knob, label, on in PAYS_OFF:
        if knob not in cells or cells[knob].astype(str).str.lower().nunique() < 2:
            continue
        pair = [cell, *_same_but(cells, cell, knob).to_dict("records")[:1]]
        if len(pair) < 2:
            continue
        with_it, without = sorted(pair, key=lambda c: str(c.get(knob)).lower() != on)
        if str(with_it.get(knob)).lower() != on or not without.get("median"):
            continue
        spans = [number(c.get(k)) for c in (with_it, without) for k in ("low", "high")]
        # the intervals do not overlap
        clear = None not in spans and (spans[0] > spans[3] or spans[1] < spans[2])
        gain = float(with_it["median"]) / float(without["median"]) - 1
        # clear, within noise, cannot be judged ...
        wording = gain_wording(with_it, without, clear).split(":")[0]
        wording = "clear loss" if clear and gain < 0 else wording
        if None not in spans:
            wording = f"95 % intervals {_span(with_it)} with, {_span(without)} without: {wording}"
        found.append(f"{label} {100 * gain:+.0f} % ({wording})")
    return found


def _reaching(cells: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The predicted cells whose loader keeps the model fed at its compute ceiling, and those that
    would but are oversubscribed (given no prediction)."""
    reaching = cells[
        cells["predicted"].notna()
        & cells["ceiling_loader"].notna()
        & cells["ceiling_compute"].notna()
    ]
    reaching = reaching[reaching["ceiling_loader"] >= LOADER_REACHES * reaching["ceiling_compute"]]
    # Without workers the main process loads, then trains (the prediction adds the two): a fast
    # loader alone does not keep the model fed there, only a prediction that reaches the compute
    # ceiling does.
    serial = reaching["num_workers"].astype(float) == 0 if "num_workers" in reaching else False
    reaching = reaching[
        ~serial | (reaching["predicted"] >= LOADER_REACHES * reaching["ceiling_compute"])
    ]
    # Workers and a trainer's threads that ask for more cores than the cell has slow the trainer
    # below its compute ceiling, which the prediction does not count: no prediction for them.
    over = (
        reaching["oversubscribed"].map(lambda flag: flag is True or flag == 1.0)
        if "oversubscribed" in reaching
        else pd.Series(False, index=reaching.index)
    )
    return reaching[~over], reaching[over]


def recommend(cells: pd.DataFrame, base: dict | None, best: dict | None) -> dict | None:
    """The headspace of the baseline and the best cell, and the fix: of the cells whose loader
    ceiling reaches the compute ceiling (within 5 %), the one with the fewest workers (then the
    highest prediction), with its predicted samples/s, and whether pinning and stream prefetch pay
    for themselves there (pays_off); one sentence for the top of the verdict. None when no cell of
    the experiment was predicted."""
    if "predicted" not in cells or not cells["predicted"].notna().any():
        return None
    found = {"headspace_baseline": headspace(base), "headspace_best": headspace(best), "cell": None}
    reaching, crowded_out = _reaching(cells)
    subject = base or best
    lead = f"{subject['bound']}-bound" if subject else "predicted"
    # a data-bound cell's costliest stage (stage timing)
    culprit = subject.get("culprit") if subject else None
    details = [culprit] if isinstance(culprit, str) else []
    room = headspace_text(base) if base else None
    details += [room] if room else []
    lead += f": {'; '.join(details)}" if details else ""
    if reaching.empty:
        found["gains"] = pays_off(cells, best) if best else []
        found["sentence"] = f"{lead}; no measured loader configuration reaches the compute ceiling"
        if len(crowded_out):
            first = crowded_out.iloc[0].to_dict()
            found["sentence"] += (
                f" and leaves the trainer its cores ({cores.sentence(first)}: no prediction is "
                "given for it, the trainer's threads wait for the cores its workers take)"
            )
        found["sentence"] += "".join(f"; {gain}" for gain in found["gains"])
        return found
    workers = (
        reaching["num_workers"].astype(float)
        if "num_workers" in reaching
        else pd.Series(0, index=reaching.index)
    )
    pick = (
        reaching.assign(_w=workers, _p=-reaching["predicted"].astype(float))
        .sort_values(["_w", "_p"])
        .iloc[0]
    )
    # a prediction never above its ceiling (the what-ifs' model is scaled on a measured figure)
    predicted = min(float(pick["predicted"]), float(pick["ceiling_compute"]))
    share = predicted / float(pick["ceiling_compute"])
    has_workers = "num_workers" in pick and not pd.isna(pick["num_workers"])
    count = int(pick["num_workers"]) if has_workers else None
    how = [f"{count} worker{'' if count == 1 else 's'} per GPU"] if has_workers else []
    how += ["pinned memory"] if is_true(pick.get("pin_memory")) else []
    how += ["stream prefetch"] if pick.get("device_prefetch") == "stream" else []
    found.update(cell=pick["cell"], predicted=predicted, share=share, how=how[0] if how else None)
    fix = how[0] if how else f"cell {words(pick)}"
    fix += f" with {' and '.join(how[1:])}" if how[1:] else ""
    found["gains"] = pays_off(cells, pick.drop(["_w", "_p"]).to_dict())
    unit = UNITS.get(str(pick.get("metric")), "samples/s")
    # a measured cell is said measured: its figure wins over the prediction
    measured = number(pick.get("median"))
    found["measured"] = measured
    reached = 100 * (measured or 0.0) / float(pick["ceiling_compute"])
    found["fix"] = (
        f"{fix} measured {measured:,.0f} {unit}, {reached:.0f} % of the compute ceiling "
        f"(predicted {predicted:,.0f} {unit})"
        if measured is not None
        else f"{fix} should reach {100 * share:.0f} % of the compute ceiling (predicted "
        f"{predicted:,.0f} {unit})"
    )
    found["sentence"] = f"{lead}; {found['fix']}" + "".join(f"; {gain}" for gain in found["gains"])
    return found
