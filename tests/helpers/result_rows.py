"""Summary rows made from results the way aggregate makes them, for the loader study views
(tests/analysis/test_views_loader.py, test_studies_views.py)."""

from __future__ import annotations

import io
import os

import pandas as pd
from conftest import ROOT
from feedbench.analysis.aggregate import read_summary, result_row
from feedbench.analysis.views import read_reference
from feedbench.core.knobs import defaults
from feedbench.core.records import record_of

REFERENCES = os.path.join(ROOT, "report", "references")
H100 = "NVIDIA H100 80GB HBM3"
PREFETCH = {
    "matrix": {
        "epochs": [1, 5],
        "hidden_layers": [1, 4],
        "device_prefetch": ["none", "stream"],
        "pin_memory": [False, True],
    }
}
WORKERS = {"matrix": {"num_workers": [0, 1, 2, 4, 8]}}
BREAKDOWN = {
    "matrix": {
        "timing": ["events", "sync", "naive"],
        "pin_memory": [False, True],
        "non_blocking": [False, True],
    }
}


def reference(name: str) -> pd.DataFrame:
    return read_reference(os.path.join(REFERENCES, f"{name}.csv"))


def row(
    experiment: str,
    knobs: dict,
    repeat: int = 0,
    gpu: str | None = H100,
    failed: bool = False,
    step_ms: float | None = None,
    **metrics,
) -> dict:
    """One summary row from a result as the harness writes it.

    A CPU fits pin_memory=true to false, as resolve() does.
    """
    cell = {**defaults(), **knobs, "device": "cuda" if gpu else "cpu"}
    if gpu is None:
        cell["pin_memory"] = False
    name = "_".join(f"{k}-{str(v).lower()}" for k, v in knobs.items())
    labels = {"experiment": experiment, "cell": name, "repeat": repeat}
    phases = {
        p: {"median_ms": metrics.pop(f"{p}_ms", None), "share": None}
        for p in ("wait", "h2d", "fwd", "bwd", "opt", "gpu_idle")
    }
    result = {
        "status": "failed" if failed else "ok",
        "cell": {**cell, **labels},
        "requested": {**knobs, **labels},
        "provenance": {"host": "node1", "gpu": gpu},
        "timing": {"effective": knobs.get("timing", "events") if gpu else "wall"},
        "metrics": {} if failed else {**metrics, "phases": phases, "step_ms": {"median": step_ms}},
    }
    if failed:
        result["error"] = {"type": "OutOfMemoryError", "message": "CUDA out of memory"}
    return result_row(
        record_of(result, f"results/cells/{experiment}/{name}/rep{repeat}/result.json")
    )


def summary(rows: list[dict]) -> pd.DataFrame:
    """Through CSV and back, as the report reads results/summary.csv (aggregate.read_summary)."""
    return read_summary(io.StringIO(pd.DataFrame(rows).to_csv(index=False)))


def column(table, name: str) -> list:
    return [r[table.columns.index(name)] for r in table.rows]


def keyed(table, keys: tuple[str, ...], name: str) -> dict:
    """The column `name` of `table` keyed by the tuple of its columns `keys`."""
    key = zip(*(column(table, k) for k in keys), strict=True)
    return dict(zip(key, column(table, name), strict=True))


def find(tables, start: str):
    return next(t for t in tables if t.caption.startswith(start))


def prefetch_rows(gpu: str | None = H100) -> list[dict]:
    """Without: 2 s per epoch and layer; with: 1.6 s (pinned) or 1.9 s (pageable); repeats 0 and 2
    straddle the median of repeat 1."""
    rows = []
    for epochs in (1, 5):
        for layers in (1, 4):
            for prefetch in ("none", "stream"):
                for pin in (False, True):
                    per = 2.0 if prefetch == "none" else (1.6 if pin else 1.9)
                    for repeat, noise in enumerate((1.5, 1.0, 0.9)):
                        rows.append(
                            row(
                                "prefetch",
                                {
                                    "epochs": epochs,
                                    "hidden_layers": layers,
                                    "device_prefetch": prefetch,
                                    "pin_memory": pin,
                                },
                                repeat,
                                gpu,
                                window_s=per * epochs * layers * noise,
                            )
                        )
    return rows


def workers_rows(gpu: str | None = H100) -> list[dict]:
    """Steady state saturating at 4 workers; the first batch grows with the workers started; CUDA
    init 0.4 s, apart."""
    rows = []
    for workers in (0, 1, 2, 4, 8):
        for repeat in range(3):
            rate = 500.0 * (min(workers, 4) + 1)
            rows.append(
                row(
                    "workers",
                    {"scenario": "loader", "num_workers": workers},
                    repeat,
                    gpu,
                    step_ms=64000 / rate,
                    samples_per_s=rate,
                    time_to_first_batch_s=0.05 + 0.02 * workers,
                    cuda_init_s=0.4 if gpu else None,
                )
            )
    return rows
