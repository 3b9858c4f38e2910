"""Random stages, found by what they do: a stage whose output on the same input differs between
two calls (#49). Checked in the warm-up samples the profile times on the CPU alone (RandomCheck,
under the harness's own seed, no sample drawn for it) and by the stage what-ifs (differs): a cache
at or after a random stage would freeze the augmentation."""

from __future__ import annotations

import contextlib
import copy
import inspect
import random
from collections.abc import Mapping
from typing import Any, Callable, Iterable

import numpy
import torch

from . import profile as sample_profile

# Stage name -> whether it was found random (RandomCheck) in this process's warm-up samples; a
# stage checked and never found random is False.
RANDOM: dict[str, bool] = {}


@contextlib.contextmanager
def random_state_kept():
    """Python's, NumPy's and torch's CPU random state as they were before: what runs inside draws
    none of the cell's."""
    state, numpy_state = random.getstate(), numpy.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(state)
        numpy.random.set_state(numpy_state)


def same(a: Any, b: Any, depth: int = 0) -> bool | None:
    """Whether two outputs of a stage are equal: tensors, arrays and images by their values,
    containers item by item, plain objects by their attributes; None where it cannot tell."""
    if a is b:
        return True
    if type(a) is not type(b) or depth > 20:
        return False if type(a) is not type(b) else None
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, numpy.ndarray):
        return a.shape == b.shape and bool(numpy.array_equal(a, b))
    if hasattr(a, "getbands") and hasattr(a, "tobytes"):  # a PIL image
        return a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and _all_same(zip(a, b, strict=True), depth)
    if isinstance(a, Mapping):
        keys = list(a)
        return keys == list(b) and _all_same(((a[k], b[k]) for k in keys), depth)
    if type(a).__eq__ is object.__eq__:  # no equality of its own: its attributes
        state = getattr(a, "__dict__", None)
        return same(state, b.__dict__, depth + 1) if isinstance(state, dict) else None
    try:
        return bool(a == b)
    except Exception:  # an equality that cannot say (an array's, elementwise)
        return None


def _all_same(pairs: Iterable, depth: int) -> bool | None:
    found = [same(x, y, depth + 1) for x, y in pairs]
    return False if False in found else (None if None in found else True)


class RandomCheck:
    """Whether a stage is random, found by what it does: its output on the same input differs
    between two calls. Made in this process's warm-up samples that the profile times on the CPU
    alone (harness.profile.checking), under the harness's own seed: the stage runs as it does, then
    once more on a copy of its input, made before, with the random state kept (what follows draws as
    it would have), its time aside. No sample is drawn for it; a stage found random is not checked
    again. A decorated method's `self` is not copied."""

    def __init__(self, name: str, profile, copied: tuple):
        self.name, self.profile, self.copied = name, profile, copied

    @classmethod
    def due(cls, name: str, args: tuple, kwargs: dict, own_self: bool) -> RandomCheck | None:
        """The check of this call of the stage, where one is due: in a sample the profile times on
        the CPU alone, of a stage not yet found random, with an input that can be copied."""
        profile = sample_profile.checking()
        if profile is None or RANDOM.get(name):
            return None
        with profile.aside():
            head, rest = (args[:1], args[1:]) if own_self else ((), args)
            try:
                return cls(name, profile, (head + copy.deepcopy(rest), copy.deepcopy(kwargs)))
            except Exception:  # an input that cannot be copied: not checked
                return None

    def done(self, call: Callable, output: Any) -> None:
        """The stage gave `output`: call it again on the copied input and compare."""
        with self.profile.aside(), random_state_kept():
            try:
                found = same(output, call(*self.copied[0], **self.copied[1]))
            except Exception:  # a second call that fails says nothing of the first
                found = None
        if found is not None:
            RANDOM[self.name] = RANDOM.get(self.name, False) or not found


def differs(call: Callable, args: tuple, own_self: bool = False, tries: int = 2) -> bool | None:
    """RandomCheck's test outside a timed sample (the stage what-ifs' first pass and sampled call):
    whether call(*args) gives another output on another call with the same input (copies of it, a
    method's `self` not copied), up to `tries` more calls, the random state kept; None where it
    cannot tell."""
    head, rest = (args[:1], args[1:]) if own_self else ((), args)
    found = None
    with random_state_kept():
        try:
            first = call(*head, *copy.deepcopy(rest))
            for _ in range(tries):
                found = same(first, call(*head, *copy.deepcopy(rest)))
                if found is False:
                    return True
        except Exception:  # an input that cannot be copied, a call that fails: it cannot tell
            return None
    return None if found is None else False


def takes_self(function: Callable) -> bool:
    """Whether a function's first parameter is a method's `self` (or `cls`)."""
    try:
        parameters = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return False
    return bool(parameters) and parameters[0] in ("self", "cls")
