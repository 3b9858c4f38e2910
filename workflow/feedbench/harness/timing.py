"""Phase clocks: where each step's time goes, measured three ways.

* events: CUDA events recorded at phase boundaries on the compute stream, no
  host synchronisation; read once after the measured window. The instrument
  does not change the schedule it measures.
* sync: synchronise the compute stream at each boundary, then read the host
  clock: the classic method; true per-phase GPU time, but it serialises host
  and GPU. The compute stream only, so a side-stream copy still overlaps.
* naive: the host clock with no synchronisation, as the published studies
  did: asynchronous work lands in whichever phase happens to block.

On CPU all three read the host clock: every phase is synchronous there.

device_prep: device work the trainer does while it fetches the next batch (device_stages' copy and
transforms, torchvision-cuda's decode and transforms) runs in the gap between two steps. Each such
piece of work is wrapped in `device_work()`, which marks it by the clock's own method (events, sync,
or the host clock), so it is a phase of its own: neither the host's wait for the loader nor, under
events, the GPU's idle time between steps.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import Iterator

import torch

# the clock whose step's batch is being fetched: device_work records on it
_fetching: PhaseClock | None = None


@contextlib.contextmanager
def device_work() -> Iterator[None]:
    """Around the device work of a batch being fetched: the fetching step's device_prep (none
    outside a fetch).

    Also the user's, as `feedbench.device_work()`: a dataset or collate that touches CUDA in the
    training process. A span inside another is counted in it, once."""
    global _fetching
    clock = _fetching
    if clock is None:
        yield
        return
    _fetching = None  # a span inside this one is part of it
    try:
        host = time.perf_counter()
        start = clock.stamp()
        yield
        clock.pending.append((start, clock.stamp()))
        clock.pending_host_ms += (time.perf_counter() - host) * 1000
    finally:
        _fetching = clock


class PhaseClock:
    """Records boundaries of `phases` for each measured step; durations come from read()."""

    def __init__(self, mode: str, device: torch.device, phases: tuple[str, ...]):
        self.phases = phases
        self.use_events = mode == "events" and device.type == "cuda"
        self.sync = mode == "sync" and device.type == "cuda"
        self.device = device
        self.steps: list[list] = []  # per step: len(phases) + 1 boundaries
        # per step: the (start, end) marks of device work done while its batch was fetched
        self.prep: list[list] = []
        # those of the fetch under way, and their host time (the loop's wait leaves it out)
        self.pending: list = []
        self.pending_host_ms = 0.0

    @property
    def effective_mode(self) -> str:
        return (
            "events"
            if self.use_events
            else ("sync" if self.sync else ("naive" if self.device.type == "cuda" else "wall"))
        )

    @contextlib.contextmanager
    def fetching(self) -> Iterator[None]:
        """While the loop fetches a step's batch: device_work inside it is that step's
        device_prep."""
        global _fetching
        self.pending, self.pending_host_ms = [], 0.0
        _fetching = self
        try:
            yield
        finally:
            _fetching = None

    def start_step(self) -> None:
        self.prep.append(self.pending)
        self.pending = []
        self.steps.append([])
        self.mark()

    def mark(self) -> None:
        self.steps[-1].append(self.stamp())

    def stamp(self):
        """A boundary by the clock's method: a CUDA event, or the host clock (after a sync of the
        compute stream)."""
        if self.use_events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        # the compute stream only: a device-wide sync would also wait for the prefetcher's next copy
        if self.sync:
            torch.cuda.current_stream(self.device).synchronize()
        return time.perf_counter()

    def _ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.use_events else (b - a) * 1000

    def read(self) -> dict[str, list[float]]:
        """Per-phase durations in ms for every step, plus device_prep where the steps' fetches did
        device work, and gpu_idle_ms between steps (events only): the gap less the device work in
        it.

        Call after the device was synchronised at the end of the window.
        """
        prep = [sum(self._ms(a, b) for a, b in spans) for spans in self.prep[: len(self.steps)]]
        out: dict[str, list[float]] = (
            {"device_prep": prep} if any(self.prep[: len(self.steps)]) else {}
        )
        out.update({p: [] for p in self.phases})
        if self.use_events:
            out["gpu_idle"] = []
        for i, marks in enumerate(self.steps):
            for p, (a, b) in zip(self.phases, itertools.pairwise(marks), strict=True):
                out[p].append(self._ms(a, b))
            if self.use_events:
                gap = self.steps[i - 1][-1].elapsed_time(marks[0]) if i else 0.0
                out["gpu_idle"].append(max(0.0, gap - prep[i]))
        return out


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
