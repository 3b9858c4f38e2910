"""The first batch, epoch boundaries and the tail: the loader knobs' effect shows in the measured
waits.

Costs are sleeps, so the margins hold on a busy 2-core machine: what the knobs change is hundreds of
ms against waits of tens.
"""

from __future__ import annotations

import inspect
import json

import jsonschema
import pandas as pd
import pytest
from feedbench.analysis.aggregate import result_row
from feedbench.analysis.time_lost import time_lost_parts
from feedbench.analysis.verdict import summarize_experiment
from feedbench.core.metrics import epoch_boundaries, wait_tail
from feedbench.core.records import record_of
from feedbench.core.result import schema
from feedbench.harness.runner import run
from torch.utils.data import DataLoader

# USER_CODE, imported by its path (the user_module fixture, tests/conftest.py)
USER_MODULE = "tail_data"
USER_CODE = """
import os
import time

import torch
from torch.utils.data import Dataset

START_S = 0.3  # a worker's first item: what opening files or a connection costs each new worker
ITEM_S = 0.025  # every sample of the slow-sample dataset
SLOW_S = 0.5  # its one sample in 20


class SlowStart(Dataset):
    started = None  # the process that paid the start-up

    def __len__(self):
        return 16

    def __getitem__(self, index):
        if SlowStart.started != os.getpid():
            SlowStart.started = os.getpid()
            time.sleep(START_S)
        return torch.zeros(4)


class OneSlowIn20(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, index):
        time.sleep(SLOW_S if index % 20 == 19 else ITEM_S)
        return torch.zeros(4)


def slow_start(ctx):
    return SlowStart()


def one_slow_in_20(ctx):
    return OneSlowIn20()
"""

LOADER = {
    "scenario": "loader",
    "device": "cpu",
    "torch_threads": 1,
    "monitor_interval_s": 5,
    "shuffle": False,
}


@pytest.fixture
def run_tail(user_module, tmp_path):
    """run_tail(name, **knobs): the result.json of one loader cell over the user's tail_data, run as
    the bench job runs it, and its summary row."""

    def _run(name: str, **knobs) -> tuple[dict, dict]:
        out = tmp_path / "cells" / "tail" / name / "rep0"
        run({**LOADER, "python_path": [user_module], **knobs}, str(out))
        result = json.loads((out / "result.json").read_text())
        assert result["status"] == "ok", result["error"]
        jsonschema.validate(result, schema())
        return result, result_row(record_of(result, str(out / "result.json")))

    return _run


def test_without_persistent_workers_each_epoch_boundary_stalls(run_tail):
    knobs = dict(dataset="tail_data:slow_start", batch_size=4, num_workers=1, epochs=3)
    _, kept = run_tail("persistent", persistent_workers=True, **knobs)
    result, restarted = run_tail("restarted", persistent_workers=False, **knobs)
    # 4 batches an epoch, 1 warm-up step: the 12 measured steps cross 3 boundaries, each a new
    # worker's start-up
    assert restarted["epoch_boundaries"] == kept["epoch_boundaries"] == 3
    assert restarted["epoch_stall_ms"] >= 300 and restarted["epoch_stall_ms_max"] >= 300
    assert restarted["epoch_stall_s"] >= 3 * 0.25
    assert kept["epoch_stall_ms"] < 150 and kept["epoch_stall_s"] < 0.3
    assert restarted["epoch_stall_ms"] > 5 * restarted["wait_ms_p50"]
    assert len(result["metrics"]["epoch_boundaries"]["stalls_ms"]) == 3
    # the first worker's start-up, outside the window
    assert restarted["time_to_first_batch_s"] >= 0.3
    # the verdict names the stalls of the cell that has them (here the baseline), not of the one
    # that has none
    rows = pd.DataFrame([{**kept, "baseline": False}, {**restarted, "baseline": True}])
    note = summarize_experiment(rows, {"persistent_workers": [False, True]})["time_lost"]
    assert (
        "baseline persistent_workers=false: " in note
        and "3 epoch boundaries stalled" in note
        and "persistent_workers" in note
    )
    assert (
        "best cell persistent_workers=true: the first batch took" in note
        and "persistent_workers=true: 3 epoch" not in note
    )
    # the other way round the restarted cell is neither best nor baseline, only slower: its stalls
    # are still named, so a worker count that lost to its boundaries alone is not left unexplained
    assert restarted["samples_per_s"] < kept["samples_per_s"]
    rows = pd.DataFrame([{**kept, "baseline": True}, {**restarted, "baseline": False}])
    note = summarize_experiment(rows, {"persistent_workers": [True, False]})["time_lost"]
    assert (
        "Slower than the baseline, with epoch boundaries over 5 % of their run: "
        "persistent_workers=false (3 boundaries at" in note
    )
    assert note.endswith("their workers started again at each; persistent_workers keeps them.")


