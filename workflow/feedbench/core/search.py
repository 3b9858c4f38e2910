"""`search: num_workers`: run training cells only around the predicted knee of the worker axis.

The ceilings of every cell of the experiment are measured first (`ceilings: true` is implied): the
loader alone at every worker level, compute, the copy. A Snakemake checkpoint
(workflow/rules/search.smk) then predicts every training cell from them (analysis.predict) and
keeps, for each combination of the experiment's other axes, three worker levels: the predicted knee
(the fewest workers whose prediction reaches 95 % of the best prediction of the combination), one
level below it and one above. The experiment's baseline cell (the first level of every axis) always
runs too, so the verdict keeps its speedup. An `include` cell is a combination of its own (one
level, so it runs as written). A combination whose ceilings did not all give a prediction (a failed
ceiling) runs every level: nothing is skipped on a guess.

So a 16-level worker axis with no other axis runs at most 4 training cells; with a pin_memory axis
of 2 levels, at most 2 x 3 + 1.

This module is pure logic (no torch, no pandas): feedbench.plan.matrix checks the option with it
while the Snakefile parses, the checkpoint's script decides with it.
"""

from __future__ import annotations

import json
from typing import Any

from .ceilings import KNEE_REACHES
from .knobs import KNOBS, SEARCHABLE, ConfigError, shown


def axis_of(spec: Any) -> Any:
    """The axis a `search` names: `search: num_workers`, or the mapping's `axis`."""
    return spec.get("axis") if isinstance(spec, dict) else spec


def beyond_cores(spec: Any) -> bool:
    """Whether a `search` may take a knee whose loader ceiling was oversubscribed (`beyond_cores:
    true`)."""
    return isinstance(spec, dict) and spec.get("beyond_cores") is True


def check(name: str, experiment: dict, defaults: dict) -> None:
    """`experiments.<name>.search` names a searchable axis of >= 2 levels of a single-process
    training experiment."""
    spec = experiment.get("search")
    if spec is None:
        return
    where = f"experiments.{name}.search"
    if isinstance(spec, dict) and not isinstance(spec.get("beyond_cores", False), bool):
        raise ConfigError(
            f"{where}.beyond_cores: value {shown(spec['beyond_cores'])} has the wrong type; "
            "allowed: true or false"
        )
    axis = axis_of(spec)
    if axis not in SEARCHABLE:
        raise ConfigError(
            f"{where}: value {shown(axis)} is not allowed; allowed: {', '.join(SEARCHABLE)}"
        )
    levels = (experiment.get("matrix") or {}).get(axis)
    if not isinstance(levels, list) or len(levels) < 2:
        raise ConfigError(
            f"{where}: the matrix has no {axis} axis of 2 levels or more; allowed: "
            f"{', '.join(SEARCHABLE)} with a matrix axis {axis} of at least 2 levels"
        )
    knobs = {**defaults, **(experiment.get("base") or {})}
    for key in ("scenario", "parallel"):
        if key in (experiment.get("matrix") or {}):
            raise ConfigError(
                f"{where}: the matrix varies {key}; allowed: {axis} with one {key} for every cell"
            )
    scenario = knobs.get("scenario", KNOBS["scenario"].default)
    parallel = knobs.get("parallel", KNOBS["parallel"].default)
    if scenario not in ("train", "loader") or parallel != "none":
        raise ConfigError(
            f"{where}: the cells are scenario {scenario}, parallel {parallel}, which have no "
            f"prediction; allowed: {axis} on single-process training or loader cells (scenario "
            "train or loader, parallel none)"
        )


def checkpointed(experiment: dict, defaults: dict) -> bool:
    """Whether a searched experiment's cells wait for checkpoint search: training cells do. Loader
    cells (the loader alone) are each their own loader ceiling: every level runs, and the report
    reads the knee from them (measured_plan)."""
    knobs = {**defaults, **(experiment.get("base") or {})}
    return knobs.get("scenario", KNOBS["scenario"].default) == "train"


def measured_plan(
    experiment: str, axis: str, groups: list[dict], baseline: str, beyond: bool = False
) -> dict:
    """The decision of a search whose every level ran (loader cells): the shape plan() writes, every
    level chosen. groups: one per combination of the other axes, {"knobs": ..., "cells": {level:
    cell id}}."""
    why = "the loader alone: every level runs, each its own loader ceiling"
    decided = [
        {
            "knobs": group["knobs"],
            "predicted": [],
            "cpu": [],
            "predicted_knee": None,
            "knee": None,
            "levels": sorted(group["cells"]),
            "cells": [group["cells"][level] for level in sorted(group["cells"])],
            "why": why,
        }
        for group in groups
    ]
    run = [baseline] + [c for g in decided for c in g["cells"] if c != baseline]
    return _decision(experiment, axis, beyond, groups, baseline, decided, run)


def _decision(
    experiment: str, axis: str, beyond: bool, groups: list[dict], baseline: str, decided, run
) -> dict:
    """The shape of a search's decision (results/search/<experiment>.json), whichever way its levels
    were chosen."""
    return {
        "experiment": experiment,
        "axis": axis,
        "beyond_cores": beyond,
        "levels": sorted({level for group in groups for level in group["cells"]}),
        "baseline": baseline,
        "groups": decided,
        "run": run,
    }


