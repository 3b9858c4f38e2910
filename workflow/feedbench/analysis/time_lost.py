"""Time a cell lost outside its steady state: the first batch and the epoch boundaries' stalls,
named in the verdict when either costs more than LOST_SHARE of the run (the persistent_workers
fix), and the slower cells whose boundaries explain why they are slower."""

from __future__ import annotations

import pandas as pd

from .labels import words
from .stages import column_median
from .values import number, text

# the first batch or the epoch stalls are named in the verdict above this share of the run
LOST_SHARE = 0.05


def time_lost(ok: pd.DataFrame) -> dict:
    """What a cell's finished repeats lost outside their steady state (medians): the first batch,
    the epoch boundaries' stalls and the data wait's p99; window_s, the measured window they are set
    against."""
    columns = {
        "first_batch_s": "time_to_first_batch_s",
        "wait_p99_ms": "wait_ms_p99",
        "epoch_stall_ms": "epoch_stall_ms",
        "epoch_stall_s": "epoch_stall_s",
        "epoch_boundaries": "epoch_boundaries",
        "window_s": "window_s",
    }
    return {key: column_median(ok, column) for key, column in columns.items()}


def time_lost_parts(cell: dict | None) -> list[str]:
    """The first batch and the epoch boundaries, each named when it costs more than LOST_SHARE of
    the run.

    The run is what a training run of this length waits through: the first batch, then the measured
    window (which holds the epoch boundaries' stalls; their cost is what they waited beyond the
    median wait).
    """
    window = number((cell or {}).get("window_s"))
    if not window:
        return []
    first = number(cell.get("first_batch_s")) or 0.0
    stalls = number(cell.get("epoch_stall_s")) or 0.0
    run = first + window
    parts = []
    if first > LOST_SHARE * run:
        workers = number(cell.get("workers_ran"))
        # without workers no worker starts: the main process makes the first batch itself
        why = "the main process making it" if workers == 0 else "worker start-up"
        parts.append(
            f"the first batch took {first:.2f} s, {100 * first / run:.0f} % of the run ({why})"
        )
    if stalls > LOST_SHARE * run:
        count, each = (
            int(number(cell.get("epoch_boundaries")) or 0),
            number(cell.get("epoch_stall_ms")) or 0.0,
        )
        parts.append(
            f"{count} epoch boundaries stalled {each:.0f} ms each (median), "
            f"{100 * stalls / run:.0f} % of the run; persistent_workers keeps the workers across "
            "epochs"
        )
    return parts


def time_lost_note(
    best: dict | None, base: dict | None, cells: pd.DataFrame | None = None
) -> str | None:
    """The verdict's note on time lost to the first batch or to epoch boundaries: the best cell's,
    then the baseline's when it is another cell, then the slower cells' epoch stalls
    (slower_at_boundaries); None when none costs more than LOST_SHARE of its run."""
    notes = []
    for name, cell in (("best cell", best), ("baseline", base)):
        if cell is None or (
            name == "baseline" and best is not None and cell["cell"] == best["cell"]
        ):
            continue
        parts = time_lost_parts(cell)
        if parts:
            notes.append(f"{name} {words(cell)}: " + "; ".join(parts))
    slower = slower_at_boundaries(cells, best, base)
    if slower:
        notes.append(slower)
    return ". ".join(notes) + "." if notes else None


def slower_at_boundaries(
    cells: pd.DataFrame | None, best: dict | None, base: dict | None, most: int = 3
) -> str | None:
    """The cells slower than the baseline whose epoch stalls cost more than LOST_SHARE of their run
    (largest first, at most `most`): a short window that crosses a boundary restarts the workers, so
    more workers can measure slower than none for that alone, and `No measured cell is faster` would
    hide why. A cell that took another's result (measured_as) is left out: its figures are that
    cell's, named once."""
    if cells is None or base is None or number(base.get("median")) is None:
        return None
    named = {c["cell"] for c in (best, base) if c is not None}
    lost = []
    for cell in cells.to_dict("records"):
        window, stalls = number(cell.get("window_s")), number(cell.get("epoch_stall_s")) or 0.0
        median = number(cell.get("median"))
        if (
            cell["cell"] in named
            or text(cell.get("measured_as"))
            or not window
            or median is None
            or median >= float(base["median"])
        ):
            continue
        share = stalls / (window + (number(cell.get("first_batch_s")) or 0.0))
        if share > LOST_SHARE:
            lost.append((share, cell))
    if not lost:
        return None
    lost.sort(key=lambda found: -found[0])
    each = ", ".join(
        f"{words(c)} ({_boundaries(c)} at {number(c.get('epoch_stall_ms')) or 0.0:.0f} ms "
        f"(median), {100 * share:.0f} % of the run)"
        for share, c in lost[:most]
    )
    more = f" and {len(lost) - most} more" if len(lost) > most else ""
    return (
        f"Slower than the baseline, with epoch boundaries over {100 * LOST_SHARE:.0f} % of their "
        f"run: {each}{more}: their workers started again at each; persistent_workers keeps them"
    )


def _boundaries(cell: dict) -> str:
    count = int(number(cell.get("epoch_boundaries")) or 0)
    return f"{count} boundary" if count == 1 else f"{count} boundaries"
