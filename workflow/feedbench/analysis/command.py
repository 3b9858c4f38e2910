"""A command experiment's own lines (knob command: the user's script run as it is), under its
verdict in the page and in verdict.txt: which of the script's loaders it trains on and what that
loader asks for, and how close the instrumented command stays to the command run alone.

From the summary's command columns (core.metric_table: training_loader, asked_num_workers,
fidelity_ratio, plain_samples_per_s, instrumented_samples_per_s, fidelity_note).
"""

from __future__ import annotations

import os
from typing import Callable

import pandas as pd

# The fidelity the instrument aims for: its time within this fraction of the plain command's.
FIDELITY_GOAL = 0.02


def _first(rows: pd.DataFrame, column: str):
    values = rows[column].dropna() if column in rows else []
    return values.iloc[0] if len(values) else None


def where(built_at: str, workdir: str | None) -> str:
    """`train.py:57 in train_dataloader`: the script's file relative to the command's folder."""
    path, _, rest = built_at.partition(":")
    if workdir and os.path.isabs(path) and path.startswith(workdir.rstrip(os.sep) + os.sep):
        path = os.path.relpath(path, workdir)
    return f"{path}:{rest}" if rest else path


def lines(rows: pd.DataFrame, number: Callable) -> list[str]:
    """The experiment's command lines; none for an experiment of other cells."""
    ok = rows[rows["status"] == "ok"] if "status" in rows else rows
    built_at = _first(ok, "training_loader")
    if built_at is None:
        return []
    baseline = ok[ok["baseline"] == True] if "baseline" in ok else ok  # noqa: E712 (a column)
    baseline = baseline if len(baseline) else ok
    asked = _first(baseline, "asked_num_workers")
    own = _first(baseline, "instrument_ms_per_step")
    found = [
        f"Your loop: it trains on the loader built at {where(built_at, _first(ok, 'workdir'))}, "
        "the one whose batches a backward pass follows"
        + (f"; that loader asks for num_workers={int(asked)}" if asked is not None else "")
        + (f"; feedbench's own code took {number(own)} ms of each step" if own is not None else "")
        + "."
    ]
    fidelity = fidelity_line(baseline, number)
    return found + ([fidelity] if fidelity else [])


def fidelity_line(baseline: pd.DataFrame, number: Callable) -> str | None:
    """How close the instrumented command stayed to the same command run alone, both whole (the
    baseline's first repeat); None where no such pair ran (fidelity: false)."""
    note = _first(baseline, "fidelity_note")
    if note:
        return f"Fidelity: {note}."
    ratio = _first(baseline, "fidelity_ratio")
    if ratio is None:
        return None
    plain = _first(baseline, "plain_samples_per_s")
    instrumented = _first(baseline, "instrumented_samples_per_s")
    seconds = _first(baseline, "plain_wall_s")
    change = (float(ratio) - 1) * 100
    how = (
        f"{change:.1f} % more time"
        if change >= 0
        else f"{-change:.1f} % less time (the two runs' noise)"
    )
    within = "within" if abs(change) <= FIDELITY_GOAL * 100 else "outside"
    return (
        f"Fidelity: run whole, start-up included, your command alone gave {number(plain)} "
        f"samples/s of training ({number(seconds)} s), instrumented {number(instrumented)} "
        f"samples/s: {how}, {within} the goal of {FIDELITY_GOAL * 100:g} %."
    )
