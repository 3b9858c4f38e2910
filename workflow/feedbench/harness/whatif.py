"""Stage what-ifs, run for real: the knobs cache_after, skip_stages and device_stages (plan.knobs.STAGE_WHATIFS).

They change the stages of the dataset's torchvision Compose (v1 or v2), found and named as the stage timing finds and
names them (harness.stages.pipeline), and, for the built-in `images`, its read and decode before the Compose:

    cache_after    a first pass, in the training process before the loader starts, runs every sample up to and
                   including the stage and keeps what it gave (in memory, or in stage_cache.pt in the cell's results
                   folder), at most cache_limit_mb; later samples start from it (the stage `Cached`) and run only
                   the stages after it. Work of the dataset's own outside the Compose (its spans, its unattributed
                   rest) still runs per sample. Cached random stages drew once: the augmentation is fixed.
    skip_stages    the stages are dropped: for measurement only, the data changes.
    device_stages  the stage and those after it leave the workers: a torchvision v2 Compose of them runs on each batch
                   in the training process, after its samples are moved to the cell's device (the batch's first
                   tensor, or the batch when it is one). A random transform draws once per batch, not per sample.

Each cell records what its what-if did and what it traded (metrics.whatif).
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.data import Dataset, IterableDataset

from ..plan.cell import Cell
from ..plan.knobs import IMAGE_STAGES, STAGE_WHATIFS, KnobError
from .stages import StagedBatch, pipeline

READ, DECODE = IMAGE_STAGES
CACHE_FILE = "stage_cache.pt"
_index: int | None = None  # the index of the sample this process is making (CachedSamples sets it)


def _random(names: list[str]) -> list[str]:
    """The stages among `names` that draw at random, by torchvision's naming (Random...): a user's own random
    transform under another name is not known to be one."""
    return [n for n in names if n.startswith("Random")]


def nbytes(item: Any) -> int:
    """What one cached item holds: tensors and arrays by their bytes, PIL images by their pixels, containers summed."""
    if isinstance(item, torch.Tensor):
        return item.element_size() * item.nelement()
    if isinstance(item, (bytes, bytearray)):
        return len(item)
    if isinstance(item, (list, tuple)):
        return sum(nbytes(x) for x in item)
    if isinstance(item, dict):
        return sum(nbytes(x) for x in item.values())
    if hasattr(item, "nbytes"):  # numpy
        return int(item.nbytes)
    if hasattr(item, "size") and hasattr(item, "getbands"):  # a PIL image
        return item.size[0] * item.size[1] * len(item.getbands())
    return sys.getsizeof(item)


class Store:
    """The cached items by sample index: a dict in memory, or, once saved, a file each process maps on first use."""

    def __init__(self, stage: str, limit_mb: float, samples: int):
        self.stage, self.limit, self.samples = stage, limit_mb * 2**20, samples
        self.items: dict[int, Any] | None = {}
        self.bytes, self.path = 0, None

    def put(self, item: Any) -> None:
        self.items[_index] = item
        self.bytes += nbytes(item)
        if self.bytes > self.limit:
            need = self.bytes / len(self.items) * self.samples
            raise KnobError(
                f"knob 'cache_limit_mb': the cache after '{self.stage}' outgrew its {_size(self.limit)} at sample "
                f"{len(self.items)} of {self.samples} (about {_size(need)} for all); allowed: a larger "
                "cache_limit_mb, or cache_after a stage whose output is smaller"
            )

    def save(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        torch.save(self.items, path)
        self.items, self.path = None, path

    def __getitem__(self, index: int) -> Any:
        if self.items is None:
            self.items = torch.load(self.path, mmap=True, weights_only=False)
        return self.items[index]

    def __getstate__(self):  # a spawned worker maps the file itself rather than receive its items
        state = dict(self.__dict__)
        if self.path is not None:
            state["items"] = None
        return state


class Capture:
    """The first pass: runs the cached stages and keeps what they give for the sample being made."""

    def __init__(self, steps: list, store: Store):
        self.steps, self.store = steps, store

    def __call__(self, x):
        for step in self.steps:
            x = step(x)
        self.store.put(x)
        return x


class Cached:
    """The cached stages of a sample, replaced by what the first pass kept for it (its stage name: `Cached`)."""

    def __init__(self, store: Store):
        self.store = store

    def __call__(self, _x):
        return self.store[_index]


class Passthrough:
    """What a Compose left with no transform of its own holds: torchvision v2's Compose cannot run an empty list."""

    def __call__(self, x):
        return x


def _assign(compose, transforms: list) -> None:
    compose.transforms = list(transforms) or [Passthrough()]


class Nothing:
    """The built-in images' read and decode once the cache holds what comes after them: no file is opened."""

    def __call__(self, _path):
        return None


class ReadCapture:
    """The first pass of cache_after read: the file's bytes kept, nothing decoded."""

    def __init__(self, store: Store):
        self.store = store

    def __call__(self, path):
        with open(path, "rb") as f:
            self.store.put(f.read())


