"""The trainer's threads against the launch's: the report's note where the knob `torch_threads`
changed them.

A cell's figures are for the threads its trainer ran with. Where the knob gave it other threads than
the launch gives an unmodified script (`python train.py` there: PyTorch's default or the launch's
OMP_NUM_THREADS, 1 per rank under torchrun's rule; the result's `launch_threads`), the job measured
is not the user's: on a CPU the threads decide whether loader workers help (docs/harness.md, "The
trainer's threads"). The note says so, and where the experiment measured a cell both ways (the same
knobs but torch_threads), gives both figures.
"""

from __future__ import annotations

import pandas as pd

from ..core.knobs import KNOBS

COLUMNS = ("torch_threads_used", "torch_threads_launch")


def _ints(values) -> str:
    return " or ".join(str(int(v)) for v in sorted(set(values)))


def _both(ok: pd.DataFrame, metric: str) -> list[str]:
    """'<knobs>: N threads X, M threads (the launch's) Y' for each group of cells equal but for
    torch_threads."""
    keys = [
        k for k in KNOBS if k in ok and k != "torch_threads" and ok[k].astype(str).nunique() > 1
    ]
    pairs = []
    for values, group in ok.groupby(
        [ok[k].astype(str) for k in keys] if keys else [ok["experiment"]]
    ):
        launch = group[group["torch_threads_used"] == group["torch_threads_launch"]]
        other = group[group["torch_threads_used"] != group["torch_threads_launch"]]
        if launch.empty or other.empty:
            continue
        where = ", ".join(f"{k}={v}" for k, v in zip(keys, values if keys else [], strict=False))
        by_threads = other.groupby("torch_threads_used")[metric].median()
        figures = [f"{int(t)} threads {rate:,.0f}" for t, rate in by_threads.items()]
        launched = (
            f"{int(launch['torch_threads_used'].iloc[0])} threads (the launch's) "
            f"{launch[metric].median():,.0f}"
        )
        pairs.append(f"{where + ': ' if where else ''}{', '.join(figures)}, {launched}")
    return pairs


def note(rows: pd.DataFrame, metric: str = "samples_per_s") -> str | None:
    """One sentence where cells ran with other threads than the launch's; None where none did (or
    results older than the launch's threads being recorded)."""
    if not set(COLUMNS) <= set(rows.columns) or metric not in rows:
        return None
    ok = rows[
        (rows["status"] == "ok")
        & rows["torch_threads_used"].notna()
        & rows["torch_threads_launch"].notna()
    ]
    other = ok[ok["torch_threads_used"] != ok["torch_threads_launch"]]
    if other.empty:
        return None
    cells = other["cell"].nunique()
    text = (
        f"{cells} of {ok['cell'].nunique()} cells ran the trainer with "
        f"{_ints(other['torch_threads_used'])} intra-op thread(s) (knob torch_threads) where "
        f"this launch gives an unmodified script {_ints(ok['torch_threads_launch'])}: their "
        "figures are for the knob's threads, not for your job as it runs."
    )
    both = _both(ok, metric)
    return text + (
        f" Measured both ({metric.replace('_per_s', '/s')}, medians): {'; '.join(both)}."
        if both
        else ""
    )
