"""Stage timing inside the loader: known costs come back, and the user's batch is untouched."""

from __future__ import annotations

import csv
import json
import statistics
import sys

import feedbench
import pytest
import torch
from feedbench.harness import stages
from feedbench.harness.runner import run
from helpers.cells import user_cell
from helpers.known_costs import COSTS, USER_CODE, USER_MODULE  # noqa: F401 (USER_CODE: user_module's)
from torch import nn


# Timing: a time slice taken from a worker between the harness's sample timer and the user's own
# lands in `unattributed` on one side only; beside the other tests, with a CPU hog in a session of
# its own (half a core, always), the 2-worker cell's unattributed mean read 6.1 ms, more than 5 %
# off what the pipeline itself recorded (2026-11-29).
@pytest.mark.timing
@pytest.mark.parametrize("workers", [0, 2])
def test_each_stage_and_the_unattributed_rest_come_back_within_5_percent(
    user_module, workers, tmp_path
):
    knobs = user_cell(
        USER_MODULE, user_module, device="cpu", batch_size=4, num_workers=workers, steps=16
    )
    knobs.update(warmup_steps=1, torch_threads=1, monitor_interval_s=5, stage_timing=True)
    # as the bench job runs it: the user's module imported by its path
    run(knobs, str(tmp_path / "out"))
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] == "ok", result["error"]
    timed = result["metrics"]["stages"]
    assert timed["samples"] == 64 and timed["batches"] == 16
    got = timed["stages"]
    assert set(got) == {*COSTS, "collate"}
    # the measured steps' batches, after the warm-up one
    measured = sys.modules["known_costs"].SEEN[1:]
    for name, ms in COSTS.items():
        put = [v for batch in measured for v in batch[name]]
        assert min(put) >= ms * 0.99
        # The mean: a wait that overshot by a time slice makes the per-sample values two-humped on a
        # busy machine, and a median then jumps between the humps; the mean moves only by what the
        # stage really cost.
        assert got[name]["mean_ms"] == pytest.approx(statistics.fmean(put), rel=0.05), (
            name,
            got[name],
        )
        assert got[name]["median_ms"] >= ms * 0.99
        assert got[name]["calls"] == 64
        assert got[name]["p99_ms"] >= got[name]["p90_ms"] >= got[name]["median_ms"]
    assert got["collate"]["calls"] == 16
    # each step's batch: its samples' time in the worker
    with open(tmp_path / "out" / "steps.csv") as f:
        made = [float(row["worker_ms"]) for row in csv.DictReader(f)]
    assert len(made) == 16 and min(made) >= 4 * sum(COSTS.values()) * 0.99
    assert sum(s["share"] for s in got.values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "dataset, context",
    [("known_costs:build_stream", None), ("known_costs:build", "spawn")],
    ids=["stream", "spawn"],
)
def test_a_stream_and_spawned_workers_are_timed_too(user_module, tmp_path, dataset, context):
    knobs = {
        "dataset": dataset,
        "python_path": [user_module],
        "scenario": "loader",
        "device": "cpu",
        "batch_size": 4,
        "num_workers": 2,
        "multiprocessing_context": context,
        "steps": 4,
        "warmup_steps": 1,
        "torch_threads": 1,
        "monitor_interval_s": 5,
        "stage_timing": True,
    }
    run(knobs, str(tmp_path / "out"))
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] == "ok", result["error"]
    got = result["metrics"]["stages"]["stages"]
    assert set(got) == {*COSTS, "collate"}
    assert all(
        got[name]["calls"] == 16 and got[name]["median_ms"] >= ms * 0.99
        for name, ms in COSTS.items()
    )


def test_stage_is_a_no_op_outside_a_timed_sample():
    @feedbench.stage("outside")
    def work():
        return 7

    with feedbench.stage("outside"):
        assert work() == 7
    assert stages._made == [] and stages._sample is None


def test_nested_spans_keep_their_own_time_and_repeated_names_are_numbered():
    from torchvision.transforms import v2

    compose = v2.Compose([v2.Identity(), v2.Identity(), nn.Identity()])

    class Data(torch.utils.data.Dataset):
        transform = compose

        def __len__(self):
            return 2

        def __getitem__(self, index):
            with feedbench.stage("outer"):
                with feedbench.stage("inner"):
                    pass
            return self.transform(torch.zeros(1))

    dataset = stages.timed(Data())
    assert [t.name for t in compose.transforms] == ["Identity#1", "Identity#2", "Identity#3"]
    batch = stages.TimedCollate(torch.utils.data.default_collate)([dataset[0], dataset[1]])
    assert torch.equal(batch.batch, torch.zeros(2, 1))
    summary = stages.summarize_stages([batch.timings])
    assert summary["samples"] == 2 and summary["stages"]["outer"]["calls"] == 2
    total = sum(batch.timings["sample_s"])
    own = sum(sum(v) for v in batch.timings["stages"].values())
    # every second of a sample in exactly one stage: nothing counted twice
    assert own == pytest.approx(total)


