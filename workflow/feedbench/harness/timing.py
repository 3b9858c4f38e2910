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
"""

from __future__ import annotations

import itertools
import time

import torch


class PhaseClock:
    """Records boundaries of `phases` for each measured step; durations come from read()."""

    def __init__(self, mode: str, device: torch.device, phases: tuple[str, ...]):
        self.phases = phases
        self.use_events = mode == "events" and device.type == "cuda"
        self.sync = mode == "sync" and device.type == "cuda"
        self.device = device
        self.steps: list[list] = []  # per step: len(phases) + 1 boundaries

    @property
    def effective_mode(self) -> str:
        return (
            "events"
            if self.use_events
            else ("sync" if self.sync else ("naive" if self.device.type == "cuda" else "wall"))
        )

    def start_step(self) -> None:
        self.steps.append([])
        self.mark()

    def mark(self) -> None:
        if self.use_events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.steps[-1].append(event)
            return
        if self.sync:  # the compute stream only: a device-wide sync would also wait for the prefetcher's next copy
            torch.cuda.current_stream(self.device).synchronize()
        self.steps[-1].append(time.perf_counter())

    def read(self) -> dict[str, list[float]]:
        """Per-phase durations in ms for every step, plus gpu_idle_ms between steps (events only).

        Call after the device was synchronised at the end of the window.
        """
        out: dict[str, list[float]] = {p: [] for p in self.phases}
        if self.use_events:
            out["gpu_idle"] = []
        for i, marks in enumerate(self.steps):
            for p, (a, b) in zip(self.phases, itertools.pairwise(marks), strict=True):
                out[p].append(a.elapsed_time(b) if self.use_events else (b - a) * 1000)
            if self.use_events:
                out["gpu_idle"].append(self.steps[i - 1][-1].elapsed_time(marks[0]) if i else 0.0)
        return out


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
