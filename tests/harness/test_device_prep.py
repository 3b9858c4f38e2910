"""N1 (#35): the trainer's device work while it fetches a batch (device_stages, torchvision-cuda's
decode) is a phase of its own, device_prep, under every timing method: never the loader's wait,
never the GPU's idle time, so never stall_pct. Here on the CPU the moved stage sleeps a known time
per batch, in the trainer, through the harness's loop."""

from __future__ import annotations

import csv

import pytest
from helpers.cells import user_cell

USER_MODULE = "prep_costs"
# the moved stage's cost per batch; a sample costs next to nothing, so no step waits on the loader
SLEEP_MS = 40.0
USER_CODE = f"""
import time

import feedbench
import torch
from torch import nn
from torch.utils.data import Dataset
from torchvision.transforms import v2


class Cheap(v2.Transform):
    def forward(self, x):
        return x


class Slow(v2.Transform):  # moved by device_stages: runs once per batch, in the trainer, after the copy
    def forward(self, x):
        time.sleep({SLEEP_MS} / 1000)
        return x


class Samples(Dataset):
    def __init__(self, n):
        self.n, self.transform = n, v2.Compose([Cheap(), Slow()])

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return self.transform(torch.full((4,), float(index))), torch.tensor(float(index))


def build(ctx, n=64):
    return Samples(n)


class Touching(Samples):  # a dataset that does device work of its own per sample, in the trainer, and marks it
    def __getitem__(self, index):
        with feedbench.device_work():
            time.sleep({SLEEP_MS} / 4 / 1000)
        return torch.full((4,), float(index)), torch.tensor(float(index))


def build_touching(ctx, n=64):
    return Touching(n)


def model(ctx):
    return nn.Linear(4, 1)


def step(model, batch, ctx):
    return model(batch[0]).mean()
"""  # noqa: E501
KNOBS = user_cell(
    USER_MODULE, batch_size=4, num_workers=0, steps=6, warmup_steps=1, torch_threads=1
)
KNOBS.update(stage_timing=False, device_stages="Slow")


def _cell(run_cell, user_module, **knobs):
    code, result = run_cell(**{**KNOBS, **knobs}, python_path=[user_module])
    assert code == 0 and result["status"] == "ok", result["error"]
    return result


@pytest.mark.timing  # asserts where a known sleep lands
@pytest.mark.parametrize(
    "timing, prefetch", [("naive", "none"), ("sync", "none"), ("sync", "stream")]
)
def test_device_stage_time_is_device_prep_not_the_loaders_wait(
    run_cell, user_module, timing, prefetch, tmp_path
):
    """The stream prefetcher pulls its batches ahead, inside the step's fetch too: their device work
    is still the step's device_prep."""
    result = _cell(run_cell, user_module, timing=timing, device_prefetch=prefetch)
    metrics = result["metrics"]
    # the loader is next to free
    assert metrics["phases"]["wait"]["median_ms"] < SLEEP_MS / 4, metrics["phases"]
    assert metrics["stall_pct"] < 15, metrics
    prep = metrics["phases"]["device_prep"]
    # a sleep overshoots on a busy machine, never undershoots
    assert SLEEP_MS <= prep["median_ms"] < 3 * SLEEP_MS
    assert prep["share"] > 0.6, metrics
    with open(tmp_path / "cell0" / "steps.csv") as f:  # every measured step carries its own
        rows = list(csv.DictReader(f))
    assert len(rows) == KNOBS["steps"] and all(
        float(row["device_prep_ms"]) >= SLEEP_MS for row in rows
    )


@pytest.mark.timing
def test_a_users_dataset_marks_its_own_device_work(run_cell, user_module):
    """feedbench.device_work() in a user's dataset (workers 0: it runs in the trainer, as a dataset
    that touches CUDA must): 4 samples a batch, a quarter of SLEEP_MS each, are the step's
    device_prep, not its wait."""
    metrics = _cell(run_cell, user_module, dataset="prep_costs:build_touching", device_stages=None)[
        "metrics"
    ]
    assert metrics["phases"]["wait"]["median_ms"] < SLEEP_MS / 4 and metrics["stall_pct"] < 15, (
        metrics["phases"]
    )
    assert SLEEP_MS <= metrics["phases"]["device_prep"]["median_ms"] < 3 * SLEEP_MS


def test_a_cell_without_device_work_has_no_device_prep(run_cell, user_module):
    metrics = _cell(run_cell, user_module, device_stages=None, steps=2)["metrics"]
    assert "device_prep" not in metrics["phases"] and "wait" in metrics["phases"]


@pytest.mark.gpu
@pytest.mark.timing
def test_device_prep_under_events_on_the_gpu_is_not_gpu_idle(run_cell, user_module):
    """Under events the moved stage's time (here a host sleep between two CUDA events on the compute
    stream, which the GPU spends idle, waiting for the trainer) is device_prep, taken out of the gap
    that gpu_idle measures."""
    result = _cell(run_cell, user_module, timing="events", device="cuda")
    assert result["timing"]["effective"] == "events"
    metrics = result["metrics"]
    prep = metrics["phases"]["device_prep"]["median_ms"]
    assert SLEEP_MS <= prep < 3 * SLEEP_MS, metrics["phases"]
    assert metrics["phases"]["gpu_idle"]["median_ms"] < SLEEP_MS / 4, metrics["phases"]
    assert metrics["stall_pct"] < 100 * metrics["phases"]["device_prep"]["share"] / 4, metrics
