"""Summary rows written by hand as aggregate.result_row writes them, for the scaling, nmt and
datastall study views (tests/analysis/test_views_scaling.py, test_studies_scaling.py,
test_studies_views.py)."""

from __future__ import annotations

import io
import json
import os

import pandas as pd
from conftest import ROOT
from feedbench.analysis.aggregate import read_summary
from feedbench.analysis.views import read_reference
from feedbench.core.knobs import defaults

REFERENCES = os.path.join(ROOT, "report", "references")
H100 = "NVIDIA H100 80GB HBM3"


def row(experiment: str, cell: str, repeat: int = 0, status: str = "ok", **values) -> dict:
    """One summary row as aggregate.result_row writes it: every knob, the metrics, status and
    provenance."""
    knobs = {**defaults(), **{k: v for k, v in values.items() if k in defaults()}}
    knobs["transfer_sizes"] = json.dumps(knobs["transfer_sizes"])
    failed = status != "ok"
    out = {
        "experiment": experiment,
        "cell": cell,
        "repeat": repeat,
        "status": status,
        "error_type": "RuntimeError" if failed else None,
        "error_message": "NCCL error: unhandled system error" if failed else None,
        "adjustments": None,
        **knobs,
        "samples_per_s": None,
        "tokens_per_s": None,
        "step_ms_median": None,
        "step_ms_p10": None,
        "step_ms_p90": None,
        "stall_pct": None if failed else 1.0,
        "window_s": None if failed else 5.0,
        "page_cache_effective": None if failed else "asis",
        "world_size": None if failed else 1,
        "comm_share": None,
        "timing_effective": None if failed else knobs["timing"],
        **{f"{p}_ms": None if failed else 1.0 for p in ("wait", "h2d", "fwd", "bwd", "opt")},
        "h2d_share": None if failed else 0.01,
        "host": None if failed else "gpu7",
        "gpu": None if failed else H100,
        "requested": json.dumps({"model": knobs["model"]}),
        "result": f"results/cells/{experiment}/{cell}/rep{repeat}/result.json",
    }
    out.update({k: v for k, v in values.items() if k not in defaults()})
    return out


def verdict_row(cell: str, repeat: int, baseline: bool, **values) -> dict:
    """A row of one training experiment, "e", with only the columns a verdict reads, `values` over
    them (tests/analysis/test_verdict_lines.py, test_verdict_wording.py)."""
    row = {"experiment": "e", "cell": cell, "repeat": repeat, "status": "ok", "scenario": "train"}
    return {**row, "baseline": baseline, **values}


def summary(rows: list[dict]) -> pd.DataFrame:
    """Through a CSV and back, as the report reads results/summary.csv (aggregate.read_summary)."""
    return read_summary(io.StringIO(pd.DataFrame(rows).to_csv(index=False)))


def repeats(experiment, cell, values: list[float], metric="samples_per_s", **knobs) -> list[dict]:
    return [row(experiment, cell, k, **knobs, **{metric: v}) for k, v in enumerate(values)]


def reference(name: str) -> pd.DataFrame:
    return read_reference(os.path.join(REFERENCES, f"{name}.csv"))


def table(view, caption_start: str):
    found = [t for t in view.tables if t.caption.startswith(caption_start)]
    assert len(found) == 1, [t.caption for t in view.tables]
    return pd.DataFrame(found[0].rows, columns=found[0].columns)


RESNET = {"model": "resnet50", "scenario": "compute", "batch_size": 32}


IMAGES = {"dataset": "images", "batch_size": 32}
NO_ROOT = (
    "cold cache could not be made: /proc/sys/vm/drop_caches is not writable (Permission denied) "
    "and posix_fadvise failed (EINVAL)"
)


def datastall_rows(cold_effective_50: str = "asis") -> list[dict]:
    e, rows = "datastall", []
    ceiling = {"resnet18": 1000.0, "resnet50": 500.0}
    cached = {
        "resnet18": {0: 400.0, 1: 700.0, 2: 950.0, 4: 990.0},
        "resnet50": {0: 200.0, 1: 300.0, 2: 449.0},
    }
    cold = {
        "resnet18": {0: 300.0, 1: 500.0, 2: 600.0, 4: 610.0},
        "resnet50": {0: 150.0, 1: 200.0, 2: 250.0},
    }
    for model in ceiling:
        # once per model
        rows += repeats(
            e, f"{model}-compute", [ceiling[model]] * 3, model=model, scenario="compute"
        )
        for workers, value in cached[model].items():
            rows += repeats(
                e,
                f"{model}-w{workers}-warm",
                [value, value * 1.02, value * 0.98],
                **IMAGES,
                model=model,
                scenario="train",
                num_workers=workers,
                page_cache="warm",
                page_cache_effective="warm",
            )
            made = "cold" if model == "resnet18" else cold_effective_50
            rows += repeats(
                e,
                f"{model}-w{workers}-cold",
                [cold[model][workers]],
                **IMAGES,
                model=model,
                scenario="train",
                num_workers=workers,
                page_cache="cold",
                page_cache_effective=made,
                adjustments=None if made == "cold" else NO_ROOT,
            )
    rows.append(
        row(
            e,
            "resnet50-w4-warm",
            status="failed",
            **IMAGES,
            model="resnet50",
            scenario="train",
            num_workers=4,
            page_cache="warm",
        )
    )
    return rows
