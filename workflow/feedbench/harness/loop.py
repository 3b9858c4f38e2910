"""One cell's measured loop: wait for data, copy it, forward, backward, optimizer step.

The flow is flat on purpose (read it top to bottom like a training script):
set up, warm up, synchronise, measure `steps` steps, synchronise, read the
clocks. Host timestamps mark iteration starts; GPU phases come from the
PhaseClock, read once after the window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..core.cell import Cell
from ..core.knobs import KnobError
from ..core.metrics import CLOCKED_PHASES
from ..core.plugins import Context, resolve_all
from ..core.target import AMP_DTYPES
from .batches import (
    batch_len,
    call_model,
    copied_bytes,
    default_loss,
    uncounted,
    unpinned_note,
)
from .cache import prepare as prepare_page_cache
from .collector import Collector
from .data import batch_fetch_note, batch_size_of, build_dataset, build_loader
from .distributed import World
from .models import build_loss, build_model, build_optimizer, loss_function
from .prefetch import StreamPrefetcher, pinned_held, to_device
from .profile import found as profile_found
from .profile import sample_profile
from .stages import make_stages, name_transforms, strip, summarize_stages, timed, unwrap
from .stop import check_stop
from .timing import PhaseClock, synchronize
from .whatif import Plan, copied_in_prep, facts, on_device, probe, stage_names
from .whatif import apply as apply_whatifs

# The clocked phases each scenario runs: a compute cell has no copy, a loader cell no model.
PHASES_OF = {"train": CLOCKED_PHASES, "compute": CLOCKED_PHASES[1:], "loader": ()}
# The autocast dtype of each precision the knob amp names (core.target.AMP_DTYPES, the knob's one
# map): fp32 none.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Measurement:
    """What the loop has measured so far; kept when the loop dies half-way."""

    step_starts: list[float] = field(default_factory=list)
    waits_ms: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    h2d_bytes: int = 0
    copy_events: list = field(default_factory=list)
    completed: int = 0
    last_done: float | None = None
    window_end: float | None = None
    comm: dict | None = None
    time_to_first_batch_s: float | None = None
    cuda_init_s: float | None = None
    clock: PhaseClock | None = None
    page_cache: dict | None = None
    first_batch_profile: dict | None = None
    # each loader batch's stage timings, in the loader's order
    stage_log: list[dict] = field(default_factory=list)
    stage_skip: int = 0  # the batches before the measured window: warm-up
    # the dataset's stages in order, before any what-if
    stage_order: list[str] = field(default_factory=list)
    # what a sampled call showed of its stages (whatif.Probed.facts)
    stage_probe: dict = field(default_factory=dict)
    # the cell's stage what-if (harness.whatif), and the loader that runs it
    whatif: Plan | None = None
    whatif_loader: object = None
    # batches taken from the loader so far (by the loop or the stream prefetcher ahead of it)
    pulled: int = 0
    # samples the loop has taken from the loader, warm-up included (the monitor's memory axis)
    delivered: int = 0
    # the pull index of each epoch's first batch
    epoch_starts: list[int] = field(default_factory=list)
    # measured steps whose wait pulled a later epoch's first
    boundary_steps: list[int] = field(default_factory=list)
    # adjustments found while running (the loss rule, unpinned batches)
    notes: list[str] = field(default_factory=list)
    # why the first measured batch with no sample counted had none (batches.uncounted)
    uncounted: str | None = None
    collector: Collector | None = None  # Python's collector in the window (knob gc): opened with it
    # the pinned allocator's pool at the window's end, on a GPU (prefetch.pinned_held)
    pinned_held: int | None = None

    def step_table(self, device_readable: bool = True) -> dict[str, list[float]]:
        """Per-step ms of each phase and of the whole step, for completed steps only.

        A step ends where the next one starts; the last one where the window
        closed (synchronised) or, after a crash, where its host work finished.
        After a crash the device clocks may be unreadable: then only host phases.
        """
        n = self.completed
        ends = self.step_starts[1 : n + 1]
        if len(ends) < n:
            ends.append(self.window_end if self.window_end is not None else self.last_done)
        table = {"wait": self.waits_ms[:n]}
        if device_readable and self.clock is not None and self.clock.phases:
            self.clock.steps = self.clock.steps[:n]
            table.update(self.clock.read())
            # the window starts synchronised: the GPU idles through the first step's wait
            if table.get("gpu_idle"):
                table["gpu_idle"][0] = table["wait"][0]
            if self.copy_events:  # stream prefetcher on a GPU: the copy ran on its own stream
                table["h2d"] = [start.elapsed_time(end) for start, end in self.copy_events[:n]]
        table["step"] = [(b - a) * 1000 for a, b in zip(self.step_starts[:n], ends, strict=True)]
        return table

    def copies(self) -> tuple[int, int]:
        """(bytes the measured steps copied to the device, those of them copied inside device_prep):
        the loop's copies of each batch's host tensors, and device_stages' copy of the samples,
        which the loop then finds on the device (N7, #50)."""
        prep = copied_in_prep(self.whatif_loader, self.stage_skip, self.completed)
        return self.h2d_bytes + prep, prep

    def stage_batches(self) -> list[dict]:
        """The stage timings of the measured steps' batches, one per step (none when not timed)."""
        return self.stage_log[self.stage_skip : self.stage_skip + self.completed]

    def stages(self) -> dict | None:
        """What each stage cost per sample in the measured steps' batches (harness.stages), or None
        when not timed."""
        found = summarize_stages(self.stage_batches())
        if found is not None and self.stage_order:
            found["order"] = self.stage_order
        if found is not None:
            # from a warm-up batch (harness.profile)
            found["profile"] = profile_found(self.stage_log)
            found.update({key: names for key, names in self.stage_probe.items() if names})
        return found

    def whatif_facts(self, device_readable: bool = True) -> dict | None:
        """What the cell's stage what-if did and traded (harness.whatif), or None without one; the
        device stages' time only where the device's clocks can be read (the runner's guarded
        read)."""
        if self.whatif is None:
            return None
        return facts(self.whatif_loader, self.whatif, self.stage_skip, device_readable)


def profile_first_batch(loader, device: torch.device, move: Callable = to_device) -> dict:
    """The CIFAR-100 notebook's window: next() on an iterator made beforehand (its workers started
    outside the window) and .to(device) of that batch, under torch.profiler in a
    record_function("data_load"); its CPU totals in ms.

    The CUDA context already exists here (cuda_init_s); in the notebook's first run the first .to()
    created it.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    batches = enumerate(loader)
    with profile(activities=activities) as prof:
        with record_function("data_load"):
            _, batch = next(batches)
            batch = strip(batch)
            move(batch, device, non_blocking=False)
    del batches  # shuts its workers down before the measured loader starts its own
    totals = {e.key: e.cpu_time_total / 1000 for e in prof.key_averages()}
    return {"data_load_ms": totals.get("data_load"), "to_ms": totals.get("aten::to")}


def original_estimators(table: dict[str, list[float]], m: Measurement) -> dict | None:
    """pytorch_throughput's own estimators, for the cells that reproduce it (its timing is naive:
    host clock, no sync).

    fwd and bwd: the mean of per-step rates (samples / phase time) over the steps after the first,
    bwd being backward + optimizer step; overall: samples / host time from the first step's start to
    the end of the last step's host work, with no final synchronisation. Ours (samples over a
    synchronised window, medians) differ.
    """
    n = m.completed
    if (
        n < 2
        or "fwd" not in table
        or "bwd" not in table
        or "opt" not in table
        or m.last_done is None
    ):
        return None
    samples = m.samples[:n]
    fwd = [s / (ms / 1000) for s, ms in zip(samples[1:], table["fwd"][1:n], strict=True) if ms > 0]
    bwd = [
        s / ((b + o) / 1000)
        for s, b, o in zip(samples[1:], table["bwd"][1:n], table["opt"][1:n], strict=True)
        if b + o > 0
    ]
    wall = m.last_done - m.step_starts[0]
    return {
        "fwd_samples_per_s": statistics.fmean(fwd) if fwd else None,
        "bwd_samples_per_s": statistics.fmean(bwd) if bwd else None,
        "samples_per_s": sum(samples) / wall if wall > 0 else None,
    }


def epoch_batches(loader, m: Measurement):
    """Batches across epoch boundaries, as a training run sees them (workers restart unless
    persistent).

    `m` counts the pulls and where each epoch starts, so the loop can tell which step's wait held a
    boundary.
    """
    for epoch in itertools.count():
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        m.epoch_starts.append(m.pulled)
        empty = True
        for batch in loader:
            empty = False
            m.pulled += 1
            yield batch
        if empty:
            raise RuntimeError("the loader yields no batch: the dataset is smaller than batch_size")


def cuda_init(device: torch.device) -> float | None:
    """Create the CUDA context up front, so no measured phase pays for it."""
    if device.type != "cuda":
        return None
    start = time.perf_counter()
    torch.cuda.init()
    torch.empty(1, device=device)
    torch.cuda.synchronize(device)
    return time.perf_counter() - start


class WithLoss(nn.Module):
    """A model that returns its loss: under DataParallel each replica computes the loss of its own
    slice.

    Without it DataParallel gathers every replica's full output on the first GPU before the loss:
    for a vocabulary head (batch 360 x 100 tokens x 50,000 words) that is gigabytes per replica, and
    the step then measures that gather rather than the gradient exchange. The replicas' losses come
    back as one vector; the step averages it (replicas of equal slices: the batch mean; for tokens
    with padding, a mean of replica means).
    """

    def __init__(self, model: nn.Module, loss_fn: Callable):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, inputs: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model(inputs), (inputs, *rest)).reshape(1)


class Autocast(nn.Module):
    """A model whose forward enters the cell's autocast itself, as PyTorch's AMP notes advise under
    DataParallel.

    DataParallel runs each replica in a thread of its own, and autocast state is thread-local:
    PyTorch re-enters it there with `enabled` only, so at the thread's default dtype (float16 on
    CUDA). amp: bf16 then ran float16 with no GradScaler.
    """

    def __init__(self, model: nn.Module, device_type: str, dtype: torch.dtype):
        super().__init__()
        self.model, self.device_type, self.dtype = model, device_type, dtype

    def forward(self, *args, **kwargs):
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.model(*args, **kwargs)


def dp_replica(model: nn.Module, cell: Cell, device_type: str) -> nn.Module:
    """What DataParallel copies to each GPU: the model, inside the cell's autocast when amp is
    on."""
    dtype = AUTOCAST_DTYPES.get(AMP_DTYPES[cell.amp])
    return Autocast(model, device_type, dtype) if dtype is not None else model


def wrap_parallel(model: nn.Module, cell: Cell, device: torch.device) -> nn.Module:
    """ddp: gradients all-reduced across ranks; dp: one process splits each batch over its GPUs."""
    if cell.parallel == "ddp":
        return DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if cell.parallel == "dp" and device.type == "cuda" and cell.gpus_per_node > 1:
        return nn.DataParallel(
            dp_replica(model, cell, device.type), device_ids=list(range(cell.gpus_per_node))
        )
    return model  # none, independent (replicas that never talk), dp on CPU


def measure(
    cell: Cell,
    device: torch.device,
    m: Measurement,
    out_dir: str | None = None,
    monitor=None,
    world: World | None = None,
    user: dict | None = None,
) -> None:
    """Run warm-up and the measured window of a train, compute or loader cell, filling `m`.

    `user`: knob -> the user's callable (feedbench.api passes objects); by default imported from the
    cell's paths.
    """
    world = World() if world is None else world
    torch.manual_seed(cell.seed)
    # the user's own code (feedbench.core.plugins)
    user = resolve_all(cell) if user is None else user
    ctx = context(cell, device, world)
    # every copy of a batch goes through it: loop, prefetcher, probes
    move = user.get("to_device", to_device)
    loader = _loader(cell, device, m, user, ctx, (world, move, out_dir))
    steps = cell.epochs * len(loader) if cell.epochs else cell.steps
    step = TrainStep(cell, device, m, user, ctx) if cell.scenario != "loader" else None
    feed = _feed(cell, device, m, loader, move)
    try:
        _window(cell, device, m, feed, step, steps, monitor, move)
        _close_window(device, m, monitor, feed)
        if m.completed and not any(m.samples):  # 0 samples/s is no measurement: say why
            raise KnobError(m.uncounted or "no samples counted")
    # a cell that fails mid-window leaves the next cell of the process its collector as it found it
    finally:
        if m.collector is not None:
            m.collector.close()
    if cell.parallel == "ddp" and cell.comm_probe_steps:
        m.comm = _comm_probe(cell, device, step, feed, move)
    if cell.profile and step is not None:  # on every rank: a ddp step's collectives need them all
        _profile(cell, device, feed, step, out_dir, move)


def _loader(
    cell: Cell, device: torch.device, m: Measurement, user: dict, ctx: Context, where: tuple
):
    """The cell's dataset (its page cache as asked, its stage what-if made) and loader; the
    notebook's first-batch profile, if asked. `where`: the World, the copy function and the cell's
    results folder (rank 0's; else None)."""
    world, move, out_dir = where
    # before the dataset is built and probed, and before its workers fork
    make_stages(cell.stage_functions)
    dataset = built = build_dataset(cell, user, ctx)
    m.page_cache = prepare_page_cache(dataset, cell.page_cache)
    m.stage_order = stage_names(dataset)
    staged = cell.stage_timing and cell.scenario != "compute"
    # which stages a what-if could cache or move: the report's table
    probed = probe(dataset) if staged else None
    m.stage_probe = probed.facts() if probed is not None else {}
    dataset, m.whatif = apply_whatifs(cell, dataset, out_dir, probed)
    # a transform that raises is named either way; with timing, the warm-up's first samples are
    # profiled too
    dataset = timed(dataset, sample_profile(cell)) if staged else name_transforms(dataset)
    fetch = batch_fetch_note(built, dataset)
    if fetch:
        m.notes.append(fetch)
    loader = build_loader(
        cell, dataset, world.rank, world.world_size, collate=user.get("collate"), timed=staged
    )
    loader = m.whatif_loader = on_device(loader, m.whatif, device, cell)
    if cell.profile_first_batch and cell.scenario == "loader":
        m.first_batch_profile = profile_first_batch(loader, device, move)
    return loader


class TrainStep:
    """One step of the cell's model: forward and loss, backward, optimizer step, each phase closed
    by a clock mark.

    Built once per cell, before the loader starts: float32 matmuls at the cell's `matmul_precision`,
    the model (channels_last, wrapped for ddp or dp),
    the optimizer (knob `optimizer`: SGD by default) and the GradScaler; the optimizer is also the
    user's step's ctx.optimizer.
    """

    def __init__(self, cell: Cell, device: torch.device, m: Measurement, user: dict, ctx: Context):
        self.cell, self.device, self.m, self.user, self.ctx = cell, device, m, user, ctx
        # TF32 for float32 matmuls or not (process-wide: set by every cell, the default included)
        torch.set_float32_matmul_precision(cell.matmul_precision)
        model = build_model(cell, user, ctx).to(device)
        if cell.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.loss_fn = None if "model" in user else loss_function(cell.model)
        self.user_loss = build_loss(cell, user, device)
        # each DataParallel replica reduces its own output
        self.loss_inside = cell.parallel == "dp" and self.loss_fn is not None
        self.model = wrap_parallel(
            WithLoss(model, self.loss_fn) if self.loss_inside else model, cell, device
        )
        self.optimizer = build_optimizer(cell, self.model.parameters(), user)
        self.scaler = torch.amp.GradScaler(device.type, enabled=cell.amp == "fp16")
        ctx.optimizer = self.optimizer
        self.autocast_dtype = AUTOCAST_DTYPES.get(AMP_DTYPES[cell.amp])

    def __call__(self, batch, clock: PhaseClock) -> None:
        with self.autocast():
            loss = self.loss(batch)
        clock.mark()
        self.update(loss, clock)

    def autocast(self):
        """The cell's autocast (amp), which the forward phase runs in."""
        dtype = self.autocast_dtype
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)

    def update(self, loss: torch.Tensor | None, clock: PhaseClock) -> None:
        """The backward and optimizer phases, each closed by a clock mark; none after a step that
        ran them itself."""
        if loss is None:  # the user's step did backward and the optimizer step itself
            self._note_once(
                "step returned None (it ran backward and the optimizer itself): the forward "
                "phase holds all three"
            )
            clock.mark()
            clock.mark()
            return
        self.scaler.scale(loss).backward()
        clock.mark()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        clock.mark()

    def loss(self, batch) -> torch.Tensor | None:
        """The forward phase: the user's step, the default loss of a user model without one, or the
        built-in loss."""
        cell, model = self.cell, self.model
        if "step" in self.user:
            loss = self.user["step"](model, batch, self.ctx)
            if loss is not None and not isinstance(loss, torch.Tensor):
                raise KnobError(
                    f"knob 'step': '{cell.step}' returned {type(loss).__module__}."
                    f"{type(loss).__qualname__}; allowed: the loss tensor, or None after its own "
                    "backward and optimizer step"
                )
            return loss
        # a user model without a step: the default loss rule, said once in adjustments
        if self.loss_fn is None:
            return self.own_loss(self.forward(batch), batch)
        inputs = (
            batch[0].contiguous(memory_format=torch.channels_last)
            if cell.channels_last
            else batch[0]
        )
        return (
            model(inputs, *batch[1:]).mean()
            if self.loss_inside
            else self.loss_fn(model(inputs), batch)
        )

    def forward(self, batch):
        """A user model without a step, called on the batch (batches.call_model)."""
        return call_model(self.model, batch, self.cell.forward_keys)

    def own_loss(self, output, batch) -> torch.Tensor:
        """The loss of a user model without a step (batches.default_loss), its rule said once in
        adjustments."""
        cell = self.cell
        loss, rule = default_loss(output, batch, cell.label_key, cell.loss, self.user_loss)
        self._note_once(f"loss: {rule} (no step given)")
        return loss

    def _note_once(self, note: str) -> None:
        if note not in self.m.notes:
            self.m.notes.append(note)


