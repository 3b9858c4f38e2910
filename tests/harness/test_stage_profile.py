"""Stage timing finds the costly functions by itself: a pure-Python pipeline with no Compose and no
span, whose functions do fixed work per call, is profiled in its warm-up, and its two costliest
functions come back named, each within 10 % of its cost measured alone in the same run; the profile
stays out of the measured window."""

from __future__ import annotations

import cProfile
import importlib.util
import json
import json as json_module
import os
import statistics
import sys
import time

import jsonschema
import pytest
import torch
from conftest import ROOT
from feedbench.analysis import stages
from feedbench.analysis.aggregate import result_row
from feedbench.core.records import record_of
from feedbench.core.result import schema
from feedbench.harness import profile as sample_profile
from feedbench.harness.runner import run
from helpers.cells import user_cell

# A user's text pipeline, loaded by import path: __getitem__ tokenizes (a user helper and a
# str.split inside) and normalizes; each function a busy loop of a fixed number of iterations (the
# test picks them, calibrated in this run). Each sample also says whether a profiler was on while it
# was made (sys.getprofile), so the test sees which batches were profiled, and what each function
# cost it alone: the CPU time of its call, in the process that made the sample, next to the profiled
# ones (a shared VM's CPU time per loop drifted by 15 % between processes and minutes).
USER_MODULE = "text_costs"
USER_CODE = """
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset

SEEN = []  # per batch the step received, per sample: [made under a profiler, CPU ms of tokenize, of normalize]


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
    def __init__(self, ctx, tokenize_loops, normalize_loops, n=48):
        self.tokenize_loops, self.normalize_loops, self.n = tokenize_loops, normalize_loops, n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        start = time.thread_time()
        ids = tokenize(f"sample {index} of a text to split", self.tokenize_loops)
        tokenized = time.thread_time()
        x = normalize(ids, self.normalize_loops)
        spent = [(tokenized - start) * 1000, (time.thread_time() - tokenized) * 1000]
        profiled = float(sys.getprofile() is not None)
        return torch.tensor([float(x % 5), float(index), profiled, *spent], dtype=torch.float64)


def model(ctx):
    return nn.Linear(5, 1, dtype=torch.float64)


def step(model, batch, ctx):
    SEEN.append(batch[:, 2:].tolist())
    return model(batch).mean()
"""  # noqa: E501
COSTS_MS = {"tokenize": 3.0, "normalize": 1.5}


def loops_for(module, ms: float) -> int:
    """The iterations of spin that cost about `ms` of CPU here, now (the median of 9 calls)."""
    times = []
    for _ in range(9):
        start = time.thread_time()
        module.spin(200_000)
        times.append(time.thread_time() - start)
    return max(1000, round(ms / (statistics.median(times) * 1000 / 200_000)))


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
    args = {"tokenize_loops": loops["tokenize"], "normalize_loops": loops["normalize"]}
    knobs = user_cell(
        USER_MODULE, user_module, "Texts", dataset_args=args, device="cpu", stage_timing=True
    )
    # 12 steps, 6 batches an epoch: the run crosses two epoch boundaries, where new workers start
    knobs.update(
        batch_size=8,
        num_workers=workers,
        warmup_steps=4,
        steps=12,
        torch_threads=1,
        monitor_interval_s=5,
    )
    # as the bench job runs it: the user's module imported by its path
    run(knobs, str(tmp_path / "out"))
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] == "ok", result["error"]
    jsonschema.validate(result, schema())

    # Worker 0 makes batches 0, 2, 4, ... of 2 workers: it profiles its two of the four warm-up
    # batches; the main process all four. No batch of the measured window, nor of a later epoch's
    # new workers, was made under it.
    seen = sys.modules[USER_MODULE].SEEN
    profiled = [True, False, True, False] if workers else [True] * 4
    assert [any(s[0] for s in batch) for batch in seen] == profiled + [False] * 12
    # What each function cost alone: its CPU time in the samples made between the profiled ones, in
    # the same process.
    between = [
        s for batch, on in zip(seen, profiled, strict=False) if on for s in batch if not s[0]
    ]
    alone = {
        "tokenize": statistics.fmean(s[1] for s in between),
        "normalize": statistics.fmean(s[2] for s in between),
    }
    profile = result["metrics"]["stages"]["profile"]
    # every other sample: those between timed without the profiler
    assert profile["samples"] == 4 * sum(profiled)
    assert profile["process"] == ("worker 0" if workers else "main")

    named = profile["functions"]
    assert [f["name"] for f in named[:2]] == ["text_costs:tokenize", "text_costs:normalize"], named
    # the rest of __getitem__ (str formatting, a tensor)
    assert named[2]["name"] == "text_costs:Texts.__getitem__"
    assert not any(
        "spin" in f["name"] or "_lookup" in f["name"] or "split" in f["name"] for f in named
    )
    for f in named[:2]:
        assert f["ms"] == pytest.approx(alone[f["name"].split(":")[1]], rel=0.1), (f, alone)
    total = profile["cpu_ms_per_sample"]
    assert sum(f["share"] for f in named) <= 1.0 + 1e-9
    assert named[0]["share"] == pytest.approx(named[0]["ms"] / total)

    # The summary row carries them, and the verdict's sentence names the tokenizer, with nothing
    # marked.
    rows = stages_rows(result, str(tmp_path / "out" / "result.json"))
    said = stages.culprit(rows)
    assert said.startswith(
        f"{100 * named[0]['share']:.0f} % of a sample's loader CPU time is in text_costs:tokenize "
    )
    assert ", " in said and "% in text_costs:normalize" in said
    assert said.endswith(", outside the named stages (stage_functions makes it one)")
    assert [f["name"] for f in stages.function_rows(rows)][:2] == [
        "text_costs:tokenize",
        "text_costs:normalize",
    ]


