"""Python's garbage collector in the measured window: its pauses recorded, and the knob `gc` that
sets its rule (not on/off: YAML reads those as booleans).

A full collection of a large heap stops every Python thread for tens of milliseconds (144 ms for 1.2
M objects on the 2-core development VM), and a training thread that builds a batch's Python objects
every step (a collate, a `num_workers: 0` loader) triggers the young generations often. Python's own
`timeit` turns the collector off while it times; a training job does not. Whatever the rule, every
collection that runs inside the window in the trainer's process is recorded through `gc.callbacks`:
how many, by generation, and how long they held the threads.

    freeze  (the default) freeze the heap before the warm-up (gc.freeze: the model, the dataset's
            index, everything made at start-up is never scanned again, as in a long run's steady
            state), the collector left on: the step's own garbage is collected and its pauses
            counted
    normal  the collector as a fresh process runs it: a short window after start-up may catch a full
            collection of the start-up heap, which a long run pays rarely
    disable as freeze, and the collector off until the window closes (timeit's rule)

docs/performance.md ("The collector in the window") has the figures behind the default. Loader
workers are processes of their own: they collect on their own, unrecorded here, with their collector
on (worker_init); one forked while the heap is frozen keeps it frozen, as a heap frozen before a
fork is meant to be.
"""

from __future__ import annotations

import gc
import time


class Collector:
    """Opens and closes with the measured window; between the two, each collection's pause is
    recorded."""

    def __init__(self, mode: str = "freeze"):
        self.mode = mode
        # (generation, seconds) of each collection in the window
        self.pauses: list[tuple[int, float]] = []
        self._started: float | None = None
        self._open = self._frozen = False
        # whether the window opened: its summary is the result's, else the result has none
        self.opened = False
        self._was_enabled = gc.isenabled()

    def freeze(self) -> None:
        """freeze and disable: freeze the start-up heap before the warm-up, without a collection
        first. A full collection of a process that imported torch takes 0.25-0.5 s, paid by every
        cell (about 10 % of the default run), and loader workers go on filling their queue
        meanwhile: done at the window's start it handed the window batches made during the pause
        (calibration's loader-bound cells read 23 to 60 % fast). Start-up garbage that is frozen
        with the heap is only held until close() thaws it, where the collector finds it again."""
        if self.mode in ("freeze", "disable") and not self._frozen:
            gc.freeze()
            self._frozen = True

    def open(self) -> None:
        if self._open:
            return
        self.freeze()  # a cell without warm-up: here, still before its first measured step
        if self.mode == "disable":
            self._was_enabled = gc.isenabled()
            gc.disable()
        gc.callbacks.append(self._callback)
        self._open = self.opened = True

    def close(self) -> None:
        """Idempotent: the window's end, or the cell's (a failure, in the window or in its warm-up)
        closes it once."""
        if self._frozen:
            gc.unfreeze()
            self._frozen = False
        if not self._open:
            return
        self._open = False
        gc.callbacks.remove(self._callback)
        if self.mode == "disable" and self._was_enabled:
            gc.enable()

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))
            self._started = None

    def summary(self) -> dict:
        """The result's `metrics.gc`: the mode, the collections in the window, their total and
        longest pause."""
        return {
            "mode": self.mode,
            "collections": len(self.pauses),
            "by_generation": [
                sum(1 for g, _ in self.pauses if g == generation) for generation in range(3)
            ],
            "pause_ms": round(1000 * sum(s for _, s in self.pauses), 3),
            "max_pause_ms": round(1000 * max((s for _, s in self.pauses), default=0.0), 3),
        }


def worker_init(_worker_id: int) -> None:
    """A loader worker's collector on, whatever the trainer's was when the worker forked (gc:
    disable turns it off in the trainer during the window, and a worker forked then would inherit
    that). A frozen heap stays frozen: thawing it would write every inherited object's header,
    copying the parent's whole heap into the worker, the copy that freezing before a fork is known
    to save."""
    gc.enable()
