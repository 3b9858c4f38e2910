"""Which functions cost a sample its time, found with no mark (knob stage_timing): a profile of the
warm-up's samples.

Stage timing names a Compose's members, a DatasetFolder's loader and `feedbench.stage` spans; the
rest of a sample is `unattributed`. To name that rest too, one process that makes samples (loader
worker 0, or the main process with `num_workers: 0`) runs its first batches' `__getitem__` (an
IterableDataset's `next()`) under the standard library's cProfile, then stops. Only warm-up batches
are profiled: worker 0 makes batches 0, W, 2W, ... of W workers (the DataLoader hands them out in
turn and delivers them in order), so its first ceil(warmup_steps / W) batches are all consumed
before the measured window opens, and the profile's overhead stays out of every reported figure.
Workers started later (a new epoch's) profile nothing: the main process disarms the profile once its
first batch arrives.

The clock is the thread's CPU time (time.thread_time): a function's own cost, which other processes
on a busy machine do not inflate (with the wall clock, a worker descheduled mid-function charged it:
34 % off at load 6); time a sample waits off the CPU (for a disk, or for a core) is named by no
function. Every other sample is profiled and the ones between are timed on the CPU alone, so each
function's ms per sample is its share of a sample's CPU time without the profiler, which slows all
Python down, not only calls (docs/performance.md, "Stage profile", says what it costs).

Attribution, so that a slow tokenizer is named rather than the `str.split` inside it: the user's
code is every function outside the standard library, torch and feedbench (a third-party package's
counts as the user's). The outermost user functions a sample reaches (its `__getitem__`, below
feedbench's wrappers and torch's Subset) are its roots; each user function a root calls, directly or
through library code only, is named with its cumulative time; a root is named with the rest of its
own (its own lines and the library calls it makes itself). Built from cProfile's caller -> callee
times: a library function reached both from a root and from a named function below it (rare) has its
calls counted for the first.

A root of a package (a `datasets` or WebDataset `__getitem__`, a framework's wrapper) is seen
through: the user's own functions it reaches through its package's code and the library's (the
transform `with_transform` calls) become roots themselves, named and walked as above, and the
package root keeps only the rest of its time. The user's own code is the code under the cell's
`python_path` folders; without them, any code outside the installed packages' folders.
"""

from __future__ import annotations

import contextlib
import cProfile
import functools
import math
import os
import sys
import sysconfig
import time
from typing import Any, Callable

from torch.utils.data import get_worker_info

SHOWN = 5  # the functions a profile names, the costliest first
# At most this many samples are made under the profile (every other one profiled), or this much CPU
# spent in the profiled ones: a profiled sample of a call-heavy tokenizer cost 24 times its own on a
# VM (docs/performance.md), and a warm-up of big batches would otherwise profile thousands.
MOST_SAMPLES, MOST_CPU_S = 64, 2.0
_active: SampleProfile | None = None  # this process's profile while it runs
_armed: SampleProfile | None = None  # the profile made in this (the main) process, for disarm()