def stages_rows(result: dict, path: str):
    import pandas as pd

    return pd.DataFrame([{**result_row(record_of(result, path)), "cell": "c", "experiment": "e"}])


def _helper(word):  # a function of this file (the user's code) called by another: part of its time
    return [c for c in word.lower()]


def tokenize(text):
    return [_helper(w) for w in text.split()]


def by_length(word):
    return len(word)


class Words:
    def __getitem__(self, index):
        text = "the quick brown fox " * 200
        ids = tokenize(text)
        # user code called through a builtin: named on its own
        ordered = sorted(text.split(), key=by_length)
        return torch.tensor([len(ids), len(ordered), index]), json_module.dumps(ids[:4])


def test_each_named_function_is_the_outermost_of_the_users_code_below_getitem():
    # torch's wrapper above the user's __getitem__
    data = torch.utils.data.Subset(Words(), [0, 1, 2])
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    for i in range(3):
        (lambda: data[i])()
    profiler.disable()
    times, total = sample_profile.attribute(profiler.getstats())
    here = __name__
    assert set(times) == {f"{here}:tokenize", f"{here}:by_length", f"{here}:Words.__getitem__"}, (
        times
    )
    assert sum(times.values()) <= total * (1 + 1e-9)
    # 800 words twice over against one len each
    assert times[f"{here}:tokenize"] > times[f"{here}:by_length"]


def test_library_code_is_the_standard_library_torch_and_feedbench():
    import numpy

    assert all(sample_profile.is_library(m.__file__) for m in (json_module, torch, sample_profile))
    assert sample_profile.is_library("<frozen importlib._bootstrap>")
    # an installed package is the user's: it is named
    assert not sample_profile.is_library(numpy.__file__)
    assert not sample_profile.is_library(__file__)


def test_no_profile_where_it_could_not_stay_out_of_the_window():
    from feedbench.core.cell import parse_cell
    from feedbench.harness.profile import sample_profile

    assert sample_profile(parse_cell({"warmup_steps": 0, "stage_timing": True})) is None
    assert (
        sample_profile(parse_cell({"num_workers": 2, "in_order": False, "stage_timing": True}))
        is None
    )
    three = sample_profile(parse_cell({"num_workers": 2, "warmup_steps": 5, "stage_timing": True}))
    assert (three.batches, three.worker) == (3, 0)  # batches 0, 2, 4 of the 5 warm-up ones


def test_the_benchmark_runs_at_its_smallest_size(capsys, monkeypatch):
    benchmarks = os.path.join(ROOT, "benchmarks")
    monkeypatch.syspath_prepend(benchmarks)  # its `import _checkout`, as when it runs from there
    path = os.path.join(benchmarks, "stage_profile.py")
    spec = importlib.util.spec_from_file_location("stage_profile_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    figures = bench.main(["--rounds", "1", "--samples", "16"])
    assert figures["with"] > 0 and figures["without"] > 0 and figures["naming_ms"] >= 0
    assert "samples/s without the profile" in capsys.readouterr().out