@dataclass
class Feed:
    """Where the loop's batches come from: the loader (through the stream prefetcher, when on), or,
    for a compute cell, resident batches copied to the device once and replayed."""

    batches: Iterator
    prefetch: bool  # items are (host batch, device batch, copy events)
    # when the loader was asked for its first batch: time_to_first_batch_s counts from here
    start: float
    residents: list | None = None
    resident_tokens: list[int] | None = None
    resident: object = None  # the first resident batch; None: batches come from the loader


def _feed(cell: Cell, device: torch.device, m: Measurement, loader, move: Callable) -> Feed:
    prefetch = cell.device_prefetch == "stream" and cell.scenario == "train"
    start = time.perf_counter()
    # the user's batches, their stage timings kept apart
    batches = unwrap(epoch_batches(loader, m), m.stage_log)
    m.stage_skip = cell.warmup_steps
    if prefetch:
        batches = StreamPrefetcher(
            batches, device, cell.prefetch_depth, non_blocking=True, move=move
        )
    feed = Feed(batches, prefetch, start)
    # resident_batches real batches, copied to the device once and replayed
    if cell.scenario == "compute":
        firsts = [next(batches) for _ in range(cell.resident_batches)]
        feed.resident_tokens = (
            [int(b[2].sum()) for b in firsts] if cell.dataset == "tokens" else None
        )
        feed.residents = [move(b, device, False) for b in firsts]
        feed.resident = feed.residents[0]
        m.time_to_first_batch_s = time.perf_counter() - start
    return feed


