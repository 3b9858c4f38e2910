"""Snakemake `script:` of checkpoint search: the ceilings' results -> a prediction of every level of the searched
axis -> results/search/<experiment>.json, the training cells to run (feedbench.search)."""

import json
import sys

from feedbench.aggregate import _copy_rate, load_results
from feedbench.knobs import KNOBS
from feedbench.predict import batch_bytes, predict
from feedbench.result import atomic_write
from feedbench.search import plan

snakemake = globals()["snakemake"]  # injected by Snakemake
sys.stderr = open(snakemake.log[0], "w", buffering=1)  # warnings and tracebacks go to the rule's log


def median_rate(paths):
    """The median samples/s over the repeats of a ceiling that finished; None when none did."""
    if not paths:
        return None
    frame = load_results(paths)
    ok = frame.loc[frame["status"] == "ok", "samples_per_s"].dropna()
    return float(ok.median()) if len(ok) else None


def predicted(level):
    """feedbench.predict's samples/s for one cell from its ceilings, as feedbench.aggregate predicts it afterwards."""
    knobs = {**{name: knob.default for name, knob in KNOBS.items()}, **level["knobs"]}
    loader, compute = median_rate(level["ceilings"]["loader"]), median_rate(level["ceilings"]["compute"])
    size = copy = None
    if level["ceilings"]["transfer"]:
        probe = load_results(level["ceilings"]["transfer"])
        probe = probe[probe["status"] == "ok"]
        device = probe["device"].iloc[0] if len(probe) else None
        if device not in (None, "cpu"):  # the probe ran where the cell will: a CPU copies nothing
            size = batch_bytes(knobs)
            copy = _copy_rate(probe, device, size, bool(knobs.get("pin_memory")))
    rate, _bound, _terms = predict(
        loader,
        compute,
        int(knobs.get("num_workers", 0)),
        int(knobs.get("batch_size", 1)),
        size,
        copy,
        knobs.get("device_prefetch") == "stream",
    )
    return rate


groups = [
    {
        "knobs": group["knobs"],
        "cells": {level["level"]: level["cell"] for level in group["levels"]},
        "predicted": {level["level"]: predicted(level) for level in group["levels"]},
    }
    for group in json.loads(snakemake.params.groups)
]
decision = plan(snakemake.wildcards.experiment, snakemake.params.axis, groups, snakemake.params.baseline)
atomic_write(snakemake.output.plan, json.dumps(decision, indent=1) + "\n")