class DecodeCached:
    """cache_after read: the cached bytes of the sample, decoded as the cell's decoder does (its stage `decode`)."""

    def __init__(self, store: Store, decoder: str):
        self.store, self.decoder = store, decoder

    def __call__(self, _path):
        from .data import decode

        return decode(self.store[_index], self.decoder)


class CachedSamples(Dataset):
    """The dataset, telling its cache which sample is being made."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        global _index
        _index = index
        try:
            return self.dataset[index]
        finally:
            _index = None


@dataclass
class Plan:
    """What a cell's what-if changed (facts: metrics.whatif) and the transforms its training process runs."""

    facts: dict = field(default_factory=dict)
    device: Callable | None = None  # the v2 Compose of device_stages


def _images_loader(dataset) -> Any:
    """The built-in images' dataset (an ImageFolder reading with data.load_image) in the dataset's chain, or None."""
    from .data import load_image

    for _ in range(8):
        if dataset is None:
            return None
        loader = getattr(dataset, "loader", None)
        if isinstance(loader, functools.partial) and loader.func is load_image:
            return dataset
        dataset = getattr(dataset, "dataset", None)
    return None


def _stages(dataset) -> tuple[list[str], dict, Any]:
    """The stages a what-if may name, in order (read and decode of the built-in images, then the Composes'), by name
    the (compose, index) of each Compose stage, and the images' dataset (None for any other)."""
    images = _images_loader(dataset)
    named = pipeline(dataset)
    before = [READ, DECODE] if images is not None else []
    return before + [name for name, _, _ in named], {name: (c, i) for name, c, i in named}, images


def stage_names(dataset) -> list[str]:
    """The stages a what-if may name, in the pipeline's order: metrics.stages.order, whose order the prediction of a
    what-if reads (analysis.predict.taken_out)."""
    return _stages(dataset)[0]


def _known(knob: str, name: str, names: list[str], where: str = "") -> None:
    if name not in names:
        allowed = ", ".join(names) or "none: the dataset has no torchvision Compose"
        raise KnobError(f"knob '{knob}': the cell's pipeline has no stage {name!r}{where}; allowed: {allowed}")


def apply(cell: Cell, dataset: Dataset, out_dir: str | None) -> tuple[Dataset, Plan]:
    """The dataset with the cell's what-ifs made (in place on its Compose), and what they changed; as it is without."""
    if not any(getattr(cell, name) for name in STAGE_WHATIFS):
        return dataset, Plan()
    names, composes, images = _stages(dataset)
    for name in cell.skip_stages:
        _known("skip_stages", name, [n for n in names if n in composes])
    first = next(iter(composes.values()), (None, 0))[0]  # cache_after and device_stages work on the first Compose
    in_first = [n for n in names if n not in composes or composes[n][0] is first]
    if cell.cache_after:
        _known("cache_after", cell.cache_after, in_first)
    if cell.device_stages:
        _known("device_stages", cell.device_stages, [n for n in in_first if n in composes])
    if cell.cache_after and cell.device_stages and names.index(cell.cache_after) >= names.index(cell.device_stages):
        raise KnobError(
            f"knob 'device_stages': stage {cell.device_stages!r} is cached (cache_after {cell.cache_after!r}); "
            "allowed: a stage after the cached ones"
        )
    for knob in ("cache_after", "device_stages"):
        if getattr(cell, knob) in cell.skip_stages:
            raise KnobError(
                f"knob '{knob}': stage {getattr(cell, knob)!r} is skipped (skip_stages); allowed: a stage not skipped"
            )
    own = [n for n in in_first if n not in cell.skip_stages]  # in order: read, decode, the first Compose's left
    plan = Plan(facts={"trades": []})
    _skip(cell, composes, plan)
    if cell.device_stages:
        _to_device(cell, first, own, plan)
    if cell.cache_after:
        if isinstance(dataset, IterableDataset):
            raise KnobError(
                "knob 'cache_after': an IterableDataset has no index to cache its samples by; allowed: null, or a "
                "map-style dataset"
            )
        dataset = CachedSamples(dataset)
        _cache(cell, dataset, first, own, images, out_dir, plan)
    return dataset, plan


def _skip(cell: Cell, composes: dict, plan: Plan) -> None:
    dropped = [composes[name][0].transforms[composes[name][1]] for name in cell.skip_stages]
    for compose in {id(c): c for c, _ in composes.values()}.values():
        _assign(compose, [t for t in compose.transforms if all(t is not d for d in dropped)])
    if cell.skip_stages:
        plan.facts["skipped"] = list(cell.skip_stages)
        plan.facts["trades"].append(f"changes the data: {', '.join(cell.skip_stages)} skipped")


