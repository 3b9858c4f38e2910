"""What a command's instrument measured in one process (a rank): the one protocol between the
instrument in the user's process (harness.inloop writes it, as JSON, when its window closes or the
command ends) and the cell's harness (harness.command reads it and builds the result).

Its fields are typed once, here; the harness reads attributes, never keys, so a figure one side
stops writing fails where it is read, not in a report.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field


@dataclass
class Whole:
    """The training loader's batches and samples over the whole command, warm-up and the rest
    included: what the fidelity pair divides by each run's time."""

    batches: int = 0
    samples: int = 0


@dataclass
class WindowFigures:
    """One process's measured window, and what it saw of the script's loaders."""

    mode: str  # harness.inloop.MODES
    pid: int
    rank: int
    # per measured step, ms of each phase and of the step (harness.script_steps.step_table)
    table: dict[str, list[float]]
    samples: list[int]  # per measured step
    h2d_bytes: int  # the window's batches' host tensors, where the device is a GPU
    window_s: float | None  # the first measured step's request to the last one's end
    # how the window closed (closed_by), the trainer's threads, the loader's worker processes
    # (workers), whether the first steps still carried the global hook (global_hook), and the
    # instrument's own time in it (own_s)
    window: dict
    time_to_first_batch_s: float | None
    device: str  # "cpu" or "cuda:<index>"
    timing: str  # events, sync, naive, or wall on the CPU
    torch_threads: int
    launch_threads: int
    loader: dict | None  # the training loader (script_loaders.Loader.facts and why)
    loaders: list[dict]  # every loader the script built
    forward_seen: bool
    optimizer_ms: list[float]  # per measured step: the optimizer steps' own time
    boundary_steps: list[int]  # the measured steps whose wait met their epoch's end
    stage_log: list[dict] = field(default_factory=list)  # the training loader's batches' timings
    stage_skip: int = 0  # its batches before the window
    stage_order: list[str] | None = None
    stage_probe: dict = field(default_factory=dict)
    whatif: dict | None = None  # what the cell's stage what-if did and traded (harness.whatif)
    gc: dict | None = None  # the collector in the window (harness.collector)
    whole: Whole = field(default_factory=Whole)
    notes: list[str] = field(default_factory=list)
    # the GPU, torch, CUDA and Python of the command's own interpreter (provenance.software_facts)
    software: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.table["step"])

    @property
    def instrument_ms_per_step(self) -> float | None:
        """The instrument's own time per measured step (its hooks, less the loader's and the
        backward's own work)."""
        own = self.window.get("own_s")
        return own * 1000 / self.steps if own is not None and self.steps else None

    def write(self, path: str) -> None:
        """Atomically: the harness may read it as the command ends."""
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f, default=str)
        os.replace(path + ".tmp", path)

    @classmethod
    def read(cls, path: str) -> WindowFigures:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
        return cls(**{**found, "whole": Whole(**found["whole"])})
