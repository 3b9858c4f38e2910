"""A planned cell: the knobs it sets, where each came from in the config, and its id.

The leaf under the planning: matrix expands experiments into planned cells, ceilings derives the
cells that bound them, and both name a cell and compare knobs the same way here.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from .knobs import KNOBS

# Keys of `defaults` that are not knobs.
NOT_KNOBS = ("repeats",)
# Knobs whose entries vary like knobs: an axis `dataset_args.crop: [160, 224]` sets
# dataset_args["crop"].
ARG_KNOBS = ("dataset_args", "model_args", "optimizer_args", "loss_args")
MAX_ID_LENGTH = 200
# Snakemake refuses a wildcard value that ends in a part repeated this often
# (snakemake.io.PeriodicityDetector).
PERIODIC_REPEATS = 20


@dataclass(frozen=True)
class PlannedCell:
    """One point of an experiment: the knobs it sets, where each came from in the config, and the
    harness's parsed cell (feedbench.core.cell.Cell) once checked, so nothing parses it again."""

    experiment: str
    id: str
    knobs: dict[str, Any]
    sources: dict[str, str] = field(repr=False)
    baseline: bool = False
    parsed: Any = field(default=None, repr=False, compare=False)

    def labelled(self, repeat: int) -> dict[str, Any]:
        """The knobs plus the labels the harness copies into its result (so the baseline reaches the
        summary)."""
        labels = {
            "experiment": self.experiment,
            "cell": self.id,
            "repeat": repeat,
            "baseline": self.baseline,
        }
        return {**self.knobs, **labels}


def arg_key(name: Any) -> bool:
    """`dataset_args.<name>`, `model_args.<name>`, `optimizer_args.<name>` or `loss_args.<name>`:
    one argument of a factory, as an axis or a knob."""
    return (
        isinstance(name, str)
        and name.partition(".")[0] in ARG_KNOBS
        and bool(name.partition(".")[2])
    )


def default_of(name: str) -> Any:
    """A knob's default; an argument (arg_key) has none: None."""
    return None if arg_key(name) else KNOBS[name].default


def fold_args(
    knobs: dict[str, Any], sources: dict[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """`dataset_args.crop: 160` into `dataset_args: {..., crop: 160}`, the knob's source the last
    argument's path."""
    knobs, sources = dict(knobs), dict(sources)
    for name in [n for n in knobs if arg_key(n)]:
        knob, _, key = name.partition(".")
        base = knobs.get(knob)
        knobs[knob] = {**(base if isinstance(base, dict) else {}), key: knobs.pop(name)}
        sources[knob] = sources.pop(name, sources.get(knob, knob))
    return knobs, sources


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return "+".join(format_value(v) for v in value)
    return str(value)


def periodic(text: str) -> bool:
    """Whether Snakemake would take `text` as a wildcard value for a cyclic dependency
    (PeriodicWildcardError)."""
    from snakemake.io import PeriodicityDetector  # the workflow's own rule, not a copy of it

    return PeriodicityDetector(min_repeat=PERIODIC_REPEATS).is_periodic(text) is not None


def cell_id(knobs: dict[str, Any], keys: list[str]) -> str:
    """`<knob>-<value>_...` for `keys` (a knob left out shows its default), sanitised for a path;
    `base` when nothing varies.

    An id too long for a file name, or one Snakemake would refuse as periodic, is cut and ends in
    `~<digest>`: `~` occurs nowhere else in an id, so no part of its end can repeat.
    """
    if not keys:
        return "base"
    text = "_".join(
        f"{key}-{format_value(knobs[key] if key in knobs else default_of(key))}" for key in keys
    )
    text = re.sub(r"[^A-Za-z0-9._+-]+", "+", text)
    if len(text) > MAX_ID_LENGTH or periodic(text):
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        text = f"{text[: MAX_ID_LENGTH - 13]}~{digest}"
    return text


def same_value(a: Any, b: Any) -> bool:
    """Equal, and a bool only equals a bool (True == 1 in Python, not in a config)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def same_key(value: Any) -> str:
    """Equal for values that make the same cell once the knob table has normalised them (1 and 1.0
    for a float knob)."""
    return json.dumps(value, sort_keys=True, default=str)


def effective(knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs as the harness reads them, less those at their default: equal for cells that run
    the same."""
    normalised = {name: KNOBS[name].check(value) for name, value in knobs.items()}
    return {name: value for name, value in normalised.items() if value != KNOBS[name].default}
