"""An experiment's verdict in three plain lines, read in ten seconds: the finding, where, and the
fix.

    finding  is training starved, and by how much: "Training waits for data 40 % of each step; with
             free data it could run 1.6x faster." (a ceiling experiment: the most its part
             delivers);
    where    the loader stage that costs the most (analysis.stages.culprit: the stage summary the
             cell table's bound names too), the copy, or the model's step;
    fix      the best measured change over the baseline, its speedup, its interval and, where it was
             predicted, the prediction's error; else the ceilings' predicted fix, or the stage
             what-if predicted fastest. Every figure says whether it was measured or predicted.

When the cell the ceilings recommend is not the fastest measured one, or the fastest one is
oversubscribed, one more sentence (`why`) says why, so the two never stand side by side unexplained.
Each line names the part of the section that proves it (`links`: anchors of the cell table, the
stage chart, the what-ifs). Figures are in the experiment's unit; `number` formats them (the
report's fmt).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pandas as pd

from . import cores, other_load, stages
from .labels import words
from .values import number
from .verdict import device_prep_note, free_data, other_load_apart


def _value(cell: dict | None, key: str) -> float | None:
    return number((cell or {}).get(key))


def _flag(value) -> bool:
    """A yes/no column of the cell table set (True, numpy's True, 1.0), not False or missing."""
    return value is not None and not pd.isna(value) and bool(value)


def changed(best: dict, base: dict, knobs: list[str]) -> str:
    """What the best cell changes from the baseline, knob=value, in the knobs' own names."""
    parts = []
    for k in knobs:
        value, was = best.get(k), base.get(k)
        if str(value) != str(was):
            value = (
                "none" if value is None or (isinstance(value, float) and pd.isna(value)) else value
            )
            value = int(value) if isinstance(value, float) and value.is_integer() else value
            parts.append(f"{k}={str(value).lower() if str(value) in ('True', 'False') else value}")
    return ", ".join(parts) or "another cell"


def _free_data(subject: dict) -> str:
    """The finding's free-data clause: the factor its wait share allows (verdict.free_data), or why
    none is given."""
    factor, rest = free_data(subject)
    if other_load_apart(subject):
        ran = (
            "ran beside other load and the cell did not"
            if subject.get("ceilings_disturbed")
            else "ran on a quiet machine and the cell beside other load"
        )
        return f"; no free-data factor: its compute ceiling {ran} (rerun both alone)"
    if factor is None or round(factor, 1) <= 1.0:
        return ""
    return f"; with free data it could run {factor:.1f}x faster" + (f"; {rest}" if rest else "")


def finding(subject: dict, found: dict, scenario: str, unit: str, number: Callable) -> str:
    """Is the step starved, and by how much (the baseline's bound; a ceiling's most), from the same
    repeats of the same cell; and how many of them ran beside other load."""
    bound, stall = subject["bound"], _value(subject, "stall_pct")
    name = "the baseline" if subject is found.get("baseline") else "the best cell"
    load = other_load.words(subject, name)
    load = f"; {load}" if load else ""
    faster = _free_data(subject)
    if bound == "data":
        return f"Training waits for data {stall:.0f} % of each step{faster}{load}."
    if bound == "transfer":
        share = 100 * (_value(subject, "h2d_share") or 0)
        return (
            f"Training waits for the host-to-device copy {share:.0f} % of each step{faster}{load}."
        )
    if bound == "compute":
        data = (
            f"data costs {stall:.0f} % of each step"
            if stall is not None
            else "the data wait is not measured"
        )
        return f"Training is limited by compute; {data}{faster}{load}."
    best = found["best"]
    what = {
        "loader": "The loader alone delivers up to",
        "compute": "The model alone, its data already on the device, trains at up to",
        "transfer": "The host-to-device copy peaks at",
    }.get(scenario, "The best cell measures")
    return f"{what} {number(best['median'])} {unit} (a ceiling, not a training run){load}."


def where(subject: dict, found: dict, rows: pd.DataFrame, scenario: str, number: Callable) -> str:
    """Which part costs the time: the loader stage (the stage summary), the copy, the model's step;
    and the trainer's own device work on each batch, where it is large
    (verdict.device_prep_note)."""
    part = _part(subject, found, rows, scenario, number)
    prep = device_prep_note(_value(subject, "device_prep_share"))
    return f"{part} Also {prep}." if prep else part


def _part(subject: dict, found: dict, rows: pd.DataFrame, scenario: str, number: Callable) -> str:
    bound = subject["bound"]
    culprit = subject.get("culprit")
    # the loader alone: its costliest stage, when it timed them
    if bound == "ceiling" and scenario == "loader":
        culprit = stages.culprit(
            rows[(rows["cell"] == found["best"]["cell"]) & (rows["status"] == "ok")]
        )
    if isinstance(culprit, str) and culprit:
        return f"{culprit[0].upper()}{culprit[1:]}."
    if bound in ("data", "ceiling") and scenario in ("train", "loader"):
        return "In the loader; its stages were not timed (stage_timing: true names the costliest)."
    if bound == "transfer":
        return "In the host-to-device copy, on the compute stream (device_prefetch: none)."
    step = _value(subject, "step_ms")
    if bound == "compute" or scenario == "compute":
        return (
            f"In the model's step ({number(step)} ms a step)." if step else "In the model's step."
        )
    return "In the copy alone, by copy size and pinning (its plot)."


def _interval(cell: dict, number: Callable) -> str:
    """The cell's 95 % interval; one cut at zero says why (verdict.interval)."""
    low, high = _value(cell, "low"), _value(cell, "high")
    if low is None or high is None:
        return ""
    why = (
        " (cut at 0: its repeats spread wider than their mean, so the interval says little)"
        if _flag(cell.get("low_cut"))
        else ""
    )
    return f", 95 % interval {number(low)}–{number(high)}{why}"


def _against_prediction(cell: dict, unit: str, number: Callable) -> str:
    """The prediction's error beside a measured figure, when the cell was predicted."""
    error, predicted = _value(cell, "error_pct"), _value(cell, "predicted")
    if error is None or predicted is None:
        return ""
    side = "above" if error >= 0 else "below"
    return f", {abs(error):.1f} % {side} its prediction ({number(predicted)} {unit} predicted)"


def _measured_whatif(found: dict, whatif: dict, base: str) -> bool:
    """Whether a cell of the experiment measured the what-if `whatif` of the baseline `base`: its
    figure then wins over the prediction."""
    cells, knob = found.get("cells"), whatif.get("knob")
    if cells is None or knob not in cells or "predicted_from" not in cells:
        return False
    wanted = json.dumps([whatif["stage"]]) if knob == "skip_stages" else whatif["stage"]
    return any(
        str(cell.get(knob)) == wanted
        and _value(cell, "median") is not None
        and cell.get("predicted_from") == f"stage what-if of {base}"
        for cell in cells.to_dict("records")
    )


def _predicted_fix(found: dict, whatifs: list[dict], unit: str, number: Callable) -> str | None:
    """The ceilings' fix, else the baseline's fastest stage what-if: predicted, never measured (a
    measured one is said by why_not, or is among the measured cells)."""
    recommendation = found.get("recommendation") or {}
    base = found.get("baseline") or found["best"]
    # the baseline as it is: no fix
    picked = recommendation.get("fix") and recommendation.get("cell") != base["cell"]
    if picked and recommendation.get("measured") is None:
        return f"Predicted, not measured: {recommendation['fix']}."
    # a cache that freezes a random stage changes the augmentation, and a what-if predicted at or
    # below the baseline's measured rate gains nothing: never the fix
    measured = _value(base, "median") or 0.0
    own = [
        w
        for w in whatifs
        if w["cell"] == base["cell"]
        and (w.get("predicted") or 0.0) > measured
        and not w.get("frozen")
        and not _measured_whatif(found, w, base["cell"])
    ]
    if own:
        top = max(own, key=lambda w: w["predicted"])
        gain = top["predicted"] / float(base["median"]) if base.get("median") else None
        times = f", {gain:.2f}x" if gain else ""
        return (
            f"Predicted, not measured: {top['stage']} {top['what']}: {number(top['predicted'])} "
            f"{unit}{times} (a matrix axis of cache_after, skip_stages or device_stages measures "
            "it)."
        )
    return None


def fix(found: dict, whatifs: list[dict], unit: str, number: Callable) -> str:
    """The best measured change and its figures, else the predicted one; always saying which."""
    best, base = found["best"], found["baseline"]
    if base is not None and best["cell"] != base["cell"] and found.get("speedup"):
        what = changed(best, base, found["knobs"])
        figures = f"{number(best['median'])} {unit}{_interval(best, number)}"
        gain = (
            f"measured {found['speedup']:.2f}x ({figures}){_against_prediction(best, unit, number)}"
        )
        # the repeats beside other load, last: they bear on every figure before them
        load = other_load.words_of([(base, "the baseline"), (best, what)])
        load = f"; {load}" if load else ""
        if found["clear"]:
            return f"{what}: {gain}{load}."
        predicted = _predicted_fix(found, whatifs, unit, number)
        noise = found["wording"].split(":")[0]  # within noise, cannot be judged ...
        if noise.startswith("cannot be judged"):  # in plain words, what to rerun
            noise += f"; set repeats: 3 and rerun to judge {found['speedup']:.2f}x"
        return f"No change is clearly faster: the best, {what}, {gain}, {noise}{load}." + (
            f" {predicted}" if predicted else ""
        )
    predicted = _predicted_fix(found, whatifs, unit, number)
    if predicted:
        return predicted
    # and what the experiment measured of pinning and stream prefetch, if it did
    if best["bound"] == "compute":
        gains = "".join(
            f"; {gain}" for gain in (found.get("recommendation") or {}).get("gains", [])
        )
        return f"None in the input pipeline: a faster step needs a faster model or device{gains}."
    if best["bound"] == "ceiling":
        return "None to make: a ceiling bounds the training cells predicted from it."
    if found.get("recommendation"):
        return "No measured cell is faster than the baseline."
    return "No measured cell is faster than the baseline, and none was predicted."


def why_not(found: dict, unit: str, number: Callable) -> str | None:
    """One sentence when the fix the ceilings predict is not the fastest cell, or the fastest is
    oversubscribed."""
    best, cells = found["best"], found["cells"]
    pick = (found.get("recommendation") or {}).get("cell")
    if pick and pick != best["cell"]:
        cell = cells[cells["cell"] == pick].iloc[0].to_dict()
        how = found["recommendation"].get("how") or f"cell {words(cell)}"
        error, predicted = _value(cell, "error_pct"), number(found["recommendation"]["predicted"])
        measured = (
            f": it measured {number(cell['median'])} {unit}"
            if _value(cell, "median") is not None
            else ""
        )
        if error is not None:
            measured += (
                f", {abs(error):.0f} % {'above' if error >= 0 else 'below'} its "
                f"prediction ({predicted})"
            )
        reason = f"; {cores.sentence(cell)}" if _flag(cell.get("oversubscribed")) else ""
        base = found.get("baseline")
        # the ceilings saw no change beat the baseline: say that
        if base is not None and pick == base["cell"]:
            return f"The ceilings predicted no change beats the baseline{measured}{reason}."
        return f"Not the ceilings' pick, {how}{measured}{reason}."
    if _flag(best.get("oversubscribed")):
        crowded = cores.sentence(best)
        return (
            f"The fastest cell is oversubscribed ({crowded}): it holds only while nothing "
            "else needs those cores."
        )
    return None


def lines(
    found: dict, rows: pd.DataFrame, unit: str, whatifs: list[dict], number: Callable = str
) -> dict | None:
    """The three lines (and the why, or None) of one experiment's verdict; None when no cell
    finished."""
    best = found["best"]
    if best is None:
        return None
    subject = found["baseline"] or best
    scenario = (
        str(rows["scenario"].dropna().iloc[0])
        if "scenario" in rows and rows["scenario"].notna().any()
        else ""
    )
    found_lines = {
        "finding": finding(subject, found, scenario, unit, number),
        "where": where(subject, found, rows, scenario, number),
        "fix": fix(found, whatifs, unit, number),
        "why": why_not(found, unit, number),
    }
    # The part of the section that proves each line: the stage chart for a stage, the what-ifs for a
    # what-if.
    timed = stages.profile(rows[rows["cell"] == subject["cell"]]) if "cell" in rows else None
    from_whatif = any(f" {w['what']}: " in found_lines["fix"] for w in whatifs)
    found_lines["proof"] = {
        "finding": "cells",
        "where": "stages" if timed else "cells",
        "fix": "whatifs" if from_whatif else "cells",
    }
    return found_lines
