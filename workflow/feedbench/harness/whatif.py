"""Stage what-ifs, run for real: the knobs cache_after, skip_stages and device_stages
(core.knobs.STAGE_WHATIFS).

They change the stages of the dataset's torchvision Compose (v1 or v2), found and named as the stage
timing finds and names them (harness.stages.pipeline), for the built-in `images` its read and decode
before the Compose, and the functions a map-style dataset's sample runs under
`@feedbench.stage(name)` (found on a sampled call, `probe`):

    cache_after    a first pass, in the training process before the loader starts, runs every sample
                   up to and including the stage and keeps what it gave (in memory, or in
                   stage_cache.pt in the cell's results folder), at most cache_limit_mb; later
                   samples start from it (the stage `Cached`) and run only the stages after it. Work
                   of the dataset's own outside the Compose (its spans, its unattributed rest) still
                   runs per sample. Cached random stages drew once: the augmentation is fixed. A
                   decorated function: each of its calls in a sample kept by (sample index, call),
                   later calls return it without running the function; the rest of the sample runs
                   as it is.
    skip_stages    the stages are dropped: for measurement only, the data changes. A decorated
                   function of one argument returns it unchanged.
    device_stages  the stage and those after it leave the workers: a torchvision v2 Compose of them
                   runs on each batch in the training process, after its samples are moved to the
                   cell's device (the batch's first tensor, or the batch when it is one). A random
                   transform draws once per batch, not per sample.

Each cell records what its what-if did and what it traded (metrics.whatif).
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.data import Dataset, IterableDataset

from ..core.cell import Cell
from ..core.knobs import IMAGE_STAGES, KNOBS, STAGE_WHATIFS, KnobError
from . import randomness, stages
from .batches import copied_bytes
from .stages import StagedBatch, first_line, named, pipeline
from .timing import device_work

READ, DECODE = IMAGE_STAGES
CACHE_FILE = "stage_cache.pt"
_index: int | None = None  # the index of the sample this process is making (CachedSamples sets it)
# per decorated stage, its calls so far in that sample (CachedSamples resets it)
_calls: dict[str, int] = {}


# The first samples of a cache's first pass on which its cached stages are checked for randomness
# (randomness.differs): a stage that draws with a probability (a flip, random erasing) may give the
# same output twice on one sample.
CHECKED_SAMPLES = 8


def nbytes(item: Any) -> int:
    """What one cached item holds: tensors and arrays by their bytes, PIL images by their pixels,
    containers summed."""
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
    """The cached items by sample index: a dict in memory, or, once saved, a file each process maps
    on first use."""

    def __init__(self, stage: str, limit_mb: float, samples: int):
        self.stage, self.limit, self.samples = stage, limit_mb * 2**20, samples
        self.items: dict[Any, Any] | None = {}
        self.bytes, self.path, self.indices = 0, None, set()

    def put(self, item: Any, key: Any = None) -> None:
        """Keep `item` for the sample being made (or under `key`: a decorated stage's call of
        it)."""
        self.items[_index if key is None else key] = item
        self.indices.add(_index)
        self.bytes += nbytes(item)
        if self.bytes > self.limit:
            need = self.bytes / len(self.indices) * self.samples
            raise KnobError(
                f"knob 'cache_limit_mb': the cache after '{self.stage}' outgrew its "
                f"{_size(self.limit)} at sample {len(self.indices)} of {self.samples} (about "
                f"{_size(need)} for all); allowed: a larger cache_limit_mb, or cache_after a "
                "stage whose output is smaller"
            )

    def save(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        torch.save(self.items, path)
        self.items, self.path = None, path

    def _loaded(self) -> dict:
        if self.items is None:
            self.items = torch.load(self.path, mmap=True, weights_only=False)
        return self.items

    def __getitem__(self, key: Any) -> Any:
        return self._loaded()[key]

    def __contains__(self, key: Any) -> bool:
        return key in self._loaded()

    def __getstate__(self):  # a spawned worker maps the file itself rather than receive its items
        state = dict(self.__dict__)
        if self.path is not None:
            state["items"] = None
        return state


class Capture:
    """The first pass: runs the cached stages and keeps what they give for the sample being made,
    then the stages after them, so that what the Compose returns is what the dataset's own code
    after it expects. On its first CHECKED_SAMPLES samples it finds which cached stages (`names`)
    are random, by what they do (randomness.differs): `random`."""

    def __init__(self, steps: list, store: Store, after: list, names: list[str] = ()):
        self.steps, self.store, self.after, self.names = steps, store, after, list(names)
        self.random: set[str] = set()
        self.checked = 0

    def __call__(self, x):
        check = self.checked < CHECKED_SAMPLES
        self.checked += 1
        for name, step in zip(self.names or [None] * len(self.steps), self.steps, strict=True):
            due = check and name is not None and name not in self.random
            if due and randomness.differs(step, (x,)):
                self.random.add(name)
            x = step(x)
        self.store.put(x)
        for step in self.after:
            x = step(x)
        return x


class Cached:
    """The cached stages of a sample, replaced by what the first pass kept for it (its stage name:
    `Cached`)."""

    def __init__(self, store: Store):
        self.store = store

    def __call__(self, _x):
        return self.store[_index]


class Passthrough:
    """What a Compose left with no transform of its own holds: torchvision v2's Compose cannot run
    an empty list."""

    def __call__(self, x):
        return x


def _assign(compose, transforms: list) -> None:
    compose.transforms = list(transforms) or [Passthrough()]


class Nothing:
    """The built-in images' read and decode once the cache holds what comes after them: no file is
    opened."""

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
    """cache_after read: the cached bytes of the sample, decoded as the cell's decoder does (its
    stage `decode`)."""

    def __init__(self, store: Store, decoder: str):
        self.store, self.decoder = store, decoder

    def __call__(self, _path):
        from .data import decode

        return decode(self.store[_index], self.decoder)


class FunctionCache:
    """cache_after a decorated stage, in place of its functions (stages.REPLACED): the first pass
    runs each call and keeps its output by (sample index, call); later calls return it, the function
    not run. A call outside a sample (in collate, say), or one the first pass did not make, runs the
    function."""

    def __init__(self, store: Store, name: str):
        self.store, self.name, self.filling = store, name, True
        self.random, self.checked = False, 0  # whether its function was found random (Capture)

    def __call__(self, function: Callable, *args, **kwargs):
        if _index is None:
            return function(*args, **kwargs)
        call = _calls.get(self.name, 0)
        _calls[self.name] = call + 1
        if self.filling:
            if not self.random and self.checked < CHECKED_SAMPLES and not kwargs:
                self.checked += 1
                self.random = bool(
                    randomness.differs(function, args, randomness.takes_self(function))
                )
            output = function(*args, **kwargs)
            self.store.put(output, (_index, call))
            return output
        key = (_index, call)
        return self.store[key] if key in self.store else function(*args, **kwargs)


class Skipped:
    """skip_stages on a decorated stage, in place of its functions: each call returns its one
    argument, unchanged."""

    def __call__(self, function: Callable, *args, **kwargs):
        return inspect.signature(function).bind(*args, **kwargs).arguments[_input(function)]


class CachedSamples(Dataset):
    """The dataset, telling its what-ifs which sample is being made; it carries their `replaced`
    decorated stages (stages.REPLACED, per process) into a spawned loader worker."""

    def __init__(self, dataset: Dataset, replaced: dict | None = None):
        self.dataset, self.replaced = dataset, dict(replaced or {})

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        stages.REPLACED.update(self.replaced)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        global _index
        _index = index
        _calls.clear()
        try:
            return self.dataset[index]
        finally:
            _index = None


@dataclass
class Plan:
    """What a cell's what-if changed (facts: metrics.whatif) and the transforms its training process
    runs."""

    facts: dict = field(default_factory=dict)
    device: Callable | None = None  # the v2 Compose of device_stages


def _images_loader(dataset) -> Any:
    """The built-in images' dataset (an ImageFolder reading with data.load_image) in the dataset's
    chain, or None."""
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
    """The stages a what-if may name, in order (read and decode of the built-in images, then the
    Composes'), by name the (compose, index) of each Compose stage, and the images' dataset (None
    for any other)."""
    images = _images_loader(dataset)
    named = pipeline(dataset)
    before = [READ, DECODE] if images is not None else []
    return before + [name for name, _, _ in named], {name: (c, i) for name, c, i in named}, images


def stage_names(dataset) -> list[str]:
    """The stages a what-if may name, in the pipeline's order: metrics.stages.order, whose order the
    prediction of a what-if reads (analysis.predict.taken_out)."""
    return _stages(dataset)[0]


class Tap:
    """A Compose stage on the sampled call (probe), run as it is: whether it took one tensor and
    gave one, and whether it is random (randomness.differs, over up to RANDOM_TRIES more calls: a
    random flip gives the same output as the first call half the time)."""

    RANDOM_TRIES = 8

    def __init__(self, transform: Callable):
        self.transform, self.tensor, self.random = transform, False, False

    def __call__(self, *args):
        self.random = bool(randomness.differs(self.transform, args, tries=self.RANDOM_TRIES))
        output = self.transform(*args)
        self.tensor = (
            len(args) == 1
            and isinstance(args[0], torch.Tensor)
            and isinstance(output, torch.Tensor)
        )
        return output


@dataclass
class Probed:
    """What one sampled call of the dataset showed (probe)."""

    # stage name -> the @feedbench.stage functions that ran under it
    functions: dict = field(default_factory=dict)
    spans: list = field(default_factory=list)  # the `with feedbench.stage` spans that ran
    # the first Compose's stages from which on all took and gave tensors
    on_device: list = field(default_factory=list)
    # the first Compose's stages found random on the sampled call (Tap)
    random: list = field(default_factory=list)
    # whether a sample was drawn: not from a stream, nor where the first sample failed
    sampled: bool = False

    def facts(self) -> dict:
        """metrics.stages' `functions` and `on_device` (the summary's stage_decorated,
        stage_on_device)."""
        return {"functions": list(self.functions), "on_device": list(self.on_device)}


def probe(dataset) -> Probed:
    """One sample of a map-style dataset drawn in this process (the dataset as built, before any
    what-if): the decorated functions and the spans it ran, and the first Compose's stages from
    which on each took a tensor and gave one (where device_stages may start). A stream is not drawn
    from (that would change what it yields), nor is anything kept of a sample that fails (its loader
    then says why, as without the probe). The sample is drawn from a shallow copy: a file handle the
    dataset opens on first use (h5py, lmdb) stays off the one the workers get."""
    found = Probed()
    if isinstance(dataset, IterableDataset):
        return found
    try:
        sampled = copy.copy(dataset)
    except Exception:  # a class that cannot be copied: drawn from as it is
        sampled = dataset
    names, composes, _images = _stages(dataset)
    first = next(iter(composes.values()), (None, 0))[0]
    inside = [name for name, (compose, _) in composes.items() if compose is first]
    saved, replaced = (first.transforms if first is not None else []), dict(stages.REPLACED)

    def ran(name: str, function: Callable, *args, **kwargs):
        found.functions.setdefault(name, [])
        if function not in found.functions[name]:
            found.functions[name].append(function)
        return function(*args, **kwargs)

    taps = [Tap(transform) for transform in saved]
    try:
        if first is not None:
            first.transforms = taps
        stages.REPLACED.update({name: functools.partial(ran, name) for name in stages.FUNCTIONS})
        with randomness.random_state_kept():
            seen = stages.sample_stages(lambda: sampled[0])
    except Exception:
        return Probed()
    finally:
        if first is not None:
            first.transforms = saved
        stages.REPLACED.clear()
        stages.REPLACED.update(replaced)
    found.sampled = True
    found.spans = [
        n for n in seen if n not in found.functions and n not in names and n != stages.UNATTRIBUTED
    ]
    found.random = [name for name in inside if taps[composes[name][1]].random]
    # a tensor stage after one that is not: the move would take that one along
    for name in reversed(inside):
        if not taps[composes[name][1]].tensor:
            break
        found.on_device.insert(0, name)
    return found


def _known(knob: str, name: str, names: list[str], probed: Probed) -> None:
    """Nothing where the what-if `knob` may name the stage `name` (one of `names`), else its one
    line."""
    if name in names:
        return
    allowed = ", ".join(names) or (
        "none: the dataset has no torchvision Compose, and its sample ran no @feedbench.stage "
        "function"
    )
    if name in probed.spans:
        raise KnobError(
            f"knob '{knob}': stage {name!r} is a `with feedbench.stage` span, a block of code "
            f"whose output feedbench cannot take; allowed: @feedbench.stage({name!r}) on a "
            f"function that does its work, or one of {allowed}"
        )
    if name in stages.FUNCTIONS and not probed.sampled:
        raise KnobError(
            f"knob '{knob}': stage {name!r} is a @feedbench.stage function, found in a sample "
            "only, and no sample was drawn ahead of the loader (an IterableDataset's would "
            f"change what it yields, or the first sample failed); allowed: {allowed}"
        )
    if name in probed.functions:
        raise KnobError(
            f"knob '{knob}': stage {name!r} is a @feedbench.stage function; only a Compose's "
            f"stages move to the batch; allowed: {allowed}"
        )
    raise KnobError(f"knob '{knob}': the cell's pipeline has no stage {name!r}; allowed: {allowed}")


def _input(function: Callable) -> str | None:
    """The one argument of a decorated function (after a method's self), which a skip returns; None
    for any other."""
    parameters = list(inspect.signature(function).parameters.values())
    if parameters and parameters[0].name in ("self", "cls"):
        parameters = parameters[1:]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        return None
    needed = [p for p in parameters if p.default is p.empty]
    return needed[0].name if len(needed) == 1 else None


def _check(cell: Cell, names: list[str], composes: dict, probed: Probed) -> None:
    """The cell's what-ifs name stages it may change, together: else one line."""
    for name in cell.skip_stages:
        _known(
            "skip_stages",
            name,
            [n for n in names if n in composes] + list(probed.functions),
            probed,
        )
        for function in probed.functions.get(name, []):
            if _input(function) is None:
                raise KnobError(
                    f"knob 'skip_stages': stage {name!r} ({function.__module__}."
                    f"{function.__qualname__}) takes {inspect.signature(function)}, and a "
                    "skipped function returns its one argument; allowed: a stage whose function "
                    f"takes one argument, or cache_after {name!r}"
                )
    # cache_after and device_stages work on the first Compose
    first = next(iter(composes.values()), (None, 0))[0]
    in_first = [n for n in names if n not in composes or composes[n][0] is first]
    if cell.cache_after:
        _known("cache_after", cell.cache_after, in_first + list(probed.functions), probed)
    if cell.device_stages:
        _known("device_stages", cell.device_stages, [n for n in in_first if n in composes], probed)
    if (
        cell.cache_after in names
        and cell.device_stages
        and names.index(cell.cache_after) >= names.index(cell.device_stages)
    ):
        raise KnobError(
            f"knob 'device_stages': stage {cell.device_stages!r} is cached (cache_after "
            f"{cell.cache_after!r}); allowed: a stage after the cached ones"
        )
    # the what-ifs that name one stage
    for knob in (k for k in STAGE_WHATIFS if KNOBS[k].type is str):
        if getattr(cell, knob) in cell.skip_stages:
            raise KnobError(
                f"knob '{knob}': stage {getattr(cell, knob)!r} is skipped (skip_stages); "
                "allowed: a stage not skipped"
            )


def apply(
    cell: Cell, dataset: Dataset, out_dir: str | None, probed: Probed | None = None
) -> tuple[Dataset, Plan]:
    """The dataset with the cell's what-ifs made (in place on its Compose; for decorated stages, in
    stages.REPLACED), and what they changed; as it is without. `probed`: the dataset's probe, where
    already made."""
    stages.REPLACED.clear()  # an earlier cell's what-if in this process is not this one's
    if not any(getattr(cell, name) for name in STAGE_WHATIFS):
        return dataset, Plan()
    if cell.cache_after and isinstance(dataset, IterableDataset):
        raise KnobError(
            "knob 'cache_after': an IterableDataset has no index to cache its samples by; "
            "allowed: null, or a map-style dataset"
        )
    names, composes, images = _stages(dataset)
    probed = probe(dataset) if probed is None else probed
    _check(cell, names, composes, probed)
    first = next(iter(composes.values()), (None, 0))[0]
    own = [
        n
        for n in names
        if (n not in composes or composes[n][0] is first) and n not in cell.skip_stages
    ]
    plan = Plan(facts={"trades": []})
    _skip(cell, composes, plan)
    if cell.device_stages:
        _to_device(cell, first, own, plan, probed.random)
    if cell.cache_after:
        dataset = CachedSamples(dataset)
        _cache(cell, dataset, (first, own, images, list(probed.functions)), out_dir, plan)
    if stages.REPLACED:  # decorated stages changed: a spawned worker gets them with the dataset
        dataset = dataset if isinstance(dataset, CachedSamples) else CachedSamples(dataset)
        dataset.replaced = dict(stages.REPLACED)
    return dataset, plan


def _skip(cell: Cell, composes: dict, plan: Plan) -> None:
    dropped = [
        composes[name][0].transforms[composes[name][1]]
        for name in cell.skip_stages
        if name in composes
    ]
    for compose in {id(c): c for c, _ in composes.values()}.values():
        _assign(compose, [t for t in compose.transforms if all(t is not d for d in dropped)])
    stages.REPLACED.update({name: Skipped() for name in cell.skip_stages if name not in composes})
    if cell.skip_stages:
        plan.facts["skipped"] = list(cell.skip_stages)
        plan.facts["trades"].append(f"changes the data: {', '.join(cell.skip_stages)} skipped")


def _to_device(cell: Cell, compose, names: list[str], plan: Plan, drawing: list[str]) -> None:
    """device_stages: the first Compose's transforms from the stage on leave it, for a v2 Compose of
    them; `drawing`: the stages the sampled call found random (probe)."""
    from torchvision.transforms import v2

    moved = [n for n in names[names.index(cell.device_stages) :] if n not in (READ, DECODE)]
    start = len(compose.transforms) - len(moved)  # skipped stages are gone: count from the end
    for name, transform in zip(moved, compose.transforms[start:], strict=True):
        if not isinstance(transform, v2.Transform):
            kind = f"{type(transform).__module__}.{type(transform).__qualname__}"
            raise KnobError(
                f"knob 'device_stages': stage {name!r} ({kind}) is not a torchvision v2 "
                "transform; allowed: a stage from which on every transform is a "
                "torchvision.transforms.v2 one"
            )
    plan.device = v2.Compose(list(compose.transforms[start:]))
    _assign(compose, compose.transforms[:start])
    plan.facts["device_stages"] = moved
    plan.facts["trades"].append(f"{', '.join(moved)} run on the batch after the copy")
    drawn = [name for name in moved if name in drawing]
    if drawn:
        plan.facts["trades"].append(
            f"per-sample random transform applied per batch ({', '.join(drawn)})"
        )


def _capture(
    stage: str, store: Store, compose, names: list[str], images
) -> Callable[[], tuple[list[str], list[str]]]:
    """cache_after a Compose stage (or read, decode): the first pass set to fill `store`; returns
    what then replays it, which gives the stages cached and those of them the first pass found
    random."""
    kept = [n for n in names if n not in (READ, DECODE)]
    cut = kept.index(stage) + 1 if stage in kept else 0
    steps = list(compose.transforms) if compose is not None else []
    loader = images.loader if images is not None else None
    capture = Capture(steps[:cut], store, steps[cut:], kept[:cut])
    if stage == READ:
        images.loader, compose.transforms = ReadCapture(store), [Passthrough()]
    else:
        compose.transforms = [capture]

    def replay() -> tuple[list[str], list[str]]:
        if stage == READ:
            images.loader, compose.transforms = (
                DecodeCached(store, loader.keywords.get("decoder", "pil")),
                steps,
            )
        else:
            compose.transforms = [Cached(store), *steps[cut:]]
            if images is not None:
                images.loader = Nothing()
        cached = names[: names.index(stage) + 1]
        return cached, [name for name in cached if name in capture.random]

    return replay


def _capture_function(stage: str, store: Store) -> Callable[[], tuple[list[str], list[str]]]:
    """cache_after a decorated stage: its functions' calls kept in the first pass, replayed after
    it (and whether the first pass found it random)."""
    cache = stages.REPLACED[stage] = FunctionCache(store, stage)

    def replay() -> tuple[list[str], list[str]]:
        cache.filling = False
        return [stage], [stage] if cache.random else []

    return replay


def _first_pass(dataset: CachedSamples, stage: str) -> float:
    """Every sample made once, filling the cache; its seconds. A sample that fails says the first
    pass made it."""
    start = time.perf_counter()
    for index in range(len(dataset)):
        try:
            dataset[index]
        except KnobError:
            raise
        except Exception as error:
            message = (
                f"cache_after {stage!r}: its first pass failed at sample {index}: "
                f"{first_line(error)}"
            )
            raise named(error, message) from error
    return time.perf_counter() - start


def _cache(cell: Cell, dataset: CachedSamples, where: tuple, out_dir, plan: Plan) -> None:
    """cache_after: the first pass over every sample, then the decorated stage, or the Compose (and
    the images' loader), replaying it. `where`: the first Compose, its stages left (and read,
    decode), the images' dataset and the decorated stages."""
    compose, names, images, functions = where
    stage = cell.cache_after
    store = Store(stage, cell.cache_limit_mb, len(dataset))
    if stage in functions:
        replay = _capture_function(stage, store)
    else:
        replay = _capture(stage, store, compose, names, images)
    build_s = _first_pass(dataset, stage)
    if cell.cache_in == "file":
        store.save(os.path.join(out_dir or os.getcwd(), CACHE_FILE))
    cached, frozen = replay()
    kept_in = f"on disk ({CACHE_FILE})" if cell.cache_in == "file" else "in memory, per process"
    plan.facts.update(
        cached=cached,
        cache={
            "samples": len(dataset),
            "bytes": store.bytes,
            "in": cell.cache_in,
            "build_s": build_s,
        },
    )
    plan.facts["trades"].append(f"cache of {_size(store.bytes)} {kept_in}")
    if frozen:
        plan.facts["frozen"] = frozen
        plan.facts["trades"].append(
            f"random stage cached: augmentation fixed ({', '.join(frozen)})"
        )


def _size(count: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} bytes"


class DeviceStages:
    """device_stages: the loader's batches, their samples moved to the device and run through the
    moved stages in the training process (their time: ms per batch, in facts). The rest of the
    loader (len, sampler) is the DataLoader's.

    The samples' copy is made here, in device_prep: the loop then finds them on the device and, by
    its rule for such tensors, leaves them out of the bytes it copied. So the bytes are kept here,
    per batch (`copied`), and added to the window's (`copied_in_prep`)."""

    def __init__(
        self, loader, transform: Callable, device: torch.device, non_blocking: bool, facts: dict
    ):
        self.loader, self.transform, self.device, self.non_blocking = (
            loader,
            transform,
            device,
            non_blocking,
        )
        self.times: list = []  # per batch: seconds on a CPU, a pair of CUDA events on a GPU
        # per batch: the host bytes its samples' copy moved (none on a CPU: they stay on the host,
        # where the loop counts them)
        self.copied: list[int] = []
        self.facts = facts

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        self.copied.append(copied_bytes(x) if self.device.type != "cpu" else 0)
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
            f"knob 'device_stages': the loader's batch is a {type(batch).__name__}; allowed: a "
            "tensor, or a tuple or list whose first item is the samples' tensor"
        )

    def __iter__(self):
        for item in self.loader:
            # the trainer's time, not the loader's: the step's device_prep (harness.timing)
            with device_work():
                staged = isinstance(item, StagedBatch)
                batch = (
                    StagedBatch(self._batch(item.batch), item.timings)
                    if staged
                    else self._batch(item)
                )
            yield batch

    def ms_per_batch(self, skip: int) -> float | None:
        """The median ms of the moved stages on a batch, past the first `skip` (warm-up); read after
        a sync."""
        times = self.times[skip:] or self.times
        ms = [s * 1000 if isinstance(s, float) else s[0].elapsed_time(s[1]) for s in times]
        return statistics.median(ms) if ms else None


def on_device(loader, plan: Plan, device: torch.device, cell: Cell):
    """The loader, its batches run through the device stages where the cell moved some."""
    return (
        loader
        if plan.device is None
        else DeviceStages(loader, plan.device, device, cell.non_blocking, plan.facts)
    )


def copied_in_prep(loader, skip: int, count: int) -> int:
    """The bytes the device stages copied to the device for `count` batches past the first `skip`
    (the measured steps'), inside device_prep; 0 without device stages."""
    return sum(loader.copied[skip : skip + count]) if isinstance(loader, DeviceStages) else 0


def facts(loader, plan: Plan, skip: int, device_readable: bool = True) -> dict | None:
    """metrics.whatif: what the cell's what-if did and traded; None without one. The device stages'
    time reads CUDA events: only where the device can be read (null after a device error)."""
    if not plan.facts:
        return None
    if isinstance(loader, DeviceStages):
        plan.facts["device_ms_per_batch"] = loader.ms_per_batch(skip) if device_readable else None
    return plan.facts
