"""Host-to-device copies: plain, and a side-stream prefetcher of depth k.

The prefetcher is the pattern of Ray's auto pipeline: batch k+1 is copied on a
side stream while batch k computes; the consumer's stream waits for that copy
only, and record_stream tells the caching allocator the compute stream uses
the memory. On CPU there is no copy to overlap and it is a pass-through.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator

import torch


def to_device(batch, device: torch.device, non_blocking: bool):
    """Move every tensor of a (possibly nested) batch to the device."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


def batch_bytes(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(b) for b in batch)
    if isinstance(batch, dict):
        return sum(batch_bytes(v) for v in batch.values())
    return 0


def _record_stream(batch, stream: torch.cuda.Stream) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            _record_stream(b, stream)
    elif isinstance(batch, dict):
        for v in batch.values():
            _record_stream(v, stream)


class StreamPrefetcher:
    """Iterate device batches whose copies were issued `depth` batches ahead on a side stream.

    Each item is (host_batch, device_batch, copy_events): copy_events is the
    (start, end) pair of CUDA events around the copy on the side stream, or
    None on CPU, so the harness can time the copy without synchronising.
    """

    def __init__(self, batches: Iterable, device: torch.device, depth: int = 1, non_blocking: bool = True):
        self.batches, self.device, self.depth, self.non_blocking = iter(batches), device, depth, non_blocking
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.in_flight: deque = deque()

    def __iter__(self) -> Iterator:
        return self

    def _issue(self) -> bool:
        host = next(self.batches, None)
        if host is None:
            return False
        if self.stream is None:
            self.in_flight.append((host, host, None))
            return True
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record()
            device_batch = to_device(host, self.device, self.non_blocking)
            end.record()
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
            _record_stream(device_batch, compute)
        return host, device_batch, events
