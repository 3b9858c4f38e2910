"""A training step's marks in the script's own loop (harness.inloop), and the step table they give,
as harness.loop.Measurement.step_table gives a cell's: host times, and CUDA events where the
device is timed."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..core.metrics import CLOCKED_PHASES


@dataclass
class Step:
    """One training step's marks: host times, and CUDA events where the device is timed."""

    request: float
    delivered: float | None = None
    end: float | None = None  # the next request, or the window's synchronised end
    boundary: bool = False  # its wait met its epoch's end
    forward: float | None = None
    backward: float | None = None
    backward_end: float | None = None
    optimizer_ms: float = 0.0
    events: dict = field(default_factory=dict)
    samples: int = 0
    copied: int = 0


def step_table(
    steps: list[Step], events: bool, phases: tuple[str, ...] = CLOCKED_PHASES
) -> dict[str, list[float]]:
    """Per measured step, ms of each phase and of the whole step (the harness's step table, as
    harness.loop.Measurement.step_table gives it); `phases` () for the loader alone. A mark the
    loop never reached (no module called, no backward) takes the one before it: its phase reads
    zero."""
    table: dict[str, list[float]] = {"wait": [], **{p: [] for p in phases}, "step": []}
    if events and phases:
        table["gpu_idle"] = []
    for step in steps:
        end = step.end if step.end is not None else step.delivered
        marks = [step.delivered]
        for name in ("forward", "backward", "backward_end"):
            marks.append(getattr(step, name) or marks[-1])
        marks.append(max(end, marks[-1]))
        table["wait"].append((step.delivered - step.request) * 1000)
        table["step"].append((end - step.request) * 1000)
        if not phases:
            continue
        if events and step.events.get("delivered") is not None:
            device = [step.events["delivered"]]
            for name in ("forward", "backward", "backward_end", "next"):
                device.append(step.events.get(name) or device[-1])
            for phase, (a, b) in zip(CLOCKED_PHASES, itertools.pairwise(device), strict=True):
                table[phase].append(a.elapsed_time(b))
            table["gpu_idle"].append(step.events["request"].elapsed_time(step.events["delivered"]))
        else:
            for phase, (a, b) in zip(CLOCKED_PHASES, itertools.pairwise(marks), strict=True):
                table[phase].append((b - a) * 1000)
    return table