class SampleProfile:
    """cProfile over every other sample of this process's first `batches` batches, the samples
    between timed on the CPU only; `worker`: the loader worker that profiles (0), or None for the
    main process (no workers)."""

    def __init__(self, batches: int, worker: int | None, own: tuple[str, ...] = ()):
        self.batches, self.worker = batches, worker
        # the user's own folders (python_path), where a package root is seen through (attribute)
        self.own = tuple(os.path.realpath(path) + os.sep for path in own)
        self.cpu_s = [0.0, 0.0]  # CPU seconds of the samples made [as they are, under the profiler]
        self.made = [0, 0]  # and how many
        self.counted = 0  # samples made when the last batch was collated
        self.profiler: cProfile.Profile | None = None
        # a sample being made and timed on the CPU alone, not profiled: feedbench's own checks of it
        # (harness.stages' random-stage check) run there, aside (their CPU time not counted)
        self.timed_only = False
        self.aside_s = 0.0

    def __getstate__(self) -> dict:  # a spawned worker starts its own profiler
        return {**self.__dict__, "profiler": None}

    def done(self) -> bool:
        return self.batches <= 0 or sum(self.made) >= MOST_SAMPLES or self.cpu_s[True] >= MOST_CPU_S

    def wrap(self, make: Callable[[], Any]) -> Callable[[], Any]:
        """make, profiled or timed while this process has batches left to profile; else make
        itself."""
        if self.done() or (get_worker_info().id if get_worker_info() else None) != self.worker:
            return make
        return functools.partial(self._run, make)

    def _run(self, make: Callable[[], Any]) -> Any:
        global _active
        _active = self
        profiled = sum(self.made) % 2 == 0
        start = time.thread_time()
        if profiled:
            if self.profiler is None:
                self.profiler = cProfile.Profile(time.thread_time)
            try:
                self.profiler.enable()
            except ValueError:  # another profiler holds the interpreter (Python 3.12+): no profile
                self.batches, _active = 0, None
                return make()
        aside, self.timed_only = self.aside_s, not profiled
        try:
            return make()
        finally:
            if profiled:
                self.profiler.disable()
            self.timed_only = False
            self.cpu_s[profiled] += time.thread_time() - start - (self.aside_s - aside)
            self.made[profiled] += 1

    @contextlib.contextmanager
    def aside(self):
        """Work of feedbench's own inside a sample timed on the CPU alone: its CPU time is not the
        sample's."""
        start = time.thread_time()
        try:
            yield
        finally:
            self.aside_s += time.thread_time() - start

    def batch_made(self) -> dict | None:
        """A batch was collated: the profile's result when that was its last batch, else None."""
        if sum(self.made) == self.counted:  # no sample of this batch was made here
            return None
        self.counted = sum(self.made)
        self.batches -= 1
        if not self.done():
            return None
        self.batches = 0
        return self.result()

    def result(self) -> dict:
        """{samples, process, cpu_ms_per_sample, slowdown, functions: [{name, share, ms}]}, the
        costliest first.

        A function's share is of the profiled samples' CPU time; its ms per sample is that share of
        a sample's CPU time as it is (the samples timed between the profiled ones): under a profiler
        Python runs every line slower (1.6 times a busy loop's on Python 3.11), not only each call,
        so the profile's own times overstate.
        """
        times, total = attribute(self.profiler.getstats(), self.own)
        self.profiler = None
        profiled_ms = self.cpu_s[True] / self.made[True] * 1000
        plain_ms = self.cpu_s[False] / self.made[False] * 1000 if self.made[False] else profiled_ms
        named = sorted(times.items(), key=lambda item: -item[1])[:SHOWN]
        return {
            "samples": self.made[True],
            "process": "main" if self.worker is None else f"worker {self.worker}",
            "cpu_ms_per_sample": plain_ms,
            "slowdown": profiled_ms / plain_ms if plain_ms > 0 else None,
            "functions": [
                {"name": name, "share": t / total, "ms": t / total * plain_ms}
                for name, t in named
                if total > 0
            ],
        }


def sample_profile(cell) -> SampleProfile | None:
    """The cell's profile: its first warm-up batches in worker 0 (or the main process without
    workers); None where none can stay out of the measured window: no warm-up, or batches delivered
    out of order (knob in_order)."""
    global _armed, _active
    # a profile of an earlier cell in this process that died mid-way is not this one's
    _armed = _active = None
    if cell.warmup_steps < 1 or not cell.in_order:
        return None
    _armed = SampleProfile(
        math.ceil(cell.warmup_steps / max(1, cell.num_workers)),
        0 if cell.num_workers else None,
        tuple(cell.python_path or ()),
    )
    return _armed


def profiled(profile: SampleProfile | None, make: Callable[[], Any]) -> Callable[[], Any]:
    """make, under the profile where this process profiles it (SampleProfile.wrap); make itself
    otherwise."""
    return make if profile is None else profile.wrap(make)


def checking() -> SampleProfile | None:
    """This process's profile while it makes a warm-up sample timed on the CPU alone (every other
    one: never a profiled one, whose profile a second call would skew), else None: the samples
    harness.stages checks its stages' randomness on, aside (SampleProfile.aside)."""
    return _active if _active is not None and _active.timed_only else None


def batch_made() -> dict | None:
    """Called by the timed collate: the finished profile of this process, once, on the batch that
    ends it."""
    global _active
    if _active is None:
        return None
    found = _active.batch_made()
    if found is not None:
        _active = None
    return found


def disarm() -> None:
    """The main process got its first batch: workers started from now on (a new epoch's) profile
    nothing."""
    global _armed
    if _armed is not None and _armed.worker is not None:
        _armed.batches = 0
    _armed = None


def found(log: list[dict]) -> dict | None:
    """The profile among a cell's batch timings (harness.stages: it rides with the batch that ended
    it), or None."""
    return next((t["profile"] for t in log if t.get("profile")), None)


