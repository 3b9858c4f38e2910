"""What puts a command cell's instrument (harness.inloop) into torch, in the command's own process:
the bootstrap (harness/bootstrap/sitecustomize.py) calls install() as the command imports torch.

Patched once, in that process only: DataLoader.__init__ (each loader recorded as the script built
it), DataLoader.__iter__ (the cell's loader knobs), _BaseDataLoaderIter.__next__ (the wait for each
batch), torch.autograd.backward (the training loader found; backward's marks),
torch.utils.data.get_worker_info (a stream that shards over workers, seen in a worker), a global
forward pre-hook (the forward's start, until its module is found) and the optimizer step hooks.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys

import torch
from torch.optim import optimizer as optimizers
from torch.utils.data import dataloader as torch_dataloader

from ..core.cell import Cell
from .inloop import SHARDED, SPEC_VARIABLE, TORCH_FOLDER, Instrument

_MARKED: list = []  # this process (a loader worker) has marked its stream sharded
_instrument: Instrument | None = None


def install() -> None:
    """Patch torch for the spec in $FEEDBENCH_COMMAND_SPEC (once per process)."""
    global _instrument
    if _instrument is not None or not os.environ.get(SPEC_VARIABLE):
        return
    with open(os.environ[SPEC_VARIABLE], encoding="utf-8") as f:
        spec = json.load(f)
    _instrument = instrument = Instrument(spec)
    loader_class, iterator_class = torch_dataloader.DataLoader, torch_dataloader._BaseDataLoaderIter
    _ORIGINAL = instrument.original
    _ORIGINAL.update(
        init=loader_class.__init__,
        iter=loader_class.__iter__,
        next=iterator_class.__next__,
        backward=torch.autograd.backward,
    )

    @functools.wraps(_ORIGINAL["init"])
    def __init__(self, *args, **kwargs):
        _ORIGINAL["init"](self, *args, **kwargs)
        if "_feedbench_loader" not in self.__dict__:
            instrument.built(self)

    @functools.wraps(_ORIGINAL["iter"])
    def __iter__(self):
        return instrument.iterate(self, _ORIGINAL["iter"])

    @functools.wraps(_ORIGINAL["next"])
    def __next__(self):
        info = self.__dict__.get("_feedbench_loader")
        if info is None:
            return _ORIGINAL["next"](self)
        return instrument.next_batch(self, info, _ORIGINAL["next"])

    @functools.wraps(_ORIGINAL["backward"])
    def backward(*args, **kwargs):
        instrument.timed(instrument.backward_starts)
        try:
            return _ORIGINAL["backward"](*args, **kwargs)
        finally:
            instrument.timed(instrument.backward_ends)

    asked_who = torch.utils.data.get_worker_info

    @functools.wraps(asked_who)
    def get_worker_info():
        found = asked_who()
        # a loader worker's stream asks who it is (torch's own collate asks too: not counted)
        caller = sys._getframe(1).f_code.co_filename
        if found is not None and not _MARKED and not caller.startswith(TORCH_FOLDER):
            _MARKED.append(True)
            open(os.path.join(instrument.out, SHARDED), "a").close()
        return found

    torch.utils.data.get_worker_info = get_worker_info
    torch.utils.data._utils.worker.get_worker_info = get_worker_info
    loader_class.__init__, loader_class.__iter__ = __init__, __iter__
    iterator_class.__next__ = __next__
    torch.autograd.backward = backward
    instrument.global_hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: instrument.timed(instrument.module_called, module)
    )
    optimizers.register_optimizer_step_pre_hook(
        lambda *args: instrument.timed(instrument.optimizer_starts)
    )
    optimizers.register_optimizer_step_post_hook(
        lambda *args: instrument.timed(instrument.optimizer_ends)
    )
    _apply_process_knobs(instrument.cell, spec["cell"])
    atexit.register(instrument.at_exit)


def _apply_process_knobs(cell: Cell, raw: dict) -> None:
    """The knobs of the whole process a command cell sets: the trainer's threads, the sharing
    strategy."""
    if raw.get("torch_threads") is not None:
        torch.set_num_threads(cell.torch_threads)
    if "sharing_strategy" in raw:
        torch.multiprocessing.set_sharing_strategy(cell.sharing_strategy)
