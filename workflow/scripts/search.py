"""Snakemake `script:` of checkpoint search: the ceilings' results -> a prediction of every level of
the searched axis -> results/search/<experiment>.json, the training cells to run
(feedbench.core.search)."""

import json
import sys

import pandas as pd
from feedbench.analysis.aggregate import load_results, planned_row, python_value, with_predictions
from feedbench.analysis.worker_load import loader_cpu
from feedbench.core.result import atomic_write
from feedbench.core.search import plan

snakemake = globals()["snakemake"]  # injected by Snakemake
# warnings and tracebacks go to the rule's log
sys.stderr = open(snakemake.log[0], "w", buffering=1)


def predicted_rates(experiment: str, groups: list[dict]) -> tuple[list[list], list[list]]:
    """Each level's predicted samples/s (None where a ceiling is missing), by
    analysis.aggregate.with_predictions: the level as a planned training row beside its ceilings'
    results, joined on the links the planner gave it (feedbench.plan.matrix.search_levels) and
    predicted by the same code that predicts the measured cell in the summary afterwards. The
    planned row runs on the device its compute ceiling ran on."""
    paths = sorted(
        {
            p
            for group in groups
            for level in group["levels"]
            for ps in level["ceilings"].values()
            for p in ps
        }
    )
    ceilings = load_results(paths, links={})  # ceiling cells: nothing of theirs is predicted
    ran_on = {
        path: python_value(device)
        for path, device in zip(ceilings.get("result", []), ceilings.get("device", []), strict=True)
    }
    rows, links = [], {}
    for group in groups:
        for level in group["levels"]:
            devices = [ran_on.get(path) for path in level["ceilings"]["compute"]]
            device = next((d for d in devices if d), level["knobs"].get("device"))
            rows.append(planned_row(experiment, level["cell"], level["knobs"], device))
            links[f"{experiment}/{level['cell']}"] = level["links"]
    frame = with_predictions(pd.concat([ceilings, pd.DataFrame(rows)], ignore_index=True), links)
    rates = iter(frame["predicted_samples_per_s"].iloc[len(ceilings) :].map(python_value))
    cpu = [
        [loader_cpu(ceilings, level["ceilings"]["loader"]) for level in group["levels"]]
        for group in groups
    ]
    return [[next(rates) for _ in group["levels"]] for group in groups], cpu


groups = json.loads(snakemake.params.groups)
rates_of, cpu_of = predicted_rates(snakemake.wildcards.experiment, groups)
choices = [
    {
        "knobs": group["knobs"],
        "cells": {level["level"]: level["cell"] for level in group["levels"]},
        "predicted": {
            level["level"]: rate for level, rate in zip(group["levels"], rates, strict=True)
        },
        "cpu": {level["level"]: load for level, load in zip(group["levels"], cpu, strict=True)},
    }
    for group, rates, cpu in zip(groups, rates_of, cpu_of, strict=True)
]
decision = plan(
    snakemake.wildcards.experiment,
    snakemake.params.axis,
    choices,
    snakemake.params.baseline,
    beyond=snakemake.params.beyond_cores,
)
atomic_write(snakemake.output.plan, json.dumps(decision, indent=1) + "\n")
