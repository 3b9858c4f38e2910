"""The script's DataLoaders as a command cell's instrument sees them (harness.inloop): where each
was built, what it asked for, what it runs with once the cell's loader knobs replace its own, and
the iterator that serves the compute ceiling's replayed batches."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from torch.utils.data import dataloader as torch_dataloader

from .profile import is_installed
from .stages import make_stages


def built_at() -> str:
    """Where the script built a DataLoader: the first frame of its own code, outside the standard
    library, torch, feedbench and installed packages (Lightning's and transformers' build it on the
    script's behalf: the script's line that asked them is the one a user knows)."""
    frame = sys._getframe(1)
    while frame is not None and is_installed(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "unknown"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _start_method(context) -> str | None:
    if context is None:
        return None
    return context.get_start_method() if hasattr(context, "get_start_method") else str(context)


def asked_of(loader) -> dict:
    """The loader knobs as a DataLoader holds them."""
    return {
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "in_order": getattr(loader, "in_order", True),
        "multiprocessing_context": _start_method(loader.multiprocessing_context),
    }


def loader_values(asked: dict, wanted: dict) -> dict:
    """What a loader runs with: what it asked for, the cell's knobs over it, then what DataLoader
    itself requires (no prefetch, persistence or start method without workers; its default
    prefetch of 2 with them)."""
    ran = {**asked, **wanted}
    if ran["num_workers"] == 0:
        ran.update(prefetch_factor=None, persistent_workers=False, multiprocessing_context=None)
    elif ran["prefetch_factor"] is None:
        ran["prefetch_factor"] = 2
    return ran


def set_knobs(loader, values: dict) -> None:
    """A loader's knobs set after DataLoader.__init__ (which refuses persistent_workers later)."""
    loader.num_workers = values["num_workers"]
    loader.pin_memory = values["pin_memory"]
    loader.prefetch_factor = values["prefetch_factor"]
    object.__setattr__(loader, "persistent_workers", values["persistent_workers"])
    if hasattr(loader, "in_order"):
        loader.in_order = values["in_order"]
    loader.multiprocessing_context = values["multiprocessing_context"]


@dataclass
class Loader:
    """A DataLoader of the script's: how it was built, and what the instrument has seen of it."""

    index: int
    built_at: str
    dataset: str
    batch_size: Any
    asked: dict
    rebuilt_from: int | None = None  # a loader the framework built again from this one's dataset
    iterable: bool = False  # its dataset is a stream (IterableDataset): each worker runs it all
    ran: dict | None = None
    iterators: int = 0
    batches: int = 0
    samples: int = 0
    unanswered: bool = False  # its last batch has had no backward pass yet
    ruled_out: bool = False  # a batch of it was followed by another with no backward between
    first_iter_at: float | None = None
    first_batch_at: float | None = None
    stage_log: list = field(default_factory=list)
    cached: list = field(default_factory=list)  # replay: its first batches, kept
    stage_order: list | None = None  # its dataset's stages in order (harness.whatif.stage_names)
    stage_probe: dict = field(default_factory=dict)  # what a sampled call showed of them
    whatif: tuple | None = None  # the training dataset with the cell's stage what-if, and its plan
    # the training loader's iterator with the what-if, made when it was found: its batches from then
    redirect: Any = None
    last: Any = None  # its last batch (the first one, once it is found the training loader)

    @property
    def time_to_first_batch_s(self) -> float | None:
        """From its first iter() to its first batch: the workers' start-up, or the main process
        making the batch."""
        if self.first_batch_at and self.first_iter_at:
            return self.first_batch_at - self.first_iter_at
        return None

    def facts(self) -> dict:
        keep = ("index", "built_at", "dataset", "batch_size", "asked", "rebuilt_from", "ran")
        keep += ("iterators", "batches", "samples")
        return {k: getattr(self, k) for k in keep}


def worker_stages(stage_functions: tuple[str, ...], init: Callable | None, worker_id: int):
    """A loader worker's start: the stage functions made stages (a spawned worker imports them
    afresh), then the script's own worker_init_fn."""
    make_stages(list(stage_functions))
    if init is not None:
        init(worker_id)


class ReplayIterator(torch_dataloader._BaseDataLoaderIter):
    """replay: the training loader's iterator once its first batches are kept: no workers, no
    dataset read (Instrument.next_batch serves the kept batches in its place)."""

    def __init__(self, loader, info: Loader):
        super().__init__(loader)
        self.info = info

    def _next_data(self):
        raise StopIteration
