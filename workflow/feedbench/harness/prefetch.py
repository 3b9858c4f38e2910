"""Host-to-device copies: plain, and a side-stream prefetcher of depth k.

The prefetcher is the pattern of Ray's auto pipeline: batch k+1 is copied on a
side stream while batch k computes; the consumer's stream waits for that copy
only, and record_stream tells the caching allocator the compute stream uses
the memory. On CPU there is no copy to overlap: each batch only goes through the mover.
Every copy goes through one mover: the user's to_device knob, else
feedbench.harness.batches.move_batch (nested dicts, lists, tuples, namedtuples, dataclasses).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Iterator

import torch

from .batches import batch_tensors, move_batch

to_device = move_batch  # the default mover, under the name the harness's callers know


class StreamPrefetcher:
    """Iterate device batches whose copies were issued `depth` batches ahead on a side stream.

    Each item is (host_batch, device_batch, copy_events): copy_events is the
    (start, end) pair of CUDA events around the copy on the side stream, or
    None on CPU, so the harness can time the copy without synchronising.
    `move(batch, device, non_blocking)` does the copy: the user's to_device when given.
    """

    def __init__(
        self,
        batches: Iterable,
        device: torch.device,
        depth: int = 1,
        non_blocking: bool = True,
        move: Callable = move_batch,
    ):
        self.batches, self.device, self.depth, self.non_blocking = (
            iter(batches),
            device,
            depth,
            non_blocking,
        )
        self.move = move
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.in_flight: deque = deque()
        # set when the mover's batches hide their tensors (an adjustment)
        self.note: str | None = None

    def __iter__(self) -> Iterator:
        return self

    def _issue(self) -> bool:
        host = next(self.batches, None)
        if host is None:
            return False
        # nothing to overlap, but the batch still goes through the mover, as without prefetch
        if self.stream is None:
            self.in_flight.append((host, self.move(host, self.device, self.non_blocking), None))
            return True
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # memory freed by the compute stream is reused here only once that stream is past it
        if self.note:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            start.record()
            device_batch = self.move(host, self.device, self.non_blocking)
            end.record()
        if self.note is None and not batch_tensors(device_batch):
            self.note = (
                f"device_prefetch=stream with to_device returning a {type(device_batch).__name__}"
                ", whose tensors feedbench cannot see to record_stream: each copy waits for the "
                "compute issued before it"
            )
        self.in_flight.append((host, device_batch, (start, end)))
        return True

    def __next__(self):
        while len(self.in_flight) < self.depth + 1 and self._issue():
            pass
        if not self.in_flight:
            raise StopIteration
        host, device_batch, events = self.in_flight.popleft()
        if events is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(events[1])
            for tensor in streamed(device_batch):
                tensor.record_stream(compute)
        return host, device_batch, events


def streamed(device_batch) -> list[torch.Tensor]:
    """The tensors of a copied batch that the compute stream must record: the CUDA ones it exposes.

    A mover may leave some on the host (lengths for pack_padded_sequence, say), and record_stream of
    a CPU tensor raises NotImplementedError; a custom batch type shows only the tensors it exposes.
    """
    return [tensor for tensor in batch_tensors(device_batch) if tensor.is_cuda]


def pinned_held() -> int | None:
    """The page-locked host memory PyTorch's pinned allocator holds in this process, in bytes
    (torch.cuda.host_memory_stats' allocated_bytes: every block it made, in use or cached; it gives
    none back unless asked to). Read after a cell's window it is the pool the cell needed, blocks
    held by queued non_blocking copies included, plus what earlier cells of the process left
    cached. None where this torch does not say, or CUDA never started."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None or not torch.cuda.is_initialized():
        return None
    return stats().get("allocated_bytes.current")
