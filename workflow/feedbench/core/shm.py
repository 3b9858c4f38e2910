"""Shared memory: whether a cell's loader can hold its batches in flight in /dev/shm
(docs/harness.md).

A DataLoader worker hands each batch to the training process in shared memory
(torch.multiprocessing), so a loader keeps up to prefetch_factor x num_workers batches there, plus
the one the training step (or the pin thread) holds. Docker gives a container 64 MB of /dev/shm
unless told `--shm-size`; a loader that needs more dies mid-run of a bus error or "No space left on
device". Both sharing strategies put the same bytes there (file_system names them as files instead
of passing descriptors), so the check is the same for both.

Checked before the loader starts: at plan time when the run is local (the Snakefile's onstart) and
in the cell's job on the node that runs it (feedbench.harness.runner). Plain Python: the planner and
the job call the same arithmetic.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from . import resources
from .ceilings import batch_bytes, batch_tensor_bytes
from .knobs import user_batch

SHM_PATH = "/dev/shm"
# torch's prefetch_factor when the knob is None and there are workers.
PREFETCH_DEFAULT = 2
# How a loader that ran out of shared memory anyway says so: a worker killed by SIGBUS (torch names
# the cause), or torch's own allocation failing in a worker.
OUT_OF_SHM = re.compile(
    r"bus error|sigbus|insufficient shared memory|out of shared memory|unable to allocate shared "
    r"memory",
    re.I,
)
FIXES = (
    "allowed: a larger /dev/shm (docker run --shm-size, a bigger tmpfs), fewer num_workers, a "
    "smaller prefetch_factor"
)


def free_bytes(path: str | None = None) -> int | None:
    """Bytes free to this user on the shared-memory filesystem (SHM_PATH unless given); None where
    there is none."""
    try:
        st = os.statvfs(path or SHM_PATH)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def in_flight(batch: int, num_workers: int, prefetch_factor: int | None) -> int:
    """Bytes one loader keeps in shared memory: its prefetched batches plus the one being consumed;
    0 without workers (the batches never leave the process)."""
    if num_workers == 0:
        return 0
    return batch * ((prefetch_factor or PREFETCH_DEFAULT) * num_workers + 1)


def loaders(knobs: Mapping[str, Any] | Any, local: bool) -> tuple[int, int]:
    """(loaders on this host, samples per loader batch as a multiple of batch_size): a rank per GPU
    for ddp and independent (every node's when local, where nodes are emulated on one host), one
    loader of batch_size x GPUs for dp, one otherwise."""
    parallel, gpus = resources.knob(knobs, "parallel"), resources.knob(knobs, "gpus_per_node")
    if parallel in ("ddp", "independent"):
        return (resources.ranks(knobs) if local else gpus), 1
    return 1, gpus if parallel == "dp" else 1


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def need_bytes(knobs: Mapping[str, Any] | Any, batch: int | None, local: bool) -> int | None:
    """The cell's bytes in flight in this host's shared memory: its loaders' (`loaders`) batches of
    `batch` bytes per rank; None when the batch's size is unknown."""
    if batch is None:
        return None
    count, scale = loaders(knobs, local)
    workers, prefetch = (
        resources.knob(knobs, "num_workers"),
        resources.knob(knobs, "prefetch_factor"),
    )
    return count * in_flight(batch * scale, workers, prefetch)


def pinned_block(size: int) -> int:
    """What PyTorch's pinned host allocator (CachingHostAllocator) holds for one tensor of `size`
    bytes: a block rounded up to the next power of two, which it keeps cached once freed (a 38.5 MB
    batch holds 64 MiB). Unless PYTORCH_CUDA_ALLOC_CONF sets pinned_max_round_threshold, as
    feedbench never does."""
    return 1 << (size - 1).bit_length() if size > 0 else 0


def pinned_batches(knobs: Mapping[str, Any] | Any) -> int:
    """Batches one loader holds pinned at once: with workers, its batches in flight (in_flight:
    prefetch_factor x num_workers + the one the step holds); without, the one the main thread pins
    while the step still holds the last; plus, under the stream prefetcher (device_prefetch stream,
    a train cell), the prefetch_depth batches it keeps issued ahead of the step. A compute cell
    holds its resident_batches together while it copies them, beside those its workers have in
    flight."""
    workers, prefetch = (
        resources.knob(knobs, "num_workers"),
        resources.knob(knobs, "prefetch_factor"),
    )
    in_flight = (prefetch or PREFETCH_DEFAULT) * workers
    if resources.knob(knobs, "scenario") == "compute":
        return in_flight + resources.knob(knobs, "resident_batches")
    held = in_flight + 1 if workers else 2
    streamed = (
        resources.knob(knobs, "device_prefetch") == "stream"
        and resources.knob(knobs, "scenario") == "train"
    )
    return held + (resources.knob(knobs, "prefetch_depth") if streamed else 0)


def pinned_unknown(knobs: Mapping[str, Any] | Any) -> bool:
    """Whether the batch a cell's loader pins is one the knobs do not shape: a user's batch; the
    JPEG bytes torchvision-cuda's loader yields (a block for each file, of the file's size); the
    samples device_stages takes before its moved stages (their shape is the pipeline's)."""
    return bool(
        user_batch(knobs)
        or resources.knob(knobs, "decoder") == "torchvision-cuda"
        or resources.knob(knobs, "device_stages")
    )


def pinned_pool(knobs: Mapping[str, Any] | Any, local: bool) -> int | None:
    """The page-locked host memory of a cell that pins its batches (pin_memory on a GPU) on this
    host: its loaders' pinned batches (pinned_batches), each tensor a power-of-two block
    (pinned_block); None when the pinned batch's size is unknown (pinned_unknown, tokens).

    A floor where the host runs ahead of the GPU (non_blocking copies under events or naive timing):
    a freed block whose copy is still queued is not reused until the copy has run, and how far
    ahead the host gets is the GPU's pace, not the knobs'. The harness records what the allocator
    really held beside it (shm.pinned_held_bytes, on a GPU)."""
    parts = None if pinned_unknown(knobs) else batch_tensor_bytes(knobs)
    if parts is None:
        return None
    count, scale = loaders(knobs, local)
    return count * pinned_batches(knobs) * sum(pinned_block(part * scale) for part in parts)


def facts(knobs: Mapping[str, Any], local: bool, path: str = "", pinned: bool = False) -> dict:
    """For a cell's result, before its loader starts: its bytes in flight (None for a user's batch,
    which has no size before it is made), the shared-memory filesystem's free bytes then, and, where
    `pinned` (pin_memory on a GPU), the page-locked host memory its pinned batches hold
    (pinned_pool), outside /dev/shm (CUDA's host allocator), which the node's RAM and its memlock
    limit must also hold; 0 where nothing is pinned."""
    size = None if user_batch(knobs) else batch_bytes(knobs)
    pool = pinned_pool(knobs, local) if pinned else 0
    return {
        "path": path or SHM_PATH,
        "in_flight_bytes": need_bytes(knobs, size, local),
        "free_bytes": free_bytes(path),
        "pinned_bytes": pool if size is not None else None,
    }


def shm_error(
    knobs: Mapping[str, Any] | Any, batch: int | None, free: int | None, local: bool, path: str = ""
):
    """One line when the cell's batches in flight (`batch` bytes each, per rank) exceed `free` bytes
    of shared memory, else None (also when either size is unknown)."""
    workers, prefetch = (
        resources.knob(knobs, "num_workers"),
        resources.knob(knobs, "prefetch_factor"),
    )
    need = need_bytes(knobs, batch, local)
    if need is None or free is None or workers == 0 or need <= free:
        return None
    count, scale = loaders(knobs, local)
    ranks = f" x {count} loaders" if count > 1 else ""
    where = path or SHM_PATH
    return (
        f"needs {_mb(need)} of shared memory for its batches in flight ({workers} workers x "
        f"prefetch_factor {prefetch or PREFETCH_DEFAULT} + 1 batches of {_mb(batch * scale)}"
        f"{ranks}) and {where} has {_mb(free)} free; allowed: {FIXES}"
    )


def plan_error(cells: Iterable[tuple[str, str, dict]], path: str = "") -> str | None:
    """Before any job of a local run (the Snakefile's onstart): one line for the first cell
    (experiment, id, knobs) whose batches in flight do not fit this host's shared memory. A user's
    batch has no size before it is made: not checked (a bus error it dies of is still named:
    failure)."""
    free = free_bytes(path)
    for experiment, cell, knobs in cells:
        size = None if user_batch(knobs) else batch_bytes(knobs)
        error = shm_error(knobs, size, free, local=True, path=path)
        if error:
            return f"bad config: experiments.{experiment}: cell {cell} {error}"
    return None


def runs_here(workflow) -> bool:
    """Whether this Snakemake process runs the jobs on this host (the local executor, not a dry
    run)."""
    plugin = workflow.executor_plugin
    return (plugin is None or plugin.name == "local") and not workflow.dryrun


def failure(text: str, path: str = "") -> str | None:
    """The one-line reason for a loader that ran out of shared memory anyway, from its error's text;
    else None."""
    match = OUT_OF_SHM.search(text)
    if match is None:
        return None
    free = free_bytes(path)
    room = f" ({path or SHM_PATH}: {_mb(free)} free now)" if free is not None else ""
    line = next(line for line in text.splitlines() if OUT_OF_SHM.search(line)).strip()[:300]
    return f"the loader ran out of shared memory{room}: {line}; fix: {FIXES}"
