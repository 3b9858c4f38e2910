"""The worker count with its proof: for each combination a `search: num_workers` decided, one
sentence from the cells it ran.

It names the recommended count (the fewest measured workers within KNEE_REACHES of the best
measured, among the levels that are not oversubscribed unless the search has beyond_cores), the
throughput measured there with its 95 % interval as a share of the compute ceiling, the memory and
shared memory it holds against the limits, the measured cells one below and one above that confirm
the knee (or do not), and the limit that stops further workers: the cores, memory, shared memory or
nothing. What each figure measures: docs/harness.md, "Searching the knee".
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from ..core import search
from ..core.ceilings import KNEE_REACHES
from ..core.cores import most_workers
from .stages import column_median

# The summary's columns this sentence reads when the results have them: the workers' memory (the
# monitor's summed PSS, its mean over the run) and the memory the cell may use (absent until the
# results record one: then no limit is named). Shared memory: core.shm.facts as the cell's loader
# started.
WORKER_MEMORY = "workers_pss_mb_mean"
MEMORY_LIMIT = "memory_limit_mb"
SHM_IN_FLIGHT, SHM_FREE = "shm_in_flight_bytes", "shm_free_bytes"


def _workers(count) -> str:
    return f"{count} worker{'' if count == 1 else 's'}"


def recommended(measured: dict, beyond: bool):
    """The level to recommend among the measured levels {level: cell record}: the knee of their
    medians (core.search's rule, the fewest within KNEE_REACHES of the best), counting only levels
    not oversubscribed unless `beyond`."""
    allowed = {
        level: c for level, c in measured.items() if beyond or not c.get("oversubscribed")
    } or measured
    return search.knee({level: c["median"] for level, c in allowed.items()})


def _throughput(cell: dict, unit: str, number: Callable) -> str:
    interval = (
        f" (95 % interval {number(cell['low'])}–{number(cell['high'])})"
        if cell.get("low") is not None and not pd.isna(cell["low"])
        else " (one repeat: no interval)"
    )
    ceiling = cell.get("ceiling_compute")
    share = (
        f", {100 * cell['median'] / ceiling:.0f} % of the compute ceiling ({number(ceiling)} "
        f"{unit})"
        if ceiling
        else ", no compute ceiling measured"
    )
    return f"{number(cell['median'])} {unit}{interval}{share}"


def _memory(rows: pd.DataFrame, number: Callable) -> str:
    """What the recommended cell holds: its workers' memory and shared memory against the limits,
    where known."""
    parts = []
    pss, limit = column_median(rows, WORKER_MEMORY), column_median(rows, MEMORY_LIMIT)
    if pss is not None:
        of = (
            f" (PSS, mean) of the {number(limit)} MB the cell may use"
            if limit
            else " (PSS, mean; no limit recorded)"
        )
        parts.append(f"its workers hold {number(pss)} MB{of}")
    need, free = column_median(rows, SHM_IN_FLIGHT), column_median(rows, SHM_FREE)
    if need is not None:
        room = f" of {number(free / 2**20)} MB free" if free is not None else ""
        parts.append(f"{number(need / 2**20)} MB of shared memory in flight{room}")
    return "; ".join(parts) if parts else "no memory recorded"


def _neighbours(levels: list, at, measured: dict, unit: str, number: Callable) -> str:
    """The measured cells one below and one above the recommendation, and whether they confirm the
    knee: the one below short of KNEE_REACHES of it, the one above adding less than its
    complement."""
    ordered = sorted(levels)
    index, rate = ordered.index(at), measured[at]["median"]
    sides = {"below": ordered[index - 1] if index > 0 else None}
    sides["above"] = ordered[index + 1] if index + 1 < len(ordered) else None
    parts, checks = [], {}
    for side, level in sides.items():
        if level is None or level not in measured:
            parts.append(f"none {side}")
            continue
        other = measured[level]["median"]
        parts.append(f"{_workers(level)} {number(other)} {unit} ({100 * other / rate:.0f} %)")
        checks[side] = (
            other < KNEE_REACHES * rate if side == "below" else other <= rate / KNEE_REACHES
        )
    if not checks:
        verdict = "nothing confirms the knee"
    elif not all(checks.values()):
        verdict = (
            f"the level {' and '.join(s for s, ok in checks.items() if not ok)} does "
            "not confirm the knee"
        )
    elif len(checks) == 2:
        verdict = "they confirm the knee"
    else:
        verdict = f"the knee is confirmed from {next(iter(checks))} only"
    return f"the neighbours measured: {', '.join(parts)}; {verdict}"


def _cores(value) -> int:
    return int(round(float(value)))


def _trainer(cell: dict) -> int:
    """The cores each rank's trainer asks for (core.cores.trainer_cores); 1 in results before it."""
    value = cell.get("trainer_cores")
    return 1 if value is None or pd.isna(value) else _cores(value)


def _threads(trainer: int) -> str:
    """Beside a core count: the trainer's threads it includes, when they are more than its one main
    process."""
    return f" (the trainer's {trainer} intra-op threads among them)" if trainer > 1 else ""


def _cpu(cell: dict, number: Callable) -> str:
    """Which kind the recommended cell's workers are, against its cores (core.cores.cpu_load)."""
    cores = (
        f", {_cores(cell['demand_cores'])} cores asked of {_cores(cell['usable_cores'])} usable"
        if cell.get("demand_cores") and cell.get("usable_cores")
        else ""
    )
    if not cell.get("level"):
        return "no loader workers: the main process loads"
    kind = cell.get("workers_kind")
    # absent, or NaN in the summary when the monitor never sampled them
    if not isinstance(kind, str) or not kind:
        return f"its workers were not sampled (a run shorter than monitor_interval_s){cores}"
    share = cell.get("runnable_share")
    runnable = (
        f", runnable {100 * share:.0f} % of the time"
        if share is not None and not pd.isna(share)
        else ""
    )
    return f"its workers are {kind}{runnable}{cores}"


def _limit(
    at, above: dict | None, cell: dict, rows: pd.DataFrame, number: Callable, top: bool = False
) -> str:
    """What stops further workers: the cores (the next level oversubscribed, or more than fit),
    memory or shared memory (the next level's, grown by the workers added, over the limit), else
    nothing."""
    usable, demand, trainer = cell.get("usable_cores"), cell.get("demand_cores"), _trainer(cell)
    ranks = int(demand // (at + trainer)) if demand else 1
    if above is not None and above.get("oversubscribed"):
        return (
            f"the cores: {above['workers_kind']} workers at {_workers(above['level'])} asked for "
            f"{_cores(above['demand_cores'])} cores of {_cores(above['usable_cores'])}"
            f"{_threads(_trainer(above))}"
        )
    most = most_workers(_cores(usable), ranks, trainer) if usable else None
    if usable and cell.get("workers_kind") == "CPU-bound" and at >= most:
        return (
            f"the cores: {_cores(usable)} usable hold at most {_workers(most)}{_threads(trainer)}"
        )
    pss, limit = column_median(rows, WORKER_MEMORY), column_median(rows, MEMORY_LIMIT)
    if pss and limit and at and pss * (at + 1) / at > limit:
        return f"memory: one more worker would take the workers past {number(limit)} MB"
    need, free = column_median(rows, SHM_IN_FLIGHT), column_median(rows, SHM_FREE)
    if need and free is not None and at and need * (at + 1) / at > free:
        return (
            "shared memory: one more worker would need more than the "
            f"{number(free / 2**20)} MB free"
        )
    if above is None:
        return (
            f"nothing measured: the axis ends at {_workers(at)}, so a higher level may still be "
            "faster"
            if top
            else f"nothing measured: no level above {_workers(at)} ran or finished, so one "
            "may still be faster"
        )
    return (
        "nothing: no limit of cores, memory or shared memory is reached; more workers are "
        "not faster"
    )


def proof(
    decision: dict, cells: pd.DataFrame, rows: pd.DataFrame, unit: str, number: Callable = str
) -> list[str]:
    """One sentence per combination of the search's decision (core.search.plan), from the
    experiment's cell table (analysis.verdict.cell_table) and its summary rows; `number` formats a
    figure for people."""
    by_id = {c["cell"]: c for c in cells.to_dict("records")}
    sentences = []
    for group in decision["groups"]:
        where = ", ".join(f"{k} {v}" for k, v in group["knobs"].items())
        lead = f"{where}: " if where else ""
        found = {
            level: by_id.get(cell)
            for level, cell in zip(group["levels"], group["cells"], strict=True)
        }
        measured = {
            lvl: {**c, "level": lvl} for lvl, c in found.items() if c and pd.notna(c.get("median"))
        }
        if not measured:
            sentences.append(f"{lead}no cell the search ran finished: no worker count to recommend")
            continue
        at = recommended(measured, decision.get("beyond_cores", False))
        cell, ordered = measured[at], sorted(group["levels"])
        own = rows[(rows["cell"] == cell["cell"]) & (rows["status"] == "ok")]
        higher = [level for level in ordered if level > at]
        above = measured.get(higher[0]) if higher else None
        # the axis's last level, not only the last the search ran
        top = at == max(decision["levels"])
        limit = _limit(at, above, cell, own, number, top=top)
        neighbours = _neighbours(group["levels"], at, measured, unit, number)
        sentences.append(
            f"{lead}recommended: {_workers(at)}. Measured there: "
            f"{_throughput(cell, unit, number)}; {_cpu(cell, number)}; {_memory(own, number)}; "
            f"{neighbours}. Further workers are stopped by {limit}."
        )
    return sentences


def measured_search(
    name: str, spec: dict, cells: pd.DataFrame, knobs: list[str], baseline: str | None
) -> dict:
    """The decision of a search whose every level ran (loader cells, core.search.checkpointed), from
    the experiment's cell table: one group per combination of its other varying knobs."""
    axis = search.axis_of(spec["search"])
    others = [k for k in knobs if k != axis]
    groups: dict[str, dict] = {}
    for cell in cells.to_dict("records"):
        key = repr([cell.get(k) for k in others])
        group = groups.setdefault(key, {"knobs": {k: cell.get(k) for k in others}, "cells": {}})
        level = cell.get(axis)
        group["cells"][int(level) if level is not None and not pd.isna(level) else level] = cell[
            "cell"
        ]
    return search.measured_plan(
        name, axis, list(groups.values()), baseline, search.beyond_cores(spec["search"])
    )
