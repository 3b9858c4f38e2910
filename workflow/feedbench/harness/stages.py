"""Stage timing inside the loader: which part of a sample's __getitem__ (or of collate) costs the
time.

A sample is timed from the start to the end of its __getitem__ (or of its next() on an
IterableDataset), in whichever process makes it: a loader worker, or the main process with
num_workers 0. Inside it, `stage(name)` spans record their own time (a span nested in another is
taken out of the outer one's), and whatever the sample cost outside every span is its `unattributed`
time, never spread over the stages. The samples of a batch ride with it from collate to the loop as
a `StagedBatch`, through the DataLoader's own queue (pin_memory pins a namedtuple's fields), and the
loop strips them off before the user's code sees the batch (`unwrap`). Outside a timed sample
`stage` does nothing but check one global, so user code may keep its spans when it runs without
feedbench.
"""

from __future__ import annotations

import functools
import importlib
import statistics
import sys
import time
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from torch.utils.data import Dataset, IterableDataset

from . import profile as sample_profile
from .randomness import RANDOM, RandomCheck, takes_self

UNATTRIBUTED = "unattributed"
COLLATE = "collate"
TIMED_ATTRIBUTES = ("transform", "transforms", "target_transform")

# This process's timed sample: stage -> [seconds of its own, calls]; None outside one (stage() is
# then a no-op).
_sample: dict[str, list] | None = None
# the open spans of the sample: [start, seconds of the spans nested in it]
_open: list[list[float]] = []
# the samples made since the last collate: (seconds, their stages)
_made: list[tuple[float, dict]] = []
FUNCTIONS: set[str] = set()  # the stage names @stage has decorated a function with in this process
# Stage name -> what runs in place of its decorated functions, as replace(function, *args,
# **kwargs): a stage what-if's cache or skip (harness.whatif). Per process: a spawned loader worker
# gets it from the dataset that carries it.
REPLACED: dict[str, Callable] = {}


class stage:
    """Times a span of user code as the stage `name`, while feedbench times a sample; a no-op
    otherwise.

    `with feedbench.stage("tokenize"): ...` or `@feedbench.stage("tokenize")`: a decorated
    function's output is a value the stage what-ifs can cache or skip (REPLACED); a span's is not.
    """

    def __init__(self, name: str):
        self.name, self.opened = str(name), False

    def __call__(self, function: Callable) -> Callable:
        """The function, each call of it a span of its own (a recursive call opens one of its
        own)."""
        name = self.name
        FUNCTIONS.add(name)
        own_self = takes_self(function)

        @functools.wraps(function)
        def staged(*args, **kwargs):
            check = RandomCheck.due(name, args, kwargs, own_self) if _sample is not None else None
            with stage(name):
                replace = REPLACED.get(name)
                output = (
                    function(*args, **kwargs)
                    if replace is None
                    else replace(function, *args, **kwargs)
                )
            if check is not None and replace is None:
                check.done(function, output)
            return output

        return staged

    def __enter__(self):
        self.opened = _sample is not None
        if self.opened:
            _open.append([time.perf_counter(), 0.0])
        return self

    def __exit__(self, *exc) -> bool:
        if self.opened and _sample is not None and len(_open) > 1:
            _close(self.name)
        return False


def stage_name(target: str) -> str:
    """The stage of a function named by import path (knob stage_functions): its qualified name,
    `Class.method`."""
    return target.partition(":")[2]


def make_stages(targets: list[str]) -> list[str]:
    """Each function named by import path (`package.module:function`, `package.module:Class.method`)
    made a stage in this process, in place, as @stage(Class.method) would: the user's code keeps its
    calls and gains the stage's timing and what-ifs, with no change to it (knob stage_functions).
    Idempotent; a static or class method stays one. Run in the trainer before the loader forks its
    workers, and in each spawned worker (data.worker_start)."""
    names = []
    for target in targets:
        module_name, _, attribute = target.partition(":")
        *path, last = attribute.split(".")
        owner = importlib.import_module(module_name)
        for part in path:
            owner = getattr(owner, part)
        raw = (
            vars(owner).get(last, getattr(owner, last))
            if isinstance(owner, type)
            else getattr(owner, last)
        )
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        function = raw.__func__ if kind else raw
        name = stage_name(target)
        if getattr(function, "__feedbench_stage__", None) != name:
            staged = stage(name)(function)
            staged.__feedbench_stage__ = name
            setattr(owner, last, kind(staged) if kind else staged)
        names.append(name)
    return names