def _window(
    cell: Cell,
    device: torch.device,
    m: Measurement,
    feed: Feed,
    step: TrainStep | None,
    steps: int,
    monitor,
    move: Callable,
) -> None:
    """Warm-up steps on a clock of their own, then `steps` measured ones; the window opens
    synchronised, and the monitor starts with it."""
    phases = PHASES_OF[cell.scenario]
    warm = PhaseClock("naive", device, phases)
    m.clock = PhaseClock(cell.timing, device, phases)
    m.collector = Collector(cell.gc)
    # before the warm-up: the window opens on the steady state, with nothing to pause it
    m.collector.freeze()
    for i in range(cell.warmup_steps + steps):
        measuring = i >= cell.warmup_steps
        if i == cell.warmup_steps:
            synchronize(device)
            m.collector.open()
            if monitor is not None:
                monitor.start()
        clock = m.clock if measuring else warm
        check_stop()
        pulled = m.pulled
        t_start = time.perf_counter()
        # its device work: device_prep
        with clock.fetching() if cell.scenario == "train" else contextlib.nullcontext():
            item = (
                feed.residents[i % len(feed.residents)]
                if feed.resident is not None
                else next(feed.batches)
            )
        t_ready = time.perf_counter()
        if measuring and any(pulled <= s < m.pulled for s in m.epoch_starts[1:]):
            # this step's wait started a later epoch (its workers)
            m.boundary_steps.append(len(m.waits_ms))
        if m.time_to_first_batch_s is None:
            m.time_to_first_batch_s = t_ready - feed.start
        host, batch, events = item if feed.prefetch else (item, None, None)
        m.delivered += batch_len(host) if feed.resident is None else 0
        if i == 0 and cell.pin_memory and device.type == "cuda" and feed.resident is None:
            note = unpinned_note(host)
            if note:
                m.notes.append(note)
        if measuring:  # the wait: the fetch less the trainer's own device work in it
            _record_step(
                cell, m, feed, i, (t_start, t_ready - clock.pending_host_ms / 1000), host, events
            )
        if cell.scenario != "loader":
            clock.start_step()
            if cell.scenario == "train":
                if not feed.prefetch:
                    batch = move(host, device, cell.non_blocking)
                clock.mark()
            step(batch if batch is not None else host, clock)
        if measuring:
            m.completed += 1
            m.last_done = time.perf_counter()


