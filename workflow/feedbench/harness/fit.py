"""Fit a valid cell to the machine that runs it, and say what was changed.

Where PyTorch would refuse a combination (pin_memory without an accelerator,
prefetch_factor without workers) the knob is reset, and each adaptation is
recorded so the result says what really ran. The harness's, not the planner's:
it asks this machine (its GPUs), so it runs in the job, never at parse time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core import shm
from ..core.ceilings import batch_bytes
from ..core.cell import Cell, cell_dict
from ..core.knobs import KNOBS, KnobError, user_batch
from .distributed import node_gpus, visible_gpus
from .launch import in_slurm_job

# What `timing: naive` can and cannot tell on a GPU (docs/harness.md): said in every such cell's
# adjustments.
NAIVE_ON_GPU = (
    "timing=naive on a GPU: stall_pct is the host's wait for the loader, not the GPU's idle time "
    "(the host runs ahead of the GPU, so the wait can overstate the GPU's starvation), and "
    "asynchronous GPU work is charged to whichever phase blocks; throughput is right; "
    "timing=events measures the GPU's idle"
)


def resolve(cell: Cell, cuda_available: bool) -> tuple[Cell, list[str]]:
    """Fit the cell to this machine; return it with the list of adjustments made."""
    notes: list[str] = []
    changes: dict[str, Any] = {}
    if cell.device == "cuda" and not cuda_available:
        raise KnobError(
            "knob 'device': value 'cuda' is not available (torch.cuda.is_available() is False); "
            "allowed: auto, cpu"
        )
    device = (
        "cuda" if cell.device == "cuda" or (cell.device == "auto" and cuda_available) else "cpu"
    )
    changes["device"] = device
    if cell.decoder == "torchvision-cuda" and device != "cuda":
        raise KnobError(
            "knob 'decoder': value 'torchvision-cuda' needs a GPU and this node has none "
            "(torch.cuda.is_available() is False); allowed: pil, torchvision"
        )
    if cell.num_workers == 0:
        for name, knob in KNOBS.items():
            if knob.needs_workers and getattr(cell, name) != knob.default:
                changes[name] = knob.default
                notes.append(f"{name}={getattr(cell, name)} ignored: it needs num_workers > 0")
    if device == "cpu":
        if cell.pin_memory:
            changes["pin_memory"] = False
            notes.append("pin_memory=true ignored: no accelerator to pin for")
        if cell.device_prefetch == "stream":
            notes.append(
                "device_prefetch=stream is a pass-through on CPU: there is no copy to overlap"
            )
        if cell.timing == "events":
            notes.append(
                "timing=events uses the host clock on CPU, where every phase is synchronous"
            )
    if device == "cuda" and cell.timing == "naive":
        notes.append(NAIVE_ON_GPU)
    if cell.parallel == "dp" and device == "cpu" and cell.gpus_per_node > 1:
        notes.append(
            f"parallel=dp on CPU runs one replica on batch_size x {cell.gpus_per_node}: "
            "DataParallel needs GPUs"
        )
    # one process; ddp and independent ranks: the launcher checks
    if device == "cuda" and cell.parallel == "dp":
        node_gpus(1, cell.gpus_per_node, visible_gpus())
    if cell.channels_last and cell.model in ("mlp", "lstm", "sleep", "none"):
        changes["channels_last"] = False
        notes.append(f"channels_last=true ignored: model '{cell.model}' takes no images")
    if cell.page_cache != "asis" and (
        cell.dataset != "images" or cell.scenario in ("compute", "transfer")
    ):
        changes["page_cache"] = "asis"
        why = (
            f"scenario '{cell.scenario}' reads no files in its window"
            if cell.dataset == "images"
            else f"dataset '{cell.dataset}' is read into memory when built"
            if cell.dataset.startswith("cifar")
            else f"dataset '{cell.dataset}': page_cache is implemented for images only"
            if cell.dataset in ("webdataset", "parquet")
            else f"dataset '{cell.dataset}' reads no files"
        )
        notes.append(f"page_cache={cell.page_cache} ignored: {why}")
    if cell.amp != "off" and cell.model in ("sleep", "none"):
        changes["amp"] = "off"
        notes.append(f"amp={cell.amp} ignored: model '{cell.model}' does no arithmetic")
    resolved = dataclasses.replace(cell, **changes)
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
