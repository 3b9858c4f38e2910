"""What a cell runs as on a machine with or without CUDA: the knobs PyTorch would refuse or ignore
there are reset, each with a note, so that a result says what really ran.

The rules only: given whether CUDA is available, no torch here. The harness applies them with
torch's answer (harness.fit.resolve, which also checks the node's GPUs and shared memory); the plan
applies them to find the cells a machine without CUDA runs alike (plan.twins), which a local run
then measures once.
"""

from __future__ import annotations

import dataclasses
import glob
import re
from typing import Any

from .cell import Cell
from .knobs import KNOBS, KnobError

# What `timing: naive` can and cannot tell on a GPU (docs/harness.md): said in every such cell's
# adjustments.
NAIVE_ON_GPU = (
    "timing=naive on a GPU: stall_pct is the host's wait for the loader, not the GPU's idle time "
    "(the host runs ahead of the GPU, so the wait can overstate the GPU's starvation), and "
    "asynchronous GPU work is charged to whichever phase blocks; throughput is right; "
    "timing=events measures the GPU's idle"
)

# Device files without which no CUDA runtime finds a GPU: NVIDIA's (made when its driver loads; the
# proc and sys entries too, for a driver whose /dev nodes are made at the first CUDA call), ROCm's
# (PyTorch's HIP build answers as cuda) and WSL2's GPU bridge.
CUDA_DEVICE_FILES = (
    "/dev/nvidia*",
    "/proc/driver/nvidia",
    "/sys/module/nvidia",
    "/dev/kfd",
    "/sys/module/amdgpu",
    "/dev/dxg",
)


def cuda_possible(device_files=CUDA_DEVICE_FILES) -> bool:
    """Whether this machine may have a GPU that torch.cuda sees, known without importing torch:
    False only where none of the device files a CUDA runtime needs exists. Errs towards True, so
    that a cell is never taken as another's twin on a machine where pinning or a GPU counts."""
    return any(glob.glob(pattern) for pattern in device_files)


def fit(cell: Cell, cuda_available: bool) -> tuple[Cell, list[str]]:
    """The cell as a machine with (or without) CUDA runs it, and the notes that say what changed.
    KnobError where the machine cannot run it at all."""
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
    if cell.channels_last and cell.model in ("mlp", "lstm", "sleep", "none"):
        changes["channels_last"] = False
        notes.append(f"channels_last=true ignored: model '{cell.model}' takes no images")
    if cell.page_cache != "asis" and (
        cell.dataset != "images" or cell.scenario in ("compute", "transfer")
    ):
        changes["page_cache"] = "asis"
        notes.append(f"page_cache={cell.page_cache} ignored: {_no_page_cache(cell)}")
    if cell.amp != "off" and cell.model in ("sleep", "none"):
        changes["amp"] = "off"
        notes.append(f"amp={cell.amp} ignored: model '{cell.model}' does no arithmetic")
    return dataclasses.replace(cell, **changes), notes


def _no_page_cache(cell: Cell) -> str:
    """Why page_cache does nothing for this cell."""
    if cell.dataset == "images":
        return f"scenario '{cell.scenario}' reads no files in its window"
    if cell.dataset.startswith("cifar"):
        return f"dataset '{cell.dataset}' is read into memory when built"
    if cell.dataset in ("webdataset", "parquet"):
        return f"dataset '{cell.dataset}': page_cache is implemented for images only"
    return f"dataset '{cell.dataset}' reads no files"


# The note of a cell that took the result of a cell that runs alike (plan.twins), among its
# adjustments; twin_of reads it back (the verdict names such a cell's figures once, as its twin's).
TWIN_NOTE = (
    "not measured again: cell {twin} runs alike here, on the CPU, so its result stands for this "
    "cell"
)
_TWIN_NOTE = re.compile(re.escape(TWIN_NOTE).replace(r"\{twin\}", r"(\S+)"))


def twin_of(adjustments: str | None) -> str | None:
    """The cell whose result this one took (TWIN_NOTE among its adjustments, as the summary joins
    them), or None."""
    found = _TWIN_NOTE.search(adjustments) if isinstance(adjustments, str) else None
    return found[1] if found else None


def runs_as(cell: Cell, cuda_available: bool) -> tuple[str, list[str]] | None:
    """What the cell runs as, labels aside, as one comparable text (two cells with the same text run
    the same code on such a machine), and the fit's notes. None where the machine cannot run it."""
    try:
        fitted, notes = fit(cell, cuda_available)
    except KnobError:
        return None
    # the knob fields in the table's order, labels left out: no copy of the cell (cell_dict's deep
    # copy was most of the Snakefile's parse time at 10,000 cells)
    return repr([getattr(fitted, name) for name in KNOBS]), notes