def _record_step(cell: Cell, m: Measurement, feed: Feed, i: int, wait: tuple, host, events) -> None:
    """A measured step's host figures: its start, its wait for data, its samples, tokens and bytes
    copied.

    `wait`: the step's start and when its batch was ready, less the device work done while it was
    fetched."""
    t_start, t_ready = wait
    m.step_starts.append(t_start)
    m.waits_ms.append((t_ready - t_start) * 1000)
    m.samples.append(batch_len(host))
    if not m.samples[-1] and m.uncounted is None:
        m.uncounted = uncounted(host)
    if cell.dataset == "tokens":
        m.tokens.append(
            feed.resident_tokens[i % len(feed.residents)]
            if feed.resident is not None
            else int(host[2].sum())
        )
    if cell.scenario == "train":
        m.h2d_bytes += copied_bytes(host)  # a batch's tensors already on the device are not copied
    if events is not None:
        m.copy_events.append(events)


def _close_window(device: torch.device, m: Measurement, monitor, feed: Feed) -> None:
    """The window ends synchronised; the monitor stops with it."""
    synchronize(device)
    m.window_end = time.perf_counter()
    if device.type == "cuda":
        m.pinned_held = pinned_held()
    if m.collector is not None:
        m.collector.close()
    if monitor is not None and monitor.is_alive():
        monitor.stop()
    if feed.prefetch and feed.batches.note:
        m.notes.append(feed.batches.note)