def _to_device(cell: Cell, compose, names: list[str], plan: Plan) -> None:
    """device_stages: the first Compose's transforms from the stage on leave it, for a v2 Compose of them."""
    from torchvision.transforms import v2

    moved = [n for n in names[names.index(cell.device_stages) :] if n not in (READ, DECODE)]
    start = len(compose.transforms) - len(moved)  # skipped stages are gone: count from the end
    for name, transform in zip(moved, compose.transforms[start:], strict=True):
        if not isinstance(transform, v2.Transform):
            kind = f"{type(transform).__module__}.{type(transform).__qualname__}"
            raise KnobError(
                f"knob 'device_stages': stage {name!r} ({kind}) is not a torchvision v2 transform; allowed: a stage "
                "from which on every transform is a torchvision.transforms.v2 one"
            )
    plan.device = v2.Compose(list(compose.transforms[start:]))
    _assign(compose, compose.transforms[:start])
    plan.facts["device_stages"] = moved
    plan.facts["trades"].append(f"{', '.join(moved)} run on the batch after the copy")
    if _random(moved):
        plan.facts["trades"].append(f"per-sample random transform applied per batch ({', '.join(_random(moved))})")


def _cache(cell: Cell, dataset: CachedSamples, compose, names: list[str], images, out_dir, plan: Plan) -> None:
    """cache_after: the first pass over every sample, then the Compose (and the images' loader) replaying it."""
    stage = cell.cache_after
    store = Store(stage, cell.cache_limit_mb, len(dataset))
    kept = [n for n in names if n not in (READ, DECODE)]
    cut = kept.index(stage) + 1 if stage in kept else 0
    steps = list(compose.transforms) if compose is not None else []
    loader = images.loader if images is not None else None
    if stage == READ:
        images.loader, compose.transforms = ReadCapture(store), [Passthrough()]
    else:
        compose.transforms = [Capture(steps[:cut], store)]
    start = time.perf_counter()
    for index in range(len(dataset)):
        dataset[index]
    build_s = time.perf_counter() - start
    if cell.cache_in == "file":
        store.save(os.path.join(out_dir or os.getcwd(), CACHE_FILE))
    if stage == READ:
        images.loader, compose.transforms = DecodeCached(store, loader.keywords.get("decoder", "pil")), steps
    else:
        compose.transforms = [Cached(store), *steps[cut:]]
        if images is not None:
            images.loader = Nothing()
    cached = names[: names.index(stage) + 1]
    where = f"on disk ({CACHE_FILE})" if cell.cache_in == "file" else "in memory, per process"
    plan.facts.update(
        cached=cached, cache={"samples": len(dataset), "bytes": store.bytes, "in": cell.cache_in, "build_s": build_s}
    )
    plan.facts["trades"].append(f"cache of {_size(store.bytes)} {where}")
    if _random(cached):
        plan.facts["trades"].append(f"random stage cached: augmentation fixed ({', '.join(_random(cached))})")


def _size(count: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} bytes"


class DeviceStages:
    """device_stages: the loader's batches, their samples moved to the device and run through the moved stages in the
    training process (their time: ms per batch, in facts). The rest of the loader (len, sampler) is the DataLoader's."""

    def __init__(self, loader, transform: Callable, device: torch.device, non_blocking: bool, facts: dict):
        self.loader, self.transform, self.device, self.non_blocking = loader, transform, device, non_blocking
        self.times: list = []  # per batch: seconds on a CPU, a pair of CUDA events on a GPU
        self.facts = facts

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device, non_blocking=self.non_blocking)
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            x = self.transform(x)
            end.record()
            self.times.append((start, end))
            return x
        start = time.perf_counter()
        x = self.transform(x)
        self.times.append(time.perf_counter() - start)
        return x

    def _batch(self, batch):
        if isinstance(batch, torch.Tensor):
            return self._run(batch)
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
            return type(batch)([self._run(batch[0]), *batch[1:]])
        raise KnobError(
            f"knob 'device_stages': the loader's batch is a {type(batch).__name__}; allowed: a tensor, or a tuple or "
            "list whose first item is the samples' tensor"
        )

    def __iter__(self):
        for item in self.loader:
            if isinstance(item, StagedBatch):
                yield StagedBatch(self._batch(item.batch), item.timings)
            else:
                yield self._batch(item)

    def ms_per_batch(self, skip: int) -> float | None:
        """The median ms of the moved stages on a batch, past the first `skip` (warm-up); read after a sync."""
        times = self.times[skip:] or self.times
        ms = [s * 1000 if isinstance(s, float) else s[0].elapsed_time(s[1]) for s in times]
        return statistics.median(ms) if ms else None


def on_device(loader, plan: Plan, device: torch.device, cell: Cell):
    """The loader, its batches run through the device stages where the cell moved some."""
    return loader if plan.device is None else DeviceStages(loader, plan.device, device, cell.non_blocking, plan.facts)


def facts(loader, plan: Plan, skip: int, device_readable: bool = True) -> dict | None:
    """metrics.whatif: what the cell's what-if did and traded; None without one. The device stages' time reads CUDA
    events: only where the device can be read (null after a device error)."""
    if not plan.facts:
        return None
    if isinstance(loader, DeviceStages):
        plan.facts["device_ms_per_batch"] = loader.ms_per_batch(skip) if device_readable else None
    return plan.facts
