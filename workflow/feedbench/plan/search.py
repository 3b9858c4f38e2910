"""`search: num_workers`: run training cells only around the predicted knee of the worker axis.

The ceilings of every cell of the experiment are measured first (`ceilings: true` is implied): the loader alone
at every worker level, compute, the copy. A Snakemake checkpoint (workflow/rules/search.smk) then predicts every
training cell from them (analysis.predict) and keeps, for each combination of the experiment's other axes, three
worker levels: the predicted knee (the fewest workers whose prediction reaches 95 % of the best prediction of the
combination), one level below it and one above. The experiment's baseline cell (the first level of every axis)
always runs too, so the verdict keeps its speedup. An `include` cell is a combination of its own (one level, so
it runs as written). A combination whose ceilings
did not all give a prediction (a failed ceiling) runs every level: nothing is skipped on a guess.

So a 16-level worker axis with no other axis runs at most 4 training cells; with a pin_memory axis of 2 levels,
at most 2 x 3 + 1.

This module is pure logic (no torch, no pandas): feedbench.plan.matrix checks the option with it while the Snakefile
parses, the checkpoint's script decides with it.
"""

from __future__ import annotations

import json
from typing import Any

from .ceilings import KNEE_REACHES
from .config import ConfigError
from .knobs import KNOBS, shown

# Axes a search may walk; the knobs `search` allows.
SEARCHABLE = ("num_workers",)


def check(name: str, experiment: dict, defaults: dict) -> None:
    """`experiments.<name>.search` names a searchable axis of >= 2 levels of a single-process training experiment."""
    axis = experiment.get("search")
    if axis is None:
        return
    where = f"experiments.{name}.search"
    if axis not in SEARCHABLE:
        raise ConfigError(f"{where}: value {shown(axis)} is not allowed; allowed: {', '.join(SEARCHABLE)}")
    levels = (experiment.get("matrix") or {}).get(axis)
    if not isinstance(levels, list) or len(levels) < 2:
        raise ConfigError(
            f"{where}: the matrix has no {axis} axis of 2 levels or more; allowed: {', '.join(SEARCHABLE)}"
            f" with a matrix axis {axis} of at least 2 levels"
        )
    knobs = {**defaults, **(experiment.get("base") or {})}
    for key in ("scenario", "parallel"):
        if key in (experiment.get("matrix") or {}):
            raise ConfigError(f"{where}: the matrix varies {key}; allowed: {axis} with one {key} for every cell")
    scenario = knobs.get("scenario", KNOBS["scenario"].default)
    parallel = knobs.get("parallel", KNOBS["parallel"].default)
    if scenario != "train" or parallel != "none":
        raise ConfigError(
            f"{where}: the cells are scenario {scenario}, parallel {parallel}, which have no prediction;"
            f" allowed: {axis} on single-process training cells (scenario train, parallel none)"
        )


def knee(predictions: dict[Any, float | None]) -> Any | None:
    """The fewest workers whose predicted samples/s reaches KNEE_REACHES of the best; None when a prediction is
    missing."""
    if not predictions or any(p is None for p in predictions.values()):
        return None
    best = max(predictions.values())
    return min(level for level, p in predictions.items() if p >= KNEE_REACHES * best)


def around(levels: list, centre: Any) -> list:
    """The level `centre` with its neighbours in increasing order of `levels`: one below and one above."""
    ordered = sorted(levels)
    at = ordered.index(centre)
    return ordered[max(at - 1, 0) : at + 2]


def choose(predictions: dict[Any, float | None]) -> tuple[Any | None, list]:
    """(knee, the levels to run) of one combination of the other axes: the knee and its neighbours, or every
    level when some prediction is missing."""
    found = knee(predictions)
    return found, (sorted(predictions) if found is None else around(list(predictions), found))


def plan(experiment: str, axis: str, groups: list[dict], baseline: str) -> dict:
    """The checkpoint's decision, written as results/search/<experiment>.json.

    groups: one per combination of the other axes, each {"knobs": {other axis: level}, "cells": {level: cell id},
    "predicted": {level: samples/s or None}}. The baseline and every chosen cell id are in "run".
    """
    decided = []
    run = [baseline]
    for group in groups:
        found, levels = choose(group["predicted"])
        cells = [group["cells"][level] for level in levels]
        run += [c for c in cells if c not in run]
        decided.append(
            {
                "knobs": group["knobs"],
                "predicted": [{axis: level, "samples_per_s": p} for level, p in group["predicted"].items()],
                "knee": found,
                "levels": levels,
                "cells": cells,
                "why": None if found is not None else "a ceiling gave no prediction: every level runs",
            }
        )
    levels = sorted({level for group in groups for level in group["cells"]})
    return {
        "experiment": experiment,
        "axis": axis,
        "levels": levels,
        "baseline": baseline,
        "groups": decided,
        "run": run,
    }


def sentence(decision: dict) -> str:
    """What the report says of a search: `searched: 16 levels, ran 3: 4, 6, 8 workers (predicted knee 6)`."""
    parts = []
    for group in decision["groups"]:
        where = ", ".join(f"{k} {_text(v)}" for k, v in group["knobs"].items())
        levels = ", ".join(_text(v) for v in group["levels"])
        knee_text = f"predicted knee {_text(group['knee'])}" if group["knee"] is not None else group["why"]
        ran = f"ran {len(group['levels'])}: {levels} workers ({knee_text})"
        parts.append(f"{where}: {ran}" if where else ran)
    chosen = {cell for group in decision["groups"] for cell in group["cells"]}
    baseline = "" if decision["baseline"] in chosen else f"; and the baseline cell {decision['baseline']}"
    return f"searched: {len(decision['levels'])} levels of {decision['axis']}, " + "; ".join(parts) + baseline


def dry_run_line(experiment: str, axis: str, levels: list, groups: int) -> str:
    """The line a dry run prints before the ceilings exist: what the checkpoint will decide."""
    most = 3 * groups + 1
    return (
        f"search {experiment}: after the ceilings, a checkpoint predicts every {axis} level ({len(levels)} levels:"
        f" {', '.join(_text(v) for v in sorted(levels))}) and runs only the predicted knee, one level below and one"
        f" above{' for each combination of the other axes' if groups > 1 else ''}, plus the baseline:"
        f" at most {most} training cells (results/search/{experiment}.json)"
    )


def read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
