"""Stage timing finds the costly functions by itself (issue #33, part 4): a pure-Python pipeline with no Compose and
no span, whose functions do fixed work per call, is profiled in its warm-up, and its two costliest functions come back
named, each within 10 % of its cost measured alone in the same run; the profile stays out of the measured window."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import time

import pytest
from feedbench.analysis import stages
from feedbench.analysis.aggregate import result_row
from feedbench.harness.runner import run

# A user's text pipeline, loaded by import path: __getitem__ tokenizes (a user helper and a str.split inside) and
# normalizes; each function a busy loop of a fixed number of iterations (the test picks them, calibrated in this
# run). Each sample also says whether a profiler was on while it was made (sys.getprofile), so the test sees which
# batches were profiled.
USER_MODULE = "text_costs"
USER_CODE = """
import sys

import torch
from torch import nn
from torch.utils.data import Dataset

SEEN = []  # per batch the step received: was any of its samples made under a profiler


def spin(loops):
    acc = 0
    for i in range(loops):
        acc += i * i
    return acc


def _lookup(words, loops):  # inside tokenize: part of its time, never named apart
    return spin(loops) + len(words)


def tokenize(text, loops):
    words = text.split()
    return _lookup(words, loops // 2) + spin(loops - loops // 2)


def normalize(ids, loops):
    return spin(loops) + ids % 7


class Texts(Dataset):
    def __init__(self, ctx, tokenize_loops, normalize_loops, n=24):
        self.tokenize_loops, self.normalize_loops, self.n = tokenize_loops, normalize_loops, n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        ids = tokenize(f"sample {index} of a text to split", self.tokenize_loops)
        x = normalize(ids, self.normalize_loops)
        return torch.tensor([float(x % 5), float(index), float(sys.getprofile() is not None)])


def model(ctx):
    return nn.Linear(3, 1)


def step(model, batch, ctx):
    SEEN.append(bool(batch[:, 2].any()))
    return model(batch).mean()
"""
COSTS_MS = {"tokenize": 3.0, "normalize": 1.5}


def cpu_ms(call, repeats: int = 15) -> float:
    """The median CPU ms (this thread's) of one call: a busy machine's other work does not count in it."""
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        call()
        times.append((time.thread_time() - start) * 1000)
    return statistics.median(times)


def loops_for(module, ms: float) -> int:
    """The iterations of spin that cost `ms` of CPU here, now."""
    per_loop = cpu_ms(lambda: module.spin(200_000)) / 200_000
    return max(1000, round(ms / per_loop))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_two_costliest_functions_are_named_within_10_percent_and_only_the_warm_up_is_profiled(
    user_module, workers, tmp_path
):
    sys.path.insert(0, user_module)
    try:
        import text_costs as module
    finally:
        sys.path.remove(user_module)
    loops = {name: loops_for(module, ms) for name, ms in COSTS_MS.items()}
    alone = {  # what each costs alone, before and after the cell, in this run
        "tokenize": lambda: module.tokenize("sample 1 of a text to split", loops["tokenize"]),
        "normalize": lambda: module.normalize(7, loops["normalize"]),
    }
    before = {name: cpu_ms(call) for name, call in alone.items()}
    knobs = {
        "dataset": "text_costs:Texts",
        "dataset_args": {"tokenize_loops": loops["tokenize"], "normalize_loops": loops["normalize"]},
        "model": "text_costs:model",
        "step": "text_costs:step",
        "python_path": [user_module],
        "device": "cpu",
        "batch_size": 4,
        "num_workers": workers,
        "warmup_steps": 4,
        "steps": 12,  # 6 batches an epoch: the run crosses two epoch boundaries, where new workers start
        "torch_threads": 1,
        "monitor_interval_s": 5,
        "stage_timing": True,
    }
    run(knobs, str(tmp_path / "out"))  # as the bench job runs it: the user's module imported by its path
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] == "ok", result["error"]
    after = {name: cpu_ms(call) for name, call in alone.items()}

    # Worker 0 makes batches 0, 2, 4, ... of 2 workers: it profiles its two of the four warm-up batches; the main
    # process all four. No batch of the measured window, nor of a later epoch's new workers, was made under it.
    profiled = [True, False, True, False] if workers else [True] * 4
    assert sys.modules[USER_MODULE].SEEN == profiled + [False] * 12
    profile = result["metrics"]["stages"]["profile"]
    assert profile["samples"] == 2 * sum(profiled)  # every other sample: those between timed without the profiler
    assert profile["process"] == ("worker 0" if workers else "main")

    named = profile["functions"]
    assert [f["name"] for f in named[:2]] == ["text_costs:tokenize", "text_costs:normalize"], named
    assert named[2]["name"] == "text_costs:Texts.__getitem__"  # the rest of __getitem__ (str formatting, a tensor)
    assert not any("spin" in f["name"] or "_lookup" in f["name"] or "split" in f["name"] for f in named)
    for f in named[:2]:
        cost = (before[f["name"].split(":")[1]] + after[f["name"].split(":")[1]]) / 2
        assert f["ms"] == pytest.approx(cost, rel=0.1), (f, before, after)
    total = profile["cpu_ms_per_sample"]
    assert sum(f["share"] for f in named) <= 1.0 + 1e-9
    assert named[0]["share"] == pytest.approx(named[0]["ms"] / total)

    # The summary row carries them, and the verdict's sentence names the tokenizer, with nothing marked.
    rows = stages_rows(result, str(tmp_path / "out" / "result.json"))
    said = stages.culprit(rows)
    assert said.startswith(f"{100 * named[0]['share']:.0f} % of a sample's loader CPU time is in text_costs:tokenize ")
    assert ", " in said and "% in text_costs:normalize" in said and "is outside the named stages" in said
    assert [f["name"] for f in stages.function_rows(rows)][:2] == ["text_costs:tokenize", "text_costs:normalize"]


def stages_rows(result: dict, path: str):
    import pandas as pd

    return pd.DataFrame([{**result_row(result, path), "cell": "c", "experiment": "e"}])


def test_no_profile_where_it_could_not_stay_out_of_the_window():
    from feedbench.harness.profile import sample_profile
    from feedbench.plan.cell import parse_cell

    assert sample_profile(parse_cell({"warmup_steps": 0, "stage_timing": True})) is None
    assert sample_profile(parse_cell({"num_workers": 2, "in_order": False, "stage_timing": True})) is None
    three = sample_profile(parse_cell({"num_workers": 2, "warmup_steps": 5, "stage_timing": True}))
    assert (three.batches, three.worker) == (3, 0)  # batches 0, 2, 4 of the 5 warm-up ones


def test_the_benchmark_runs_at_its_smallest_size(capsys):
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "stage_profile.py")
    spec = importlib.util.spec_from_file_location("stage_profile_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    figures = bench.main(["--rounds", "1", "--samples", "16"])
    assert figures["with"] > 0 and figures["without"] > 0 and figures["naming_ms"] >= 0
    assert "samples/s without the profile" in capsys.readouterr().out
