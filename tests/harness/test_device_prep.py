"""N1 (#35): the trainer's device work while it fetches a batch (device_stages, torchvision-cuda's
decode) is a phase of its own, device_prep, under every timing method: never the loader's wait,
never the GPU's idle time, so never stall_pct. Here on the CPU the moved stage sleeps a known time
per batch, in the trainer, through the harness's loop."""

from __future__ import annotations

import csv
import time

import pytest
import torch
from feedbench.harness import whatif
from feedbench.harness.batches import copied_bytes
from feedbench.harness.loop import Measurement
from feedbench.harness.timing import PhaseClock, device_work
from helpers.cells import user_cell
from torch.utils.data import DataLoader, TensorDataset

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
    assert batch[0].device.type == ctx.device.type, batch[0].device  # the moved stage ran there
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


def test_the_copy_device_stages_make_in_device_prep_is_counted_as_copied():
    """N7 (#50): device_stages copies the samples inside device_prep; the loop then finds them on
    the device and, by its rule for tensors already there, leaves them out of h2d_bytes, so the
    target view priced that cell's copy at about zero. Here the device is PyTorch's meta device,
    the one device apart from the host a CPU has: 4 batches of 8 samples of 6 float32 and 8 int64
    labels, the first a warm-up, each measured step's labels counted as the loop counts them."""
    data = TensorDataset(torch.ones(32, 6), torch.zeros(32, dtype=torch.int64))
    loader = DataLoader(data, batch_size=8)
    stages = whatif.DeviceStages(loader, torch.neg, torch.device("meta"), False, {})
    m = Measurement(whatif_loader=stages, stage_skip=1)
    for i, batch in enumerate(stages):
        assert batch[0].device.type == "meta" and batch[1].device.type == "cpu"
        if i >= m.stage_skip:  # as loop._record_step counts a measured step's batch
            m.h2d_bytes += copied_bytes(batch)
            m.completed += 1
    assert m.h2d_bytes == 3 * 8 * 8  # the loop's copies: the labels
    assert m.copies() == (3 * (8 * 6 * 4 + 8 * 8), 3 * 8 * 6 * 4)


@pytest.mark.gpu
def test_device_stages_run_on_the_gpu_and_their_copy_is_counted(run_cell, user_module):
    """The moved stage runs on the batch on the GPU (the step asserts where its batch is), its time
    read from CUDA events; the samples' copy it makes in device_prep is in h2d_bytes beside the
    labels' (N7, #50): 4 samples of 4 float32 and 4 float32 labels a step."""
    result = _cell(run_cell, user_module, device="cuda", timing="events", steps=3)
    metrics = result["metrics"]
    assert metrics["whatif"]["device_ms_per_batch"] > 0
    assert metrics["h2d_bytes"] == 3 * (4 * 4 * 4 + 4 * 4), metrics["h2d_bytes"]


class HostEvent:
    """torch.cuda.Event's interface on the host clock, for the events clock on a machine without
    CUDA: record() reads perf_counter, elapsed_time() gives the ms from this event to another."""

    def __init__(self, enable_timing: bool = False):
        self.at: float | None = None

    def record(self, stream=None) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.at - self.at) * 1000


def test_under_events_the_gpu_idle_between_steps_leaves_out_the_device_prep_in_the_gap(
    monkeypatch,
):
    """N1's second half (#50): under events the gap between two steps holds the next batch's device
    work; gpu_idle is the gap less that device_prep, or the GPU's own work reads as its idle time
    and becomes stall_pct. A revert of the subtraction in PhaseClock.read passed every CPU test.
    The events clock runs here on the host clock (HostEvent), driven as the loop drives it: each
    fetch waits 2 ms for the loader and does 10 ms of device work, then the step marks its
    phases."""
    monkeypatch.setattr(torch.cuda, "Event", HostEvent)
    clock = PhaseClock("events", torch.device("cuda", 0), ("h2d", "fwd"))
    assert clock.effective_mode == "events"
    for _ in range(3):
        with clock.fetching():
            time.sleep(0.002)  # the loader's wait: the GPU idles
            with device_work():
                time.sleep(0.01)
        clock.start_step()
        clock.mark()
        clock.mark()
    read = clock.read()
    for i in (1, 2):
        gap = clock.steps[i - 1][-1].elapsed_time(clock.steps[i][0])
        assert read["device_prep"][i] >= 10 and gap >= read["device_prep"][i] + 2
        assert read["gpu_idle"][i] == pytest.approx(gap - read["device_prep"][i]), read