def knee(predictions: dict[Any, float | None]) -> Any | None:
    """The fewest workers whose predicted samples/s reaches KNEE_REACHES of the best; None when a
    prediction is missing."""
    if not predictions or any(p is None for p in predictions.values()):
        return None
    best = max(predictions.values())
    return min(level for level, p in predictions.items() if p >= KNEE_REACHES * best)


def around(levels: list, centre: Any) -> list:
    """The level `centre` with its neighbours in increasing order of `levels`: one below and one
    above."""
    ordered = sorted(levels)
    at = ordered.index(centre)
    return ordered[max(at - 1, 0) : at + 2]


def capped(found: Any, cpu: dict[Any, dict], beyond: bool = False) -> tuple[Any, str | None]:
    """(the knee the cores allow, why the search stopped there or None): a predicted knee whose
    loader ceiling was oversubscribed (CPU-bound workers beyond the usable cores,
    core.cores.cpu_load) falls back to the most workers below it that were not, unless `beyond` (the
    search's beyond_cores)."""
    at = cpu.get(found) or {}
    if beyond or found is None or not at.get("oversubscribed"):
        return found, None
    fits = [
        level
        for level in sorted(cpu)
        if level < found and not (cpu[level] or {}).get("oversubscribed")
    ]
    stop = fits[-1] if fits else min(cpu)
    share = at.get("runnable_share")
    runnable = f", runnable {100 * share:.0f} % of the time" if share is not None else ""
    return stop, (
        f"stopped at {_workers(stop)} by the cores: at {_text(found)}, the predicted knee, the "
        f"loader's CPU-bound workers{runnable} and its main process asked for "
        f"{at.get('demand_cores')} cores and it had {at.get('usable_cores')} (beyond_cores: true "
        "lets the knee pass them)"
    )


def choose(
    predictions: dict[Any, float | None], cpu: dict[Any, dict] | None = None, beyond: bool = False
):
    """(knee, the levels to run, why it stopped) of one combination of the other axes: the knee
    (capped by the cores, `capped`) and its neighbours, or every level when some prediction is
    missing."""
    found = knee(predictions)
    if found is None:
        return None, sorted(predictions), "a ceiling gave no prediction: every level runs"
    stop, why = capped(found, cpu or {}, beyond)
    if why is None:
        why = (
            "the predicted knee: more workers are predicted to add less than "
            f"{100 * (1 - KNEE_REACHES):.0f} %"
        )
    return stop, around(list(predictions), stop), why


def plan(
    experiment: str, axis: str, groups: list[dict], baseline: str, beyond: bool = False
) -> dict:
    """The checkpoint's decision, written as results/search/<experiment>.json.

    groups: one per combination of the other axes, each {"knobs": {other axis: level}, "cells":
    {level: cell id}, "predicted": {level: samples/s or None}, "cpu": {level: its loader ceiling's
    cpu (core.cores.cpu_load)}}, "cpu" optional. The baseline and every chosen cell id are in "run".
    """
    decided = []
    run = [baseline]
    for group in groups:
        cpu = group.get("cpu") or {}
        found, levels, why = choose(group["predicted"], cpu, beyond)
        cells = [group["cells"][level] for level in levels]
        run += [c for c in cells if c not in run]
        decided.append(
            {
                "knobs": group["knobs"],
                "predicted": [
                    {axis: level, "samples_per_s": p} for level, p in group["predicted"].items()
                ],
                "cpu": [{axis: level, **(load or {})} for level, load in cpu.items()],
                "predicted_knee": knee(group["predicted"]),
                "knee": found,
                "levels": levels,
                "cells": cells,
                "why": why,
            }
        )
    return _decision(experiment, axis, beyond, groups, baseline, decided, run)


def sentence(decision: dict) -> str:
    """What the report says of a search: `searched: 16 levels, ran 3: 4, 6, 8 workers (predicted
    knee 6)`."""
    parts = []
    for group in decision["groups"]:
        where = ", ".join(f"{k} {_text(v)}" for k, v in group["knobs"].items())
        levels = ", ".join(_text(v) for v in group["levels"])
        predicted = group.get("predicted_knee", group["knee"])
        knee_text = (
            f"predicted knee {_text(group['knee'])}" if group["knee"] is not None else group["why"]
        )
        # the cores stopped it below the predicted knee
        if group["knee"] is not None and predicted != group["knee"]:
            knee_text = group["why"]
        ran = f"ran {len(group['levels'])}: {levels} workers ({knee_text})"
        parts.append(f"{where}: {ran}" if where else ran)
    chosen = {cell for group in decision["groups"] for cell in group["cells"]}
    baseline = (
        "" if decision["baseline"] in chosen else f"; and the baseline cell {decision['baseline']}"
    )
    return (
        f"searched: {len(decision['levels'])} levels of {decision['axis']}, "
        + "; ".join(parts)
        + baseline
    )


def dry_run_line(experiment: str, axis: str, levels: list, groups: int) -> str:
    """The line a dry run prints before the ceilings exist: what the checkpoint will decide."""
    most = 3 * groups + 1
    return (
        f"search {experiment}: after the ceilings, a checkpoint predicts every {axis} level ("
        f"{len(levels)} levels: {', '.join(_text(v) for v in sorted(levels))}) and runs only the "
        "predicted knee, one level below and one above"
        f"{' for each combination of the other axes' if groups > 1 else ''}, plus the baseline: "
        f"at most {most} training cells (results/search/{experiment}.json)"
    )


def read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _workers(count: Any) -> str:
    return f"{_text(count)} worker{'' if count == 1 else 's'}"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
