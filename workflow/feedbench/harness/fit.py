"""Fit a valid cell to the machine that runs it, and say what was changed.

Where PyTorch would refuse a combination (pin_memory without an accelerator, prefetch_factor without
workers) the knob is reset, and each adaptation is recorded so the result says what really ran: the
rules are core.fit's; here they get torch's answer, and this node's GPUs and shared memory are
checked, so this runs in the job, never at parse time.
"""

from __future__ import annotations

from ..core import shm
from ..core.ceilings import batch_bytes
from ..core.cell import Cell, cell_dict
from ..core.fit import fit
from ..core.knobs import KnobError, user_batch
from .distributed import node_gpus, visible_gpus
from .launch import in_slurm_job


def resolve(cell: Cell, cuda_available: bool) -> tuple[Cell, list[str]]:
    """Fit the cell to this machine (core.fit's rules, with torch's answer), check its GPUs and
    shared memory; return it with the list of adjustments made."""
    resolved, notes = fit(cell, cuda_available)
    # one process; ddp and independent ranks: the launcher checks
    if resolved.device == "cuda" and cell.parallel == "dp":
        node_gpus(1, cell.gpus_per_node, visible_gpus())
    check_shm(resolved)
    return resolved, notes


def check_shm(cell: Cell) -> None:
    """Refuse a cell whose batches in flight cannot fit this node's shared memory, before its loader
    starts (a loader that runs out dies mid-run of a bus error). A user's batch has no declared
    size: not checked here."""
    knobs = cell_dict(cell)
    size = None if user_batch(knobs) else batch_bytes(knobs)
    error = shm.shm_error(knobs, size, shm.free_bytes(), local=not in_slurm_job())
    if error:
        raise KnobError(f"knob 'num_workers': value {cell.num_workers} {error}")
