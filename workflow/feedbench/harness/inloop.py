"""The instrument inside a command the cell runs (harness.command): the cell's loader knobs reach
the script's own DataLoader from outside, its training loader is found, and its steps are timed in
its own loop. Nothing of the script changes; nothing here changes what its loop computes.

The bootstrap (harness/bootstrap/sitecustomize.py) installs it as the command imports torch
(harness.patches), and these patches call it:

* `DataLoader.__init__`: each loader is recorded as the script built it (what it asked for, where).
* `DataLoader.__iter__`: the cell's loader knobs (knobs.COMMAND_LOADER) replace what the script
  asked for on the loader that may be the training one: the training loader once it is known, and
  before that every loader not yet shown to be another (a validation loader's sanity check). Others
  get back what they asked for.
* `_BaseDataLoaderIter.__next__`: whatever wraps the loader (Lightning's CombinedLoader,
  accelerate's DataLoaderShard, timm's PrefetchLoader), its batches come through here: the wait for
  each one is timed, and its stage timings (harness.stages) are taken off before the script sees it.
* `torch.autograd.backward`: the loader whose batch came last when a backward pass starts is the
  training loader (a loader whose batch is followed by another of its batches with no backward
  between is not); backward's start and end are marks of the step.
* The first module called after a training batch is the forward's start: a global forward pre-hook
  finds that module in the first training steps, then a hook on it alone times it (a global hook
  costs a call per module, every step).

A step runs from one request of a training batch to the next, so it holds everything the loop does:
the copy, forward, backward, the optimizer, the schedule, logging and callbacks. Its phases: wait
(the request), h2d (the batch's arrival to the forward's start: the copy and the loop's work before
forward), fwd (to backward's start), bwd (backward), opt (backward's end to the next request: the
optimizer step and the loop's work after it). On a GPU with timing `events` the last four are the
device's time between CUDA events recorded at those marks on the current stream, and gpu_idle the
device's idle time while the host waited for the batch.

What runs is the spec's `mode`: train (the window, then the training loader ends: StopIteration,
and SystemExit at its next iter()), whole (the window, then the command runs on to its own end),
replay (the compute ceiling: the warm-up's batches, at most `resident_batches`, kept and served
again from memory by the training loader, with no worker and no read), drain (the loader ceiling:
at the first backward, the training loader alone is drained, then the command ends), preflight
(the first training step, then the command ends). Each process that trained writes
<out>/rank<RANK>.json; one that iterated loaders but trained none, <out>/seen-<pid>.json.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
import weakref
from typing import Callable

import torch

from ..core.cell import Cell, parse_cell
from ..core.knobs import COMMAND_LOADER, STAGE_WHATIFS
from ..core.metrics import CLOCKED_PHASES
from .batches import batch_len, copied_bytes
from .collector import Collector
from .provenance import software_facts
from .script_loaders import (
    Loader,
    ReplayIterator,
    asked_of,
    built_at,
    loader_values,
    set_knobs,
    worker_stages,
)
from .script_steps import Step, step_table
from .stages import StagedBatch, TimedCollate, make_stages, timed
from .stages import strip as strip_timings
from .whatif import apply as apply_whatifs
from .whatif import probe, stage_names
from .window import Whole, WindowFigures

SPEC_VARIABLE = "FEEDBENCH_COMMAND_SPEC"
STOP_CHECK_S = 0.2  # how often a training batch's request looks for the harness's stop file
SHARDED = "sharded"  # a file a loader worker writes the first time its stream asks who it is
TORCH_FOLDER = os.path.dirname(torch.__file__) + os.sep
MODES = ("train", "whole", "replay", "drain", "preflight")


class Instrument:
    """The command's instrument: its spec, the loaders it has seen, the training loader and the
    window."""

    def __init__(self, spec: dict):
        self.spec, self.mode, self.out = spec, spec["mode"], spec["out"]
        self.cell: Cell = parse_cell(spec["cell"])
        self.wanted = {k: spec["cell"][k] for k in COMMAND_LOADER if k in spec["cell"]}
        self.rank = int(os.environ.get("RANK", "0"))
        self.loaders: list[Loader] = []
        self.training: Loader | None = None
        self.why = None
        self.last: Loader | None = None  # the loader whose batch came last
        self.delivered = 0  # training batches delivered, warm-up included
        self.step: Step | None = None  # the open step
        self.steps: list[Step] = []  # the measured steps, closed
        self.window: dict = {}
        self.closed = False
        self.awaiting_forward = False  # a training batch came and no module has run since
        self.roots: set = set()  # the modules first called after a training batch
        self.root_hooks: list = []
        self.global_hook = None
        self.opt_started: float | None = None
        self.notes: list[str] = []
        # the collector's pauses in the window, recorded; its rule changed only where the cell says
        self.collector = Collector(self.cell.gc if "gc" in spec["cell"] else "normal")
        self.whole = {"batches": 0, "samples": 0}
        self.launch_threads = torch.get_num_threads()
        # the instrument's own time in the script's process (its hooks, less the loader's and
        # backward's own work), and the loader's call inside the current next()
        self.own_s, self._t0, self._t1 = 0.0, 0.0, 0.0
        self.stop_checked = 0.0  # when the stop file was last looked for
        # the script's DataLoaders (an earlier one with the same dataset; the drain's loader), and
        # torch's own functions the patches replaced (harness.patches)
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.original: dict[str, Callable] = {}
        self.cuda = False
        self.events = False

    # -- the loaders ---------------------------------------------------------------------------

    def built(self, loader) -> Loader:
        dataset = loader.dataset
        info = Loader(
            len(self.loaders),
            built_at(),
            f"{type(dataset).__module__}.{type(dataset).__qualname__}",
            loader.batch_size,
            asked_of(loader),
            iterable=isinstance(dataset, torch.utils.data.IterableDataset),
        )
        earlier = [o for o in self.live if o.dataset is dataset]
        if earlier:  # Lightning and accelerate build the script's loader again around its dataset
            first = earlier[0].__dict__["_feedbench_loader"]
            info.rebuilt_from, info.built_at = first.index, first.built_at
        self.loaders.append(info)
        self.live.add(loader)
        object.__setattr__(loader, "_feedbench_loader", info)
        return info

    def info(self, loader) -> Loader:
        found = loader.__dict__.get("_feedbench_loader")
        return found if found is not None else self.built(loader)

    def candidate(self, info: Loader) -> bool:
        """Whether the cell's knobs go to this loader: the training loader, or, before it is found,
        any loader not shown to be another."""
        return info is self.training or (self.training is None and not info.ruled_out)

    def iterate(self, loader, original: Callable):
        """An iterator of the loader, made with the knobs it gets (and, for the training loader
        after its window, the end of the command)."""
        info = self.info(loader)
        info.redirect = None  # a new epoch's iterator: the what-if's own from now on
        if info is self.training and self.closed and self.mode != "whole":
            self._end("the training loader was iterated again after the measured window")
        if info.first_iter_at is None:
            info.first_iter_at = time.perf_counter()
        info.iterators += 1
        wanted = self.candidate(info)
        values = loader_values(info.asked, self.wanted if wanted else {})
        set_knobs(loader, values)
        info.ran = values
        if self.replaying(info):
            iterator = ReplayIterator(loader, info)
        else:
            iterator = self._made(loader, info, original, wanted and self._stages_wanted(loader))
        object.__setattr__(iterator, "_feedbench_loader", info)
        return iterator

    def _stages_wanted(self, loader) -> bool:
        wanted = bool(self.cell.stage_timing or self.cell.stage_functions)
        if wanted and hasattr(loader.dataset, "__getitems__"):
            note = (
                f"stage timing off for {type(loader.dataset).__qualname__}: it fetches a batch "
                "whole (__getitems__), which a per-sample timer would change"
            )
            if note not in self.notes:
                self.notes.append(note)
            return False
        return wanted

    def _made(self, loader, info: Loader, original: Callable, staged: bool):
        """original(loader) with the dataset the iterator's workers take: the training loader's with
        the cell's stage what-if (harness.whatif, made once), and, where stages are timed, its
        samples and collate timed (harness.stages). The loader's own are given back after."""
        whatif = info is self.training and any(getattr(self.cell, k) for k in STAGE_WHATIFS)
        reused = loader.persistent_workers and getattr(loader, "_iterator", None) is not None
        if reused or not (staged or whatif):
            return original(loader)
        make_stages(self.cell.stage_functions)
        dataset, collate, init = loader.dataset, loader.collate_fn, loader.worker_init_fn
        if staged and info.stage_order is None:  # the stages a what-if may name, in order
            info.stage_order, info.stage_probe = stage_names(dataset), probe(dataset).facts()
        made = dataset
        if whatif:
            if info.whatif is None:
                info.whatif = apply_whatifs(self.cell, dataset, self.out, None)
            made = info.whatif[0]
        if staged:
            made = timed(made, self._profile(loader))
            loader.collate_fn = TimedCollate(collate)
        object.__setattr__(loader, "dataset", made)
        if self.cell.stage_functions:
            loader.worker_init_fn = functools.partial(
                worker_stages, tuple(self.cell.stage_functions), init
            )
        try:
            return original(loader)
        finally:
            object.__setattr__(loader, "dataset", dataset)
            loader.collate_fn, loader.worker_init_fn = collate, init

    def _profile(self, loader):
        from .profile import sample_profile

        cell = dataclasses.replace(
            self.cell, num_workers=loader.num_workers, in_order=getattr(loader, "in_order", True)
        )
        return sample_profile(cell) if self.cell.stage_timing else None

    # -- the batches ---------------------------------------------------------------------------

    def next_batch(self, iterator, info: Loader, original: Callable):
        entered = self._t0 = self._t1 = time.perf_counter()
        try:
            return self._next_batch(iterator, info, original)
        finally:  # the instrument's own time: all but the loader's
            self.own_s += time.perf_counter() - entered - (self._t1 - self._t0)

    def _next_batch(self, iterator, info: Loader, original: Callable):
        if info.redirect is not None and iterator is not info.redirect:
            iterator = info.redirect
        training = info is self.training
        if training:
            self._request()
        a = self._event() if training and self.step is not None else None
        t0 = self._t0 = self._t1 = time.perf_counter()
        try:
            batch = self._replayed(iterator, info) if self.replaying(info) else original(iterator)
        except StopIteration:
            self._t1 = time.perf_counter()
            if training and self.step is not None:  # the epoch's end, in this step's wait
                self.step.boundary = True
            raise
        t1 = self._t1 = time.perf_counter()
        if isinstance(batch, StagedBatch):
            batch = strip_timings(batch, info.stage_log)
        self._delivered(info, batch)
        if training:
            self._arrived(batch, t0, t1, a)
            if self.step is not None and "workers" not in self.window:
                # the loader's processes that made the window's batches: proof of what ran
                self.window["workers"] = len(getattr(iterator, "_workers", None) or ())
        elif self.training is None:
            info.last = batch
        return batch

    def _delivered(self, info: Loader, batch) -> None:
        if info.unanswered and info is not self.training:
            info.ruled_out = True
        info.unanswered = True
        info.batches += 1
        info.samples += batch_len(batch)
        info.first_batch_at = info.first_batch_at or time.perf_counter()
        self.last = info
        if self.replay_wanted(info) and len(info.cached) < self.resident():
            info.cached.append(batch)

    def replay_wanted(self, info: Loader) -> bool:
        return self.mode == "replay" and (info is self.training or self.training is None)

    def replaying(self, info: Loader) -> bool:
        return (
            self.mode == "replay" and info is self.training and len(info.cached) >= self.resident()
        )

    def _replayed(self, iterator, info: Loader):
        """The next batch from memory; StopIteration where the real iterator would have ended (its
        length, where it has one)."""
        try:
            length = len(iterator)
        except TypeError:
            length = None
        if length is not None and iterator._num_yielded >= length:
            raise StopIteration
        iterator._num_yielded += 1
        return info.cached[(self.delivered - len(info.cached)) % len(info.cached)]

    def _arrived(self, batch, t0: float, t1: float, a) -> None:
        self.delivered += 1
        self.whole["batches"] += 1
        samples = batch_len(batch)
        self.whole["samples"] += samples
        step = self.step
        if step is not None:
            step.delivered, step.samples = t1, samples
            step.copied = copied_bytes(batch) if self.cuda else 0
            step.events["delivered"] = self._event()
            if not step.boundary:  # a step across an epoch's end waits from its first request
                step.events["request"], step.request = a, t0
        self.awaiting_forward = True

    def _request(self) -> None:
        """A training batch is asked for: the open step ends here; the window opens or closes. A
        step whose request met the epoch's end goes on: the next epoch's first batch is its own (its
        wait holds the epoch's end, as harness.loop counts a boundary)."""
        if self.step is not None and self.step.boundary and self.step.delivered is None:
            return
        now = time.perf_counter()
        if self.step is not None:
            self._close_step(now)
        if self.global_hook is not None and self.roots and self.delivered >= 2:
            self._hook_roots()
        if self.closed:
            self._after_window()
            return
        if self.mode == "preflight":  # the step that found the training loader has run
            self._end("the preflight's first training step ran")
        stop = self._stop_asked(now)  # the harness asks: its time limit, SIGTERM
        opened = self.window.get("opened") is not None
        if stop or (opened and len(self.steps) >= self.cell.steps):
            self._close("stop" if stop else "steps")
            if stop:
                self._end("feedbench asked the command to stop (its cell's time limit, or SIGTERM)")
            self._after_window()
            return
        if not opened and self.delivered >= self.cell.warmup_steps:
            self._open()
        if self.window.get("opened") is not None:
            self.step = Step(time.perf_counter())

    def _stop_asked(self, now: float) -> bool:
        """Whether the harness's stop file is there, looked for at most every STOP_CHECK_S."""
        if now - self.stop_checked < STOP_CHECK_S:
            return False
        self.stop_checked = now
        return os.path.exists(self.spec["stop"])

    def resident(self) -> int:
        """replay: the batches kept and served again, the warm-up's own (at most resident_batches),
        so the window starts where the other cells' does."""
        return max(1, min(self.cell.resident_batches, self.cell.warmup_steps))

    def _after_window(self) -> None:
        if self.mode == "whole":
            return
        raise StopIteration

    def _close_step(self, now: float) -> None:
        step, self.step = self.step, None
        step.events["next"] = self._event()
        step.end = now
        self.steps.append(step)

    # -- the marks -----------------------------------------------------------------------------

    def _event(self):
        if not self.events:
            if self.cuda and self.cell.timing == "sync":
                torch.cuda.current_stream().synchronize()
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def timed(self, hook: Callable, *args) -> None:
        """A hook of the instrument's, its time counted as the instrument's own."""
        start = time.perf_counter()
        try:
            hook(*args)
        finally:
            self.own_s += time.perf_counter() - start

    def module_called(self, module) -> None:
        """A module's forward starts: the step's forward, where it is the first since the batch."""
        if not getattr(self, "awaiting_forward", False):
            return
        self.awaiting_forward = False
        if self.global_hook is not None and self.training is not None:
            self.roots.add(module)
        if self.step is not None:
            self.step.forward = time.perf_counter()
            self.step.events["forward"] = self._event()

    def _hook_roots(self) -> None:
        """The modules that start a step's forward found: hooks on them alone from now on."""
        self.global_hook.remove()
        self.global_hook = None
        for module in self.roots:
            self.root_hooks.append(
                module.register_forward_pre_hook(
                    lambda module, args: self.timed(self.module_called, module)
                )
            )

    def backward_starts(self) -> None:
        if self.training is None and self.last is not None:
            self._found(self.last)
        if self.last is not None:
            self.last.unanswered = False
        if self.step is not None and self.step.backward is None:
            self.step.backward = time.perf_counter()
            self.step.events["backward"] = self._event()
        if self.mode == "drain" and self.training is not None:
            self._drain()
        if self.mode == "preflight" and self.training is not None:
            self._write("preflight.json", self._preflight_facts())

    def backward_ends(self) -> None:
        if self.step is not None and self.training is not None:
            self.step.backward_end = time.perf_counter()
            self.step.events["backward_end"] = self._event()

    def optimizer_starts(self) -> None:
        self.opt_started = time.perf_counter()

    def optimizer_ends(self) -> None:
        if self.step is not None and self.opt_started is not None:
            self.step.optimizer_ms += (time.perf_counter() - self.opt_started) * 1000
        self.opt_started = None

    def _found(self, info: Loader) -> None:
        """The training loader: the one whose batch a backward pass followed."""
        self.training = info
        self.why = (
            f"its batch was followed by a backward pass ({len(self.loaders)} loader"
            f"{'s' if len(self.loaders) != 1 else ''} built, "
            f"{sum(1 for i in self.loaders if i.batches)} iterated)"
        )
        self.delivered = info.batches
        self.whole = {"batches": info.batches, "samples": info.samples}
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.events = self.cuda and self.cell.timing == "events"
        for other in self.loaders:  # a loader shown to be another gets back its own knobs
            if other is not info:
                other.cached = []
        self.awaiting_forward = False
        if any(getattr(self.cell, k) for k in STAGE_WHATIFS) and self.mode != "drain":
            # the stage what-if, on the training loader alone: from its next batch on
            info.redirect = iter(self._object_of(info))

    # -- the window ----------------------------------------------------------------------------

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _open(self) -> None:
        self._sync()
        self.collector.open()
        self.window = {
            "opened": time.perf_counter(),
            # the stage timings of batches before the window: warm-up (harness.stages' log)
            "stage_skip": len(self.training.stage_log),
            "torch_threads": torch.get_num_threads(),
            "global_hook": self.global_hook is not None,
            "own_at_open": self.own_s,
        }
        # the harness's monitor starts on it (harness.command)
        self._write(f"open-rank{self.rank}.json", {"pid": os.getpid()})

    def _close(self, by: str) -> None:
        """The window's end (synchronised), or, for a stop before it opened, what came so far."""
        self._sync()
        end = time.perf_counter()
        self.collector.close()
        if self.steps and self.window.get("opened") is not None:
            self.steps[-1].end = end
        self.window.update(closed=end, closed_by=by)
        self.window["own_s"] = self.own_s - self.window.get("own_at_open", self.own_s)
        self.closed = True
        self.figures().write(os.path.join(self.out, f"rank{self.rank}.json"))

    def figures(self) -> WindowFigures:
        """What the window measured, for the harness (harness.window, harness.command)."""
        phases = () if self.mode == "drain" else CLOCKED_PHASES
        start = self.steps[0].request if self.steps else None
        end = self.steps[-1].end if self.steps else None
        info = self.training
        hidden = ("opened", "closed", "stage_skip", "own_at_open")
        device = f"cuda:{torch.cuda.current_device()}" if self.cuda else "cpu"
        return WindowFigures(
            mode=self.mode,
            pid=os.getpid(),
            rank=self.rank,
            table=step_table(self.steps, self.events, phases),
            samples=[step.samples for step in self.steps],
            h2d_bytes=sum(step.copied for step in self.steps),
            window_s=end - start if start is not None and end is not None else None,
            window={k: v for k, v in self.window.items() if k not in hidden},
            time_to_first_batch_s=info.time_to_first_batch_s if info else None,
            device=device,
            timing="events" if self.events else (self.cell.timing if self.cuda else "wall"),
            torch_threads=self.window.get("torch_threads", torch.get_num_threads()),
            launch_threads=self.launch_threads,
            loader={**info.facts(), "why": self.why} if info else None,
            loaders=[i.facts() for i in self.loaders],
            forward_seen=bool(self.roots or self.root_hooks),
            optimizer_ms=[s.optimizer_ms for s in self.steps],
            boundary_steps=[i for i, s in enumerate(self.steps) if s.boundary],
            stage_log=info.stage_log if info else [],
            stage_skip=self.window.get("stage_skip", 0),
            stage_order=info.stage_order if info else None,
            stage_probe=info.stage_probe if info else {},
            whatif=(info.whatif[1].facts or None) if info and info.whatif else None,
            gc=self.collector.summary() if self.collector.opened else None,
            whole=Whole(**self.whole),
            notes=self.notes + self._stream_notes(),
            software=software_facts(torch.device(device)),
        )

    def _stream_notes(self) -> list[str]:
        """What happened to the samples of a stream given workers it does not shard over: every
        worker runs the whole stream (torch's rule), so each sample came as often as there were
        workers. A stream that shards asks torch.utils.data.get_worker_info() in its workers
        (_sharded marks it)."""
        info = self.training
        workers = ((info.ran or {}).get("num_workers") or 0) if info else 0
        if not info or not info.iterable or workers < 2:
            return []
        if os.path.exists(os.path.join(self.out, SHARDED)):
            return []
        return [
            f"num_workers={workers} on the stream {info.dataset} (an IterableDataset), which never "
            "asked torch.utils.data.get_worker_info() in a worker: each of the "
            f"{workers} workers yielded the whole stream, so its samples came {workers} times "
            "each; shard it by worker (get_worker_info) to compare worker counts"
        ]

    def _preflight_facts(self) -> dict:
        return {
            "status": "ok",
            "loader": {**self.training.facts(), "why": self.why},
            "loaders": [i.facts() for i in self.loaders],
        }

    def _drain(self) -> None:
        """The loader ceiling: the training loader alone, warm-up then `steps` batches, with no
        training step; then the command ends."""
        loader_object = self._object_of(self.training)
        self.steps, self.window = [], {}
        waits: list[tuple[float, float, int]] = []
        batches = iter(loader_object)
        self._sync()
        for i in range(self.cell.warmup_steps + self.cell.steps):
            if i == self.cell.warmup_steps:
                self._open()
            t0 = time.perf_counter()
            try:
                batch = self.original["next"](batches)
            except StopIteration:  # an epoch's end: a new one, as a training run goes on
                batches = iter(loader_object)
                batch = self.original["next"](batches)
            if isinstance(batch, StagedBatch):
                batch = strip_timings(batch, self.training.stage_log)
            if i >= self.cell.warmup_steps:
                waits.append((t0, time.perf_counter(), batch_len(batch)))
        for (t0, t1, n), following in zip(waits, [*waits[1:], None], strict=True):
            step = Step(t0, delivered=t1, samples=n)
            step.end = following[0] if following else None
            self.steps.append(step)
        self._close("steps")
        del batches
        self._end("the loader ceiling was measured")

    def _object_of(self, info: Loader):
        return next(o for o in self.live if o.__dict__.get("_feedbench_loader") is info)

    # -- the end -------------------------------------------------------------------------------

    def _end(self, why: str) -> None:
        print(f"feedbench: {why}: the command was ended there", file=sys.stderr, flush=True)
        raise SystemExit(0)

    def at_exit(self) -> None:
        """The command's end: the window closes with the steps that completed (a command shorter
        than warm-up and steps), and a process that trained no loader says what it saw."""
        if self.training is not None and not self.closed:
            self.step = None  # the last one never reached its end
            if self.window.get("opened") is not None:
                self.closed = True
                self.window.update(closed_by="exit")
                self.collector.close()
            self.figures().write(os.path.join(self.out, f"rank{self.rank}.json"))
        elif self.training is not None and self.mode == "whole":
            self.figures().write(os.path.join(self.out, f"rank{self.rank}.json"))
        elif self.training is None and self.loaders:
            self._write(f"seen-{os.getpid()}.json", {"loaders": [i.facts() for i in self.loaders]})

    def _write(self, name: str, data: dict) -> None:
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(data, f, default=str)
        os.replace(path + ".tmp", path)
