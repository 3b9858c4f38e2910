"""A cell's stage profile from its summary rows (knob stage_timing): what each sample cost in the
loader, by stage.

One home for the verdict's sentence that names the costliest stage and the stacked bar of the
report, so both read the same numbers: per stage its mean ms per sample (the means add up to the
worker's ms per sample, medians would not) and its share of the worker's time, each the median over
the cell's finished repeats.
"""

from __future__ import annotations

import json
import re
import statistics

import pandas as pd

UNATTRIBUTED = "unattributed"  # harness.stages' name for a sample's time outside every named stage
_SHARE = re.compile(r"^stage_(.+)_share$")


def names(rows: pd.DataFrame) -> list[str]:
    """The stages these rows timed, in the summary's column order with `unattributed` last; []
    without stage timing."""
    found = [
        m.group(1) for m in map(_SHARE.match, rows.columns) if m and rows[m.group(0)].notna().any()
    ]
    return [n for n in found if n != UNATTRIBUTED] + [n for n in found if n == UNATTRIBUTED]


def column_median(rows: pd.DataFrame, column: str) -> float | None:
    """The median of a summary column over `rows` (numbers only); None where the column is absent or
    empty."""
    values = pd.to_numeric(rows[column], errors="coerce").dropna() if column in rows else ()
    return float(values.median()) if len(values) else None


def profile(rows: pd.DataFrame) -> dict | None:
    """One cell's stages from its finished repeats: {"worker_ms", "stages": {name: (mean ms,
    share)}}; None when it has no stage timing."""
    stages = {}
    for name in names(rows):
        share = column_median(rows, f"stage_{name}_share")
        if share is not None:
            stages[name] = (column_median(rows, f"stage_{name}_mean_ms") or 0.0, share)
    worker = column_median(rows, "stage_worker_ms")
    return {"worker_ms": worker, "stages": stages} if stages and worker else None


def profiled_functions(rows: pd.DataFrame) -> list[tuple[str, float, float]]:
    """The functions the profile of one cell's warm-up named (harness.profile; summary column
    stage_profile), each (module:qualname, share of a sample's CPU time, CPU ms per sample), medians
    over the repeats that named it, the costliest first; [] without a profile."""
    found: dict[str, list[tuple[float, float]]] = {}
    for text in rows["stage_profile"].dropna() if "stage_profile" in rows else ():
        for name, share, ms in json.loads(text):
            if share is not None:
                found.setdefault(name, []).append((share, ms))
    named = [
        (name, statistics.median(s for s, _ in values), statistics.median(m for _, m in values))
        for name, values in found.items()
    ]
    return sorted(named, key=lambda f: -f[1])


def function_rows(rows: pd.DataFrame) -> list[dict]:
    """Per cell of an experiment (its finished repeats), the functions its profile named: the
    report's table."""
    ok = rows[rows["status"] == "ok"] if "status" in rows else rows
    return [
        {"cell": cell, "name": name, "share": share, "ms": ms}
        for cell, group in ok.groupby("cell", sort=False)
        for name, share, ms in profiled_functions(group)
    ]


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def named_functions(rows: pd.DataFrame) -> str | None:
    """The profile's costliest function in words, and the second where it holds a tenth of the time
    too: "97 % of a sample's loader CPU time is in text_pipeline.tokenize:tokenize (1.7 ms per
    sample)"; None without a profile."""
    found = profiled_functions(rows)
    if not found:
        return None
    name, share, ms = found[0]
    said = (
        f"{100 * share:.0f} % of a sample's loader CPU time is in {name} ({_ms(ms)} ms per sample)"
    )
    if len(found) > 1 and found[1][1] >= 0.1:
        said += f", {100 * found[1][1]:.0f} % in {found[1][0]} ({_ms(found[1][2])} ms)"
    return said


def culprit(rows: pd.DataFrame) -> str | None:
    """The costliest stage of one cell in words, for a data-bound verdict; None without stage
    timing.

    `unattributed` is never named as a stage: when it is the largest part, the sentence names the
    functions the profile of the warm-up found costliest (named_functions), or, without one, says
    that most of the time lies outside the named stages, and where to mark more.
    """
    found = profile(rows)
    if found is None:
        return None
    name, (ms, share) = max(found["stages"].items(), key=lambda item: item[1][1])
    whole = f"each sample's {_ms(found['worker_ms'])} ms in the loader"
    if name == UNATTRIBUTED:
        profiled = named_functions(rows)
        if profiled:
            # what the profile found, and how to make it a stage the what-ifs can cache (knob
            # stage_functions)
            return f"{profiled}, outside the named stages (stage_functions makes it one)"
        return (
            f"the largest part of {whole}, {100 * share:.0f} % ({_ms(ms)} ms), is outside the "
            "named stages (feedbench.stage marks more)"
        )
    return f"{100 * share:.0f} % of {whole} is {name} ({_ms(ms)} ms per sample)"