@pytest.mark.skipif(
    "in_order" not in inspect.signature(DataLoader).parameters,
    reason="this torch's DataLoader has no in_order",
)
def test_out_of_order_delivery_lowers_the_p99_wait_behind_a_slow_sample(run_tail):
    knobs = dict(
        dataset="tail_data:one_slow_in_20", batch_size=1, num_workers=2, steps=60, warmup_steps=2
    )
    _, ordered = run_tail("in-order", in_order=True, **knobs)
    _, unordered = run_tail("out-of-order", in_order=False, **knobs)
    # in order, the step after a slow sample waits out most of its 500 ms; out of order the other
    # worker's batches pass it, and the wait stays near one sample's 25 ms
    assert ordered["wait_ms_p99"] >= 300
    assert unordered["wait_ms_p99"] < 0.5 * ordered["wait_ms_p99"]
    # 62 of 400 samples: no epoch
    assert ordered["epoch_boundaries"] is None and ordered["epoch_stall_s"] is None


def test_spawned_workers_start_later_than_forked_ones(run_tail):
    knobs = dict(dataset="tail_data:one_slow_in_20", batch_size=1, num_workers=1, steps=4)
    _, forked = run_tail("fork", multiprocessing_context="fork", **knobs)
    _, spawned = run_tail("spawn", multiprocessing_context="spawn", **knobs)
    # a spawned worker imports torch and unpickles the dataset before its first sample; a forked one
    # has them
    assert spawned["time_to_first_batch_s"] > forked["time_to_first_batch_s"] + 0.2


def test_the_verdict_names_what_costs_more_than_5_percent_of_the_run():
    cell = {
        "cell": "c",
        "window_s": 10.0,
        "first_batch_s": 0.4,
        "epoch_stall_s": 0.4,
        "epoch_boundaries": 2,
    }
    assert time_lost_parts(cell) == []  # 0.4 s of 10.4: under 5 %
    first, stalls = time_lost_parts(
        {**cell, "first_batch_s": 1.0, "epoch_stall_s": 1.0, "epoch_stall_ms": 500}
    )
    assert first.startswith("the first batch took 1.00 s, 9 % of the run")
    assert stalls.startswith("2 epoch boundaries stalled 500 ms each (median), 9 % of the run")
    assert (
        time_lost_parts(
            {"cell": "old", "window_s": 10.0, "first_batch_s": None, "epoch_stall_s": None}
        )
        == []
    )


def test_tail_and_boundaries_from_the_waits():
    waits = [10.0] * 98 + [200.0, 400.0]
    tail = wait_tail(waits)
    assert tail["p50"] == 10 and tail["p90"] == 10 and 200 < tail["p99"] < 400
    assert wait_tail([]) is None
    stalls = epoch_boundaries(waits, [98, 99])
    assert stalls["count"] == 2 and stalls["max_ms"] == 400 and stalls["median_ms"] == 300
    assert stalls["excess_s"] == pytest.approx((190 + 390) / 1000)
    assert epoch_boundaries(waits, []) is None