# The batch the user's step receives, with stage timing on and off: the same structure, types and
# values; with no workers, the very object the user's collate returned.
class Records(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        return {"x": torch.full((3,), float(index)), "id": index, "name": f"s{index}"}


def _run(workers: int, on: bool):
    made, seen = [], []

    def collate(samples):
        made.append(
            {
                "x": torch.stack([s["x"] for s in samples]),
                "ids": [s["id"] for s in samples],
                "tag": ("a", 1),
            }
        )
        return made[-1]

    def step(model, batch, ctx):
        seen.append(batch)
        return model(batch["x"]).mean()

    result = feedbench.measure(
        dataset=Records(),
        model=nn.Linear(3, 1),
        collate=collate,
        to_device=lambda batch, device, non_blocking=False: batch,
        step=step,
        device="cpu",
        batch_size=4,
        num_workers=workers,
        steps=6,
        warmup_steps=1,
        stage_timing=on,
        torch_threads=1,
        monitor_interval_s=5,
    )
    assert result["status"] == "ok", result["error"]
    assert (result["metrics"]["stages"] is not None) == on
    return made, seen


def _shape(batch):
    return {
        k: (type(v), v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()
    }


@pytest.mark.parametrize("workers", [0, 2])
def test_the_users_batch_is_the_same_with_stage_timing_on_and_off(workers):
    made_on, seen_on = _run(workers, True)
    _, seen_off = _run(workers, False)
    assert [type(b) for b in seen_on] == [type(b) for b in seen_off] == [dict] * len(seen_on)
    assert [_shape(b) for b in seen_on] == [_shape(b) for b in seen_off]
    if workers == 0:  # in this process: the step gets the collate's own object
        assert all(any(b is m for m in made_on) for b in seen_on)


def test_the_summary_has_a_column_per_stage_and_statistic():
    from feedbench.analysis.aggregate import result_row
    from feedbench.core.records import record_of

    stats = {
        "mean_ms": 2.5,
        "median_ms": 2.0,
        "p90_ms": 3.0,
        "p99_ms": 4.0,
        "share": 0.5,
        "calls": 8,
    }
    timed = {"samples": 8, "batches": 2, "worker_ms_per_sample": 5.0, "stages": {"decode": stats}}
    row = result_row(
        record_of({"status": "ok", "metrics": {"steps": 2, "stages": timed}}, "result.json")
    )
    assert row["stage_worker_ms"] == 5.0
    assert {k: v for k, v in row.items() if k.startswith("stage_decode_")} == {
        "stage_decode_ms": 2.0,
        "stage_decode_mean_ms": 2.5,
        "stage_decode_p90_ms": 3.0,
        "stage_decode_p99_ms": 4.0,
        "stage_decode_share": 0.5,
        "stage_decode_calls": 8,
    }


def test_pin_memory_pins_the_users_batch_inside_and_keeps_the_timings(monkeypatch):
    """The pin thread gets the StagedBatch: it must pin the batch as it would alone, and pass the
    floats."""
    from torch.utils.data._utils.pin_memory import pin_memory

    pinned = []

    def fake_pin(self, *args, **kwargs):  # no accelerator here: record what would be pinned
        pinned.append(self)
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    batch = {"x": torch.ones(2, 3), "ids": [1, 2]}
    timings = {
        "sample_s": [0.1, 0.2],
        "stages": {"decode": [0.05, 0.06]},
        "calls": {"decode": 2},
        "collate_s": 0.01,
    }
    out = pin_memory(stages.StagedBatch(batch, timings))
    assert isinstance(out, stages.StagedBatch) and out.timings == timings
    assert len(pinned) == 1 and pinned[0] is batch["x"]
    assert torch.equal(stages.strip(out)["x"], batch["x"]) and stages.strip(out)["ids"] == [1, 2]


FOLDER_CODE = """
from torchvision import datasets, transforms


def build(root):  # the most common image dataset, as a user writes it: ImageFolder with its default loader
    return datasets.ImageFolder(root, transform=transforms.Compose([transforms.CenterCrop(24), transforms.ToTensor()]))
"""  # noqa: E501


@pytest.mark.parametrize("workers", [0, 2])
def test_an_image_folders_read_and_decode_is_a_stage_of_its_own(tmp_path, workers):
    """torchvision's ImageFolder (a DatasetFolder) reads and decodes each file in its `loader`: that
    is a stage of its own, named by its function, before the Compose's, where it was
    unattributed."""
    from conftest import write_user_module
    from feedbench.harness.images import make_images

    make_images(str(tmp_path / "jpegs"), count=24, size=32, classes=2)
    knobs = {
        "scenario": "loader",
        "dataset": "folder_data:build",
        "dataset_args": {"root": str(tmp_path / "jpegs" / "train")},
        "python_path": [write_user_module(tmp_path, "folder_data", FOLDER_CODE)],
        "device": "cpu",
        "batch_size": 4,
        "num_workers": workers,
        "steps": 5,
        "warmup_steps": 1,
        "torch_threads": 1,
        "monitor_interval_s": 5,
        "stage_timing": True,
    }
    try:
        run(knobs, str(tmp_path / "out"))
    finally:
        sys.modules.pop("folder_data", None)
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] == "ok", result["error"]
    got = result["metrics"]["stages"]["stages"]
    assert set(got) == {"default_loader", "CenterCrop", "ToTensor", "unattributed", "collate"}, (
        list(got)
    )
    assert got["default_loader"]["calls"] == 4 * 5 and got["default_loader"]["mean_ms"] > 0
    # the decode is named, not the rest
    assert got["default_loader"]["share"] > got["unattributed"]["share"], got