def context(cell: Cell, device: torch.device, world: World | None = None) -> Context:
    """The ctx a user's factories and step get: rank, world, device, batch size, workers, seed, the
    cell's knobs."""
    world = world or World()
    return Context(
        world.rank,
        world.world_size,
        world.local_rank,
        device,
        batch_size_of(cell),
        cell.num_workers,
        cell.seed,
        knobs=dataclasses.asdict(cell),
    )


def first_batches(
    cell: Cell, device: torch.device, user: dict, world: World | None = None
) -> Callable:
    """first(pinned): the first batch of the cell's loader with pin_memory on or off (what
    batch_probe copies)."""
    world = world or World()
    dataset = build_dataset(cell, user, context(cell, device, world))

    def first(pinned: bool):
        loader = build_loader(
            dataclasses.replace(cell, pin_memory=pinned),
            dataset,
            world.rank,
            world.world_size,
            collate=user.get("collate"),
        )
        return next(iter(loader))

    return first


def _comm_probe(cell: Cell, device, step: TrainStep, feed: Feed, move) -> dict:
    """The exposed cost of gradient all-reduce: the same steps with and without DDP's sync.

    One batch kept on the device, so data loading does not blur the comparison.
    """
    resident = feed.resident
    if resident is None:
        item = next(feed.batches)
        resident = item[1] if feed.prefetch else move(item, device, False)
    null = PhaseClock("naive", device, PHASES_OF["compute"])

    def timed(no_sync: bool) -> float:
        times = []
        for _ in range(cell.comm_probe_steps):
            check_stop()
            synchronize(device)
            start = time.perf_counter()
            null.start_step()
            with step.model.no_sync() if no_sync else contextlib.nullcontext():
                step(resident, null)
            synchronize(device)
            times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times)

    with_sync, without_sync = timed(False), timed(True)
    return {
        "steps": cell.comm_probe_steps,
        "step_ms_sync": with_sync,
        "step_ms_no_sync": without_sync,
        "comm_share": max(0.0, 1 - without_sync / with_sync) if with_sync > 0 else None,
    }


def _profile(cell: Cell, device, feed: Feed, step: TrainStep, out_dir, move) -> None:
    """A torch.profiler Chrome trace of a few extra steps, after (never inside) the measured window.

    Every rank runs the steps (under ddp each one all-reduces, so a rank left out would hang the
    others); only the rank given an out_dir (rank 0) writes the trace.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    null = PhaseClock("naive", device, PHASES_OF[cell.scenario])
    with profile(activities=activities) as prof:
        for _ in range(cell.profile_steps):
            null.start_step()
            if feed.resident is not None:
                batch = feed.resident
            else:
                item = next(feed.batches)
                batch = item[1] if feed.prefetch else move(item, device, cell.non_blocking)
                null.mark()
            step(batch, null)
        synchronize(device)
    if out_dir is None:
        return
    tmp = os.path.join(out_dir, ".trace.json.tmp")
    prof.export_chrome_trace(tmp)
    os.replace(tmp, os.path.join(out_dir, "trace.json"))