def _close(name: str) -> None:
    """The innermost open span ends as stage `name`: its time less its nested spans' is the stage's
    own."""
    start, nested = _open.pop()
    span = time.perf_counter() - start
    _open[-1][1] += span
    record = _sample.get(name)
    if record is None:
        _sample[name] = [span - nested, 1]
    else:
        record[0] += span - nested
        record[1] += 1


def _timed_sample(make: Callable[[], Any]) -> Any:
    """make() timed as one sample: its stages and its unattributed rest are kept for the batch's
    collate."""
    global _sample
    _sample, _open[:] = {}, [[time.perf_counter(), 0.0]]
    try:
        item = make()
        start, nested = _open[0]
        total = time.perf_counter() - start
        _sample[UNATTRIBUTED] = [total - nested, 1]
        _made.append((total, _sample))
        return item
    finally:
        _sample, _open[:] = None, []


def sample_stages(make: Callable[[], Any]) -> list[str]:
    """The stages make() ran, in the order they first ended, timed as one sample that no collate
    counts (the stage what-ifs' sampled call, harness.whatif.probe)."""
    _timed_sample(make)
    return list(_made.pop()[1])


class TimedSamples(Dataset):
    """A map-style dataset whose every __getitem__ is timed as a sample (the first ones profiled:
    harness.profile)."""

    def __init__(self, dataset: Dataset, profile: sample_profile.SampleProfile | None = None):
        self.dataset, self.profile = dataset, profile

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return _timed_sample(sample_profile.profiled(self.profile, lambda: self.dataset[index]))


class TimedStream(IterableDataset):
    """An IterableDataset whose every next() is timed as a sample (the first ones profiled:
    harness.profile)."""

    def __init__(
        self, dataset: IterableDataset, profile: sample_profile.SampleProfile | None = None
    ):
        self.dataset, self.profile = dataset, profile

    def __iter__(self) -> Iterator:
        items = iter(self.dataset)
        done = object()
        while True:
            item = _timed_sample(sample_profile.profiled(self.profile, lambda: next(items, done)))
            if item is done:
                _made.pop()  # the end of the stream is no sample
                return
            yield item


class StagedBatch(NamedTuple):
    """The user's batch and the stage timings of the samples it holds (plain floats), on their way
    to the loop."""

    batch: Any
    timings: dict


class TimedCollate:
    """The loader's collate, timed as the stage `collate`; returns the batch with its samples'
    timings."""

    def __init__(self, collate: Callable):
        self.collate = collate

    def __call__(self, samples):
        start = time.perf_counter()
        batch = self.collate(samples)
        collate_s = time.perf_counter() - start
        made, _made[:] = list(_made), []
        names = sorted({name for _, stages in made for name in stages})
        timings = {
            "sample_s": [total for total, _ in made],
            "stages": {
                name: [stages.get(name, (0.0, 0))[0] for _, stages in made] for name in names
            },
            "calls": {
                name: sum(stages.get(name, (0.0, 0))[1] for _, stages in made) for name in names
            },
            "collate_s": collate_s,
        }
        # the batch that ends this process's profile carries it, with the stages found random
        profiled = sample_profile.batch_made()
        if profiled is not None:
            timings["profile"] = {**profiled, "random": sorted(n for n, r in RANDOM.items() if r)}
        return StagedBatch(batch, timings)


def named(
    error: BaseException, message: str, fallback: type[BaseException] = RuntimeError
) -> BaseException:
    """A new `message` (naming what failed: a file, a transform) for `error`, as its own type where
    that type takes one message, else as `fallback`; raise it `from error`, so the traceback keeps
    the original."""
    try:
        return type(error)(message)
    except TypeError:  # a subclass whose constructor takes other arguments
        return fallback(message)


