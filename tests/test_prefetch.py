"""The stream prefetcher yields the same batches, in the same order, with the same values."""

from __future__ import annotations

import pytest
import torch
from feedbench.data import SyntheticDataset
from feedbench.prefetch import StreamPrefetcher, to_device
from torch.utils.data import DataLoader


def _loader(workers: int = 0, pin: bool = False) -> DataLoader:
    dataset = SyntheticDataset(num_samples=40, shape=(3, 8, 8), num_classes=10, seed=1)
    return DataLoader(
        dataset,
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        pin_memory=pin,
        generator=torch.Generator().manual_seed(7),
    )


def _assert_same(expected: list, got: list) -> None:
    assert len(got) == len(expected) == 10
    for (x0, y0), (x1, y1) in zip(expected, got, strict=True):
        assert torch.equal(x0, x1.cpu()) and torch.equal(y0, y1.cpu())


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_same_batches_as_no_prefetch_on_cpu(depth, workers):
    expected = list(_loader(workers))
    got = [device_batch for _, device_batch, events in StreamPrefetcher(_loader(workers), torch.device("cpu"), depth)]
    _assert_same(expected, got)


@pytest.mark.gpu
@pytest.mark.parametrize("depth", [1, 2, 4])
@pytest.mark.parametrize("pin", [False, True])
def test_same_batches_as_no_prefetch_on_gpu(depth, pin):
    device = torch.device("cuda")
    expected = list(_loader(0, pin))
    plain = [to_device(b, device, non_blocking=True) for b in _loader(0, pin)]
    got = []
    for _, device_batch, events in StreamPrefetcher(_loader(0, pin), device, depth):
        assert device_batch[0].is_cuda and events is not None
        # Work on the compute stream after the copy, as training does, before the next batch is issued.
        got.append((device_batch[0] * 1, device_batch[1] + 0))
    torch.cuda.synchronize()
    _assert_same(expected, got)
    _assert_same(expected, plain)


def test_stream_prefetch_cell_runs_and_reports_copy_phase(run_cell):
    code, result = run_cell(
        model="mlp",
        input_size=64,
        width=64,
        batch_size=16,
        dataset="memory",
        num_samples=256,
        device_prefetch="stream",
        prefetch_depth=2,
        steps=10,
        warmup_steps=2,
    )
    assert code == 0, result["error"]
    assert result["metrics"]["steps"] == 10
    assert set(result["metrics"]["phases"]) == {"wait", "h2d", "fwd", "bwd", "opt"}
