"""Why more loader workers do not help: the verdict's cores sentence (core.cores.cpu_load).

A cell is oversubscribed when its loader workers and its trainer (its intra-op threads where the
model computes on the CPU, else its main process) ask for more cores than it may use, and its
workers are CPU-bound or use, beside the trainer, more CPU than it has (core.cores.crowded).
Workers added beyond that take the cores the trainer's threads need, so a cell with more workers
than the best one that is oversubscribed names the reason they did not make it faster: on 2 cores, a
trainer of 2 threads and 2 CPU-bound workers ask for 4.
"""

from __future__ import annotations

import pandas as pd

from .labels import words


def _count(value) -> int | None:
    return None if value is None or pd.isna(value) else int(round(float(value)))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def sentence(cell: dict) -> str:
    """What an oversubscribed cell's workers and trainer asked of its cores."""
    workers, trainer = _count(cell.get("num_workers")), _count(cell.get("trainer_cores")) or 1
    demand, usable = _count(cell.get("demand_cores")), _count(cell.get("usable_cores"))
    # workers that mostly wait (a full queue) crowd the cores by the CPU they do use
    kind = "worker" if cell.get("workers_kind") == "waiting" else "CPU-bound worker"
    asked = f"its {_plural(workers, kind)}" if workers is not None else f"its {kind}s"
    beside = f"{_plural(trainer, 'intra-op thread')}" if trainer > 1 else "main process"
    ranks = (
        ""
        if not demand or workers is None or demand == workers + trainer
        else " (per rank, on every rank)"
    )
    return (
        f"cell {words(cell)} is oversubscribed: {asked} and the trainer's {beside}{ranks} ask "
        f"for {demand} cores of the {usable} usable"
    )


def note(cells: pd.DataFrame, best: dict | None) -> str | None:
    """The verdict's cores note: the cells with more workers than the best cell that are
    oversubscribed, named as why more workers do not help; None when none is (or the experiment does
    not vary its workers)."""
    if best is None or "oversubscribed" not in cells or "num_workers" not in cells:
        return None
    most = _count(best.get("num_workers"))
    flagged = cells["oversubscribed"].map(lambda flag: flag is True or flag == 1.0)
    beyond = cells[flagged & (pd.to_numeric(cells["num_workers"], errors="coerce") > (most or 0))]
    if most is None or beyond.empty:
        return None
    why = "; ".join(sentence(c) for c in beyond.to_dict("records"))
    trainers = pd.to_numeric(beyond.get("trainer_cores", pd.Series(dtype=float)), errors="coerce")
    crowded = (trainers > 1).any()
    tail = (
        "the workers take the cores the trainer's threads compute on"
        if crowded
        else "the workers wait for a core"
    )
    lead = (
        f"more loader workers than the best cell's {most} do not help here, the cores are "
        "oversubscribed"
    )
    return f"{lead}: {why}; {tail}."
