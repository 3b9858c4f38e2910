"""A cell's stage profile from its summary rows (knob stage_timing): what each sample cost in the loader, by stage.

One home for the verdict's sentence that names the costliest stage and the stacked bar of the report, so both read
the same numbers: per stage its mean ms per sample (the means add up to the worker's ms per sample, medians would
not) and its share of the worker's time, each the median over the cell's finished repeats.
"""

from __future__ import annotations

import re

import pandas as pd

UNATTRIBUTED = "unattributed"  # harness.stages' name for a sample's time outside every named stage
_SHARE = re.compile(r"^stage_(.+)_share$")


def names(rows: pd.DataFrame) -> list[str]:
    """The stages these rows timed, in the summary's column order with `unattributed` last; [] without stage timing."""
    found = [m.group(1) for m in map(_SHARE.match, rows.columns) if m and rows[m.group(0)].notna().any()]
    return [n for n in found if n != UNATTRIBUTED] + [n for n in found if n == UNATTRIBUTED]


def column_median(rows: pd.DataFrame, column: str) -> float | None:
    """The median of a summary column over `rows` (numbers only); None where the column is absent or empty."""
    values = pd.to_numeric(rows[column], errors="coerce").dropna() if column in rows else ()
    return float(values.median()) if len(values) else None


def profile(rows: pd.DataFrame) -> dict | None:
    """One cell's stages from its finished repeats: {"worker_ms", "stages": {name: (mean ms, share)}}; None when it
    has no stage timing."""
    stages = {}
    for name in names(rows):
        share = column_median(rows, f"stage_{name}_share")
        if share is not None:
            stages[name] = (column_median(rows, f"stage_{name}_mean_ms") or 0.0, share)
    worker = column_median(rows, "stage_worker_ms")
    return {"worker_ms": worker, "stages": stages} if stages and worker else None


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def culprit(rows: pd.DataFrame) -> str | None:
    """The costliest stage of one cell in words, for a data-bound verdict; None without stage timing.

    `unattributed` is never named as a stage: when it is the largest part, the sentence says that most of the time lies
    outside the named stages, and where to mark more.
    """
    found = profile(rows)
    if found is None:
        return None
    name, (ms, share) = max(found["stages"].items(), key=lambda item: item[1][1])
    whole = f"each sample's {_ms(found['worker_ms'])} ms in the loader"
    if name == UNATTRIBUTED:
        return (
            f"the largest part of {whole}, {100 * share:.0f} % ({_ms(ms)} ms), is outside the named stages"
            " (feedbench.stage marks more)"
        )
    return f"{100 * share:.0f} % of {whole} is {name} ({_ms(ms)} ms per sample)"
