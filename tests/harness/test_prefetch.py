"""The stream prefetcher yields the same batches, in the same order, with the same values."""

from __future__ import annotations

import pytest
import torch
from feedbench.harness.data import SyntheticDataset
from feedbench.harness.prefetch import StreamPrefetcher, to_device
from helpers.cells import tiny_mlp
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
    got = [
        device_batch
        for _, device_batch, events in StreamPrefetcher(
            _loader(workers), torch.device("cpu"), depth
        )
    ]
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
        # Work on the compute stream after the copy, as training does, before the next batch is
        # issued.
        got.append((device_batch[0] * 1, device_batch[1] + 0))
    torch.cuda.synchronize()
    _assert_same(expected, got)
    _assert_same(expected, plain)


def test_stream_prefetch_cell_runs_and_reports_copy_phase(run_cell):
    knobs = tiny_mlp(
        input_size=64,
        width=64,
        batch_size=16,
        dataset="memory",
        num_samples=256,
        steps=10,
        warmup_steps=2,
    )
    code, result = run_cell(**knobs, device_prefetch="stream", prefetch_depth=2)
    assert code == 0, result["error"]
    assert result["metrics"]["steps"] == 10
    assert set(result["metrics"]["phases"]) == {"wait", "h2d", "fwd", "bwd", "opt"}


@pytest.mark.gpu
@pytest.mark.parametrize("depth", [1, 2])
def test_stream_prefetch_keeps_every_batch_intact_under_reuse(depth):
    """Large batches, each filled with its own number, read twice by the compute stream: at once (a
    missing wait_event reads the first copy still in flight) and again after a long spin (a missing
    record_stream lets the allocator hand the freed block to the next copy on the side stream while
    the spin still holds it). To check on a GPU: with either call removed from
    StreamPrefetcher.__next__ this test should fail (#27; not yet run)."""
    # 256 MB of int32 per batch: copies of milliseconds, reused blocks of the same size
    numel = 64 * 2**20
    batches = [(torch.full((numel,), i + 1, dtype=torch.int32).pin_memory(),) for i in range(6)]
    sums = []
    for _, (device_batch,), _ in StreamPrefetcher(batches, torch.device("cuda", 0), depth):
        first = device_batch.sum()
        # tens of ms on the compute stream, while the next copy is issued
        torch.cuda._sleep(50_000_000)
        sums.append((first, device_batch.sum()))
        del device_batch  # freed by the host at once, in use by the compute stream for a while yet
    torch.cuda.synchronize()
    assert [(int(a), int(b)) for a, b in sums] == [
        ((i + 1) * numel, (i + 1) * numel) for i in range(6)
    ]


@pytest.mark.gpu
def test_stream_prefetch_with_host_tensors_in_the_batch():
    """A to_device that leaves the lengths on the host, as pack_padded_sequence wants them."""

    def move(batch, device, non_blocking):
        return batch[0].to(device, non_blocking=non_blocking), batch[1]

    got = list(StreamPrefetcher(_loader(0, pin=True), torch.device("cuda", 0), 1, move=move))
    assert len(got) == 10 and all(b[1][0].is_cuda and not b[1][1].is_cuda for b in got)
