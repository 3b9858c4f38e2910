"""feedbench.measure: objects in, the result dict out, nothing written unless asked."""

from __future__ import annotations

import os

import feedbench
import torch
from torch import nn
from torch.utils.data import TensorDataset

KNOBS = dict(
    device="cpu", steps=3, warmup_steps=1, batch_size=8, torch_threads=1, monitor_interval_s=5
)


def data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 6, generator=g), torch.randint(3, (64,), generator=g))


def test_objects_in_result_out_and_nothing_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = feedbench.measure(dataset=data(), model=nn.Linear(6, 3), **KNOBS)
    assert result["status"] == "ok" and result["metrics"]["samples"] == 3 * 8
    assert result["cell"]["dataset"] == "feedbench.api:dataset_object"
    assert "loss: cross-entropy against batch[1] (no step given)" in result["adjustments"]
    assert os.listdir(tmp_path) == []


def test_a_step_and_a_collate_as_callables_and_an_out_dir(tmp_path):
    calls = []

    def collate(samples):
        return {
            "x": torch.stack([s[0] for s in samples]),
            "y": torch.stack([s[1] for s in samples]),
        }

    def step(model, batch, ctx):
        calls.append(ctx.batch_size)
        return nn.functional.cross_entropy(model(batch["x"]), batch["y"])

    result = feedbench.measure(
        dataset=data(),
        model=nn.Linear(6, 3),
        collate=collate,
        step=step,
        out_dir=str(tmp_path / "out"),
        **KNOBS,
    )
    assert result["status"] == "ok" and calls == [8] * 4
    assert (tmp_path / "out" / "result.json").exists() and (tmp_path / "out" / "steps.csv").exists()


def test_a_bad_knob_is_a_failed_result_with_one_line():
    result = feedbench.measure(dataset=data(), model=nn.Linear(6, 3), **{**KNOBS, "batch_size": 0})
    assert result["status"] == "failed" and result["error"]["message"].startswith(
        "knob 'batch_size': value 0"
    )
