"""The user's batch structure and to_device wherever feedbench copies a batch.

The transfer probe copies a real batch of theirs; the user's to_device is the mover of the measured
loop, the stream prefetcher, the comm and profile probes and the first-batch profile. On CPU a move
copies nothing, but every path must run with their batch and their mover; the copies on a GPU are
the `gpu` tests.
"""

from __future__ import annotations

import csv
import dataclasses

import feedbench
import pytest
import torch
from feedbench.harness.batches import move_batch
from torch import nn
from torch.utils.data import Dataset

KNOBS = dict(
    device="cpu", steps=3, warmup_steps=1, batch_size=4, torch_threads=1, monitor_interval_s=5
)


@dataclasses.dataclass
class Batch:
    """A batch type of the user's: a dataclass holding a nested dict."""

    image: torch.Tensor
    extra: dict
    label: torch.Tensor


class Samples(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.full((3, 4, 4), float(i)), i % 3


def collate(samples):
    images = torch.stack([s[0] for s in samples])
    return Batch(
        images,
        {"mask": torch.ones(len(samples), 4, dtype=torch.bool)},
        torch.tensor([s[1] for s in samples]),
    )


class Mover:
    """A to_device that counts its calls and marks what it returns, so a step can tell it got a
    moved batch."""

    def __init__(self):
        self.calls = []

    def __call__(self, batch, device, non_blocking):
        self.calls.append(type(batch).__name__)
        moved = move_batch(batch, device, non_blocking)
        return {"batch": moved, "moved_by_user": True}


def step(model, batch, ctx):
    assert batch.get("moved_by_user"), (
        f"the step got a batch the user's to_device never saw: {type(batch)}"
    )
    return nn.functional.cross_entropy(model(batch["batch"].image.flatten(1)), batch["batch"].label)


def test_the_transfer_probe_copies_a_real_batch_through_the_users_to_device(tmp_path):
    mover = Mover()
    result = feedbench.measure(
        dataset=Samples(),
        collate=collate,
        to_device=mover,
        scenario="transfer",
        transfer_sizes=[4096],
        out_dir=str(tmp_path),
        **KNOBS,
    )
    assert result["status"] == "ok", result["error"]
    user = result["metrics"]["transfer"]["user_batch"]
    assert user["structure"] == "Batch (dataclass) of 3 tensors"
    assert user["to_device"] == "feedbench.api:to_device_object"
    # 4 images of 3x4x4 float32, a 4x4 bool mask, 4 int64 labels.
    assert user["by_pinning"] == [
        {
            "pinned": False,
            "bytes": 4 * 48 * 4 + 16 + 4 * 8,
            "batch_median_ms": pytest.approx(user["by_pinning"][0]["batch_median_ms"]),
            "batch_median_gb_per_s": None,  # on CPU nothing is copied: no bandwidth is claimed
            "flat_median_ms": pytest.approx(user["by_pinning"][0]["flat_median_ms"]),
            "flat_median_gb_per_s": None,
        }
    ]
    assert mover.calls == ["Batch"] * (KNOBS["warmup_steps"] + KNOBS["steps"])
    assert any(
        a.startswith(
            "transfer: also timed a real batch (Batch (dataclass) of 3 tensors, 816 "
            "bytes, from dataset "
        )
        and "moved by feedbench.api:to_device_object, pageable" in a
        for a in result["adjustments"]
    ), result["adjustments"]
    with open(tmp_path / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["copy"] for r in rows} == {"sweep", "batch", "flat"}
    assert sum(r["copy"] == "batch" for r in rows) == KNOBS["steps"]
    # the bandwidth sweep is still there
    assert result["metrics"]["transfer"]["by_size"][0]["size_bytes"] == 4096


def test_a_builtin_dataset_probe_has_no_user_batch():
    result = feedbench.measure(
        dataset="memory", scenario="transfer", transfer_sizes=[4096], **KNOBS
    )
    assert result["status"] == "ok", result["error"]
    assert "user_batch" not in result["metrics"]["transfer"]


@pytest.mark.parametrize(
    "knobs",
    [
        {},  # the measured loop
        # the stream prefetcher (on CPU: the mover only)
        {"device_prefetch": "stream", "prefetch_depth": 2},
        {"parallel": "ddp", "comm_probe_steps": 2},  # the comm probe's resident batch
        {"profile": True, "profile_steps": 2},  # the profile's extra steps
    ],
    ids=["loop", "stream", "comm", "profile"],
)
def test_the_users_to_device_moves_every_batch_the_step_gets(knobs, tmp_path):
    mover = Mover()
    result = feedbench.measure(
        dataset=Samples(),
        collate=collate,
        to_device=mover,
        model=nn.Linear(48, 3),
        step=step,
        out_dir=str(tmp_path),
        **{**KNOBS, **knobs},
    )
    assert result["status"] == "ok", result["error"]
    assert not any("to_device is not used" in a for a in result["adjustments"]), result[
        "adjustments"
    ]
    # the probes' own batches
    extra = 1 if "comm_probe_steps" in knobs else knobs.get("profile_steps", 0)
    # Each batch the loop takes is moved once (the prefetcher may have moved up to its depth ahead).
    ahead = knobs.get("prefetch_depth", 0)
    assert KNOBS["warmup_steps"] + KNOBS["steps"] + extra <= len(mover.calls)
    assert len(mover.calls) <= KNOBS["warmup_steps"] + KNOBS["steps"] + extra + ahead
    if "comm_probe_steps" in knobs:
        assert result["metrics"]["comm"]["steps"] == 2


def test_the_first_batch_profile_uses_the_users_to_device():
    mover = Mover()
    result = feedbench.measure(
        dataset=Samples(),
        collate=collate,
        to_device=mover,
        scenario="loader",
        profile_first_batch=True,
        **KNOBS,
    )
    assert result["status"] == "ok", result["error"]
    assert mover.calls == ["Batch"]
    assert result["metrics"]["first_batch_profile"]["data_load_ms"] is not None


class Opaque:
    """A batch type that hides its tensors: only its own to_device knows them."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels


def opaque_collate(samples):
    return Opaque(torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples]))


def opaque_move(batch, device, non_blocking):
    return Opaque(
        batch.images.to(device, non_blocking=non_blocking),
        batch.labels.to(device, non_blocking=non_blocking),
    )


def opaque_step(model, batch, ctx):
    assert batch.images.is_cuda
    return nn.functional.cross_entropy(model(batch.images.flatten(1)), batch.labels)


@pytest.mark.gpu
def test_on_a_gpu_the_prefetcher_copies_an_opaque_batch_with_the_users_mover_and_says_how():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    result = feedbench.measure(
        dataset=Samples(),
        collate=opaque_collate,
        to_device=opaque_move,
        model=nn.Linear(48, 3),
        step=opaque_step,
        **{**KNOBS, "device": "cuda", "device_prefetch": "stream", "pin_memory": True},
    )
    assert result["status"] == "ok", result["error"]
    assert "h2d" in result["metrics"]["phases"]
    assert any("to_device returning a Opaque" in a for a in result["adjustments"]), result[
        "adjustments"
    ]
    assert any(
        "pin_memory=true but the first batch came back unpinned" in a for a in result["adjustments"]
    )


@pytest.mark.gpu
def test_on_a_gpu_the_transfer_probe_times_the_users_batch_pinned_and_pageable():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    result = feedbench.measure(
        dataset=Samples(),
        collate=collate,
        scenario="transfer",
        transfer_sizes=[4096],
        **{**KNOBS, "device": "cuda"},
    )
    assert result["status"] == "ok", result["error"]
    user = result["metrics"]["transfer"]["user_batch"]
    assert [p["pinned"] for p in user["by_pinning"]] == [False, True]
    assert all(
        p["batch_median_gb_per_s"] > 0 and p["flat_median_gb_per_s"] > 0 for p in user["by_pinning"]
    )
    # A dataclass batch is not pinned by the DataLoader (it pins dicts, lists, tuples, namedtuples):
    # said so.
    assert any("came back unpinned" in a and "batch type Batch" in a for a in result["adjustments"])