def first_line(error: BaseException) -> str:
    """An exception's message in one line: its first, or its type's name where it has none."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def transform_error(name: str, error: Exception) -> BaseException:
    """What a transform of a Compose raised, named: `transform 'Explode' failed: <its first line>`
    (an error a nested transform already named goes on as it is)."""
    if getattr(error, "feedbench_transform", None):
        return error
    failed = named(error, f"transform {name!r} failed: {first_line(error)}")
    try:
        failed.feedbench_transform = name
    except AttributeError:  # an exception type without a __dict__
        pass
    return failed


class NamedTransform:
    """One callable of a Compose, run as it is, but an exception it raises names it
    (transform_error): a loader worker's traceback reaches the main process as text, where the
    transform's class is lost."""

    def __init__(self, name: str, transform: Callable):
        self.name, self.transform = name, transform

    def __call__(self, *args, **kwargs):
        try:
            return self.transform(*args, **kwargs)
        except Exception as error:
            raise transform_error(self.name, error) from error

    def __getattr__(self, name: str):
        if name == "transform":  # not set yet: unpickling
            raise AttributeError(name)
        return getattr(self.transform, name)

    def __repr__(self) -> str:
        return repr(self.transform)


class TimedTransform(NamedTransform):
    """One callable of a Compose, timed as the stage `name` (and named when it raises); otherwise
    the callable itself (its repr, attributes)."""

    def __call__(self, *args, **kwargs):
        if _sample is None:
            return NamedTransform.__call__(self, *args, **kwargs)
        check = RandomCheck.due(self.name, args, kwargs, False)
        # stage(self.name), inlined: it runs for every transform of a sample
        _open.append([time.perf_counter(), 0.0])
        try:
            output = self.transform(*args, **kwargs)
        except Exception as error:
            raise transform_error(self.name, error) from error
        finally:
            if _sample is not None:
                _close(self.name)
        if check is not None:
            check.done(self.transform, output)
        return output


def _composes(dataset) -> list:
    """The torchvision Composes (v1 and v2) on the dataset's transform attributes, each once; where
    it has none, those of the dataset it wraps (its `dataset`: Delayed, a what-if's, ...), and so on
    down. Read from the modules already imported: a Compose exists only once its module is, and
    importing torchvision (torch._dynamo with it) would cost every cell without one a second or more
    of CPU."""
    composes = tuple(
        module.Compose
        for module in map(sys.modules.get, ("torchvision.transforms", "torchvision.transforms.v2"))
        if module
    )
    if not composes:  # no torchvision loaded (or none installed): nothing to find
        return []
    for _ in range(8):  # wrappers of wrappers, not a cycle
        if dataset is None:
            return []
        found = []
        for attribute in TIMED_ATTRIBUTES:
            value = getattr(dataset, attribute, None)
            if isinstance(value, composes) and all(value is not f for f in found):
                found.append(value)
        if found:
            return found
        dataset = getattr(dataset, "dataset", None)
    return []


def pipeline(dataset) -> list[tuple[str, Any, int]]:
    """The callables of the Composes found on the dataset, in order, as (stage name, compose,
    index): each named by its class, numbered where a class comes twice (a timed one by the class it
    times). The one naming of them: stage timing (time_transforms) and the stage what-ifs
    (harness.whatif) both read it."""
    steps = [
        (compose, i, t) for compose in _composes(dataset) for i, t in enumerate(compose.transforms)
    ]
    classes = [
        type(t.transform if isinstance(t, NamedTransform) else t).__name__ for _, _, t in steps
    ]
    named, seen = [], {}
    for (compose, i, _), cls in zip(steps, classes, strict=True):
        seen[cls] = seen.get(cls, 0) + 1
        named.append((f"{cls}#{seen[cls]}" if classes.count(cls) > 1 else cls, compose, i))
    return named


def _folder(dataset) -> Any:
    """The torchvision DatasetFolder (ImageFolder's base) in the dataset's chain whose `loader` (the
    function that reads and decodes a file) is the user's or torchvision's own, or None. feedbench's
    built-in images read with data.load_image, which times its read and decode itself. Read from the
    modules already imported, as _composes."""
    module = sys.modules.get("torchvision.datasets.folder")
    for _ in range(8):  # wrappers of wrappers, not a cycle
        if dataset is None or module is None:
            return None
        loader = getattr(dataset, "loader", None)
        own = loader.transform if isinstance(loader, NamedTransform) else loader
        if isinstance(dataset, module.DatasetFolder) and callable(own):
            feedbench_own = getattr(getattr(own, "func", own), "__module__", "").startswith(
                "feedbench."
            )
            return None if feedbench_own else dataset
        dataset = getattr(dataset, "dataset", None)
    return None