@functools.lru_cache(maxsize=None)
def _folders() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(torch's and feedbench's folders, the installed packages' folders, the standard library's
    folders)."""
    import torch

    paths = sysconfig.get_paths()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the feedbench package

    def folders(*paths: str) -> tuple[str, ...]:
        return tuple(os.path.realpath(p) + os.sep for p in paths)

    return (
        folders(os.path.dirname(os.path.abspath(torch.__file__)), here),
        folders(paths["purelib"], paths["platlib"]),
        folders(paths["stdlib"], paths["platstdlib"]),
    )


@functools.lru_cache(maxsize=4096)
def is_library(filename: str) -> bool:
    """Code of the standard library, torch or feedbench (builtins and frozen modules too): never
    named itself. An installed package's is the user's (the standard library's folder may hold
    site-packages: it is asked first)."""
    if not filename or filename.startswith("<"):
        return True
    path = os.path.realpath(filename)
    ours, packages, stdlib = _folders()
    if path.startswith(ours):
        return True
    return not path.startswith(packages) and path.startswith(stdlib)


@functools.lru_cache(maxsize=4096)
def is_installed(filename: str) -> bool:
    """Code of the standard library, torch, feedbench or an installed package: not the user's own
    script (where a command built its DataLoader: harness.inloop)."""
    if not filename or filename.startswith("<"):
        return True
    return os.path.realpath(filename).startswith(tuple(p for f in _folders() for p in f))


def is_user(code) -> bool:
    return not isinstance(code, str) and not is_library(code.co_filename)


def is_own(code, own: tuple[str, ...]) -> bool:
    """The user's own code, not a package's: under the `own` folders (python_path), or, without
    them, user code outside the installed packages' folders."""
    if not is_user(code):
        return False
    path = os.path.realpath(code.co_filename)
    return path.startswith(own) if own else not path.startswith(_folders()[1])


def _through_packages(roots: dict, calls: dict, own: tuple[str, ...]) -> tuple[dict, set]:
    """The roots with each package root seen through: the user's own functions it reaches through
    package and library code become roots of their own, and it keeps the rest of its time; and the
    package roots so seen through."""
    found: dict = {}
    seen = set()
    for root, root_time in roots.items():
        below = (
            []
            if is_own(root, own)
            else _reached([root], calls, set(), set(), lambda code: is_own(code, own))
        )
        for code, t in below:
            found[code] = found.get(code, 0.0) + t
        seen.update([root] if below else [])
        rest = root_time - sum(t for _, t in below)
        found[root] = found.get(root, 0.0) + max(rest, 0.0)
    return found, seen


def attribute(stats: list, own: tuple[str, ...] = ()) -> tuple[dict[str, float], float]:
    """{module:qualname: CPU seconds} of the named functions (see the module's docstring), and the
    profiled total; `own`: the user's own folders."""
    calls = {e.code: [(s.code, s.totaltime) for s in (e.calls or ())] for e in stats}
    callees = {code for edges in calls.values() for code, _ in edges}
    # the profiled samples' outermost calls: feedbench's
    tops = [e.code for e in stats if e.code not in callees]
    total = sum(e.totaltime for e in stats if e.code not in callees)
    roots: dict = {}
    for code, t in _reached(tops, calls, set(), set()):
        roots[code] = roots.get(code, 0.0) + t
    roots, seen_through = _through_packages(roots, calls, own)
    times: dict = {}
    visited: set = set()  # library code reached from one root is not walked again from another
    for root, root_time in sorted(roots.items(), key=lambda item: -item[1]):
        # a package root seen through keeps its rest: its package callees are not walked again
        if root in seen_through:
            times[root] = times.get(root, 0.0) + root_time
            continue
        below = _reached([root], calls, set(roots), visited)
        for code, t in below:
            times[code] = times.get(code, 0.0) + t
        times[root] = times.get(root, 0.0) + max(0.0, root_time - sum(t for _, t in below))
    names = _names({code.co_filename for code in times})
    named: dict[str, float] = {}
    for code, t in times.items():
        name = name_of(code, names)
        named[name] = named.get(name, 0.0) + t
    return named, total


def _reached(
    starts: list, calls: dict, roots: set, visited: set, stop: Callable = is_user
) -> list[tuple[Any, float]]:
    """The calls into user code (not a root) from `starts`, directly or through library code only
    (each library function walked once: `visited` grows), as (code, cumulative seconds); `stop`:
    what counts as the user code it stops at (is_own: the user's own, through packages too)."""
    reached, stack = [], list(starts)
    visited.update(starts)
    while stack:
        for code, t in calls.get(stack.pop(), ()):
            if stop(code):
                if code not in roots:
                    reached.append((code, t))
            elif code not in visited:
                visited.add(code)
                stack.append(code)
    return reached


def _names(files: set[str]) -> dict[str, str]:
    """{real path of a module's file: its name}, for the imported modules of these files."""
    wanted = {os.path.basename(f) for f in files}
    names = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and os.path.basename(path) in wanted and name != "__mp_main__":
            names[os.path.realpath(path)] = name
    return names


def name_of(code, names: dict[str, str]) -> str:
    """module:qualname of a code object (its file's name where no imported module has it)."""
    module = names.get(os.path.realpath(code.co_filename))
    if module is None:
        module = os.path.splitext(os.path.basename(code.co_filename))[0]
    return f"{module}:{code.co_qualname}"