def time_transforms(dataset, wrapper: type[NamedTransform] = TimedTransform) -> list[str]:
    """Wrap, in place, each callable of the Composes found on the dataset (pipeline) to time it as
    its stage (wrapper TimedTransform) or only to name its errors (NamedTransform); the stage names,
    in order. A DatasetFolder's (an ImageFolder's) `loader`, which reads and decodes each file, is
    the first stage, named by its function (the default, `pil_loader` or `accimage_loader`, or the
    user's): without it the most common image dataset's decode was unattributed."""
    names = []
    folder = _folder(dataset)
    if folder is not None:
        own = (
            folder.loader.transform if isinstance(folder.loader, NamedTransform) else folder.loader
        )
        name = getattr(own, "__name__", type(own).__name__)
        if not isinstance(folder.loader, wrapper):
            folder.loader = wrapper(name, own)
        names.append(name)
    for name, compose, i in pipeline(dataset):
        # a tuple cannot be wrapped in place: a list of the same
        if isinstance(compose.transforms, tuple):
            compose.transforms = list(compose.transforms)
        transform = compose.transforms[i]
        if not isinstance(transform, wrapper):
            own = transform.transform if isinstance(transform, NamedTransform) else transform
            try:
                compose.transforms[i] = wrapper(name, own)
            # a container that takes modules only (nn.ModuleList): left untimed, unattributed
            except TypeError:
                continue
        names.append(name)
    return names


def timed(dataset: Dataset, profile: sample_profile.SampleProfile | None = None) -> Dataset:
    """The dataset with its samples and its Compose transforms timed, its first samples under
    `profile` (and their stages checked for randomness: RandomCheck)."""
    RANDOM.clear()  # an earlier cell's in this process are not this one's
    time_transforms(dataset)
    return (
        TimedStream(dataset, profile)
        if isinstance(dataset, IterableDataset)
        else TimedSamples(dataset, profile)
    )


def name_transforms(dataset: Dataset) -> Dataset:
    """The dataset, each callable of its Composes wrapped only to name the errors it raises (stage
    timing off)."""
    time_transforms(dataset, NamedTransform)
    return dataset


def unwrap(batches: Iterable, log: list) -> Iterator:
    """The user's batches, each one's timings appended to `log` (in the order the batches come).
    Once the first has come, workers started later profile nothing (harness.profile.disarm)."""
    for batch in batches:
        sample_profile.disarm()
        yield strip(batch, log)


def strip(batch, log: list | None = None):
    """The user's batch out of a StagedBatch (its timings appended to `log`); any other batch as it
    is."""
    if not isinstance(batch, StagedBatch):
        return batch
    if log is not None:
        log.append(batch.timings)
    return batch.batch


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarize_stages(log: list[dict]) -> dict | None:
    """Per stage over the batches in `log`: ms per sample (mean, median, p90, p99), share of the
    worker's time, calls.

    A sample stage's per-sample values are its own time in each sample (0 where it did not run);
    collate's are each batch's collate time over its samples. The worker's time is every sample's
    time plus every collate.
    """
    samples = sum(len(t["sample_s"]) for t in log)
    if not samples:
        return None
    names = sorted({name for t in log for name in t["stages"]})
    per_sample: dict[str, list[float]] = {name: [] for name in [*names, COLLATE]}
    calls = {name: sum(t["calls"].get(name, 0) for t in log) for name in names}
    calls[COLLATE] = len(log)
    for t in log:
        n = len(t["sample_s"])
        for name in names:
            per_sample[name].extend(t["stages"].get(name, [0.0] * n))
        per_sample[COLLATE].extend([t["collate_s"] / n] * n)
    worker_s = sum(sum(t["sample_s"]) + t["collate_s"] for t in log)
    stages = {
        name: {
            "mean_ms": sum(values) / len(values) * 1000,
            "median_ms": statistics.median(values) * 1000,
            "p90_ms": _percentile(values, 0.9) * 1000,
            "p99_ms": _percentile(values, 0.99) * 1000,
            "share": sum(values) / worker_s if worker_s > 0 else None,
            "calls": calls[name],
        }
        for name, values in per_sample.items()
    }
    return {
        "samples": samples,
        "batches": len(log),
        "worker_ms_per_sample": worker_s / samples * 1000,
        "stages": stages,
    }
