"""Cell labels for people: in words (`num_workers=2 cache_after=decode`), or short (`w=2 pin nb ev`) with the key that
reads them where more than two knobs vary; ids on disk stay as they are.

A cell id such as `model-resnet18_gpus_per_node-1_pin_memory-false_timing-events` is stable, so reruns find their
results, but it is too long for a tick label or a table column. A label here shows only the knobs that vary in the
plotted or tabulated cells: up to WORDS_UP_TO of them as `knob=value`, a person's words; more, each in a few
characters: a switch by its short name (`pin`) or `no-pin`, any other knob as `short=value` with well-known values
shortened too (`events` -> `ev`). `key_text()` lists what each short name means, shown once at the top of an
experiment and beside its figure. Torch-free: plots and the report import it.
"""

from __future__ import annotations

from ..plan.knobs import KNOBS

# Short names of the knobs people vary most (declared with each knob: Knob.short), and of the transfer plots' `pinned`
# series.
SHORT_KNOBS = {**{name: knob.short for name, knob in KNOBS.items() if knob.short}, "pinned": "pinned"}
SHORT_VALUES = {"events": "ev", "naive": "nv", "sync": "sync", "stream": "stream", "synthetic": "syn", "memory": "mem"}


def short_knob(knob: str) -> str:
    """`w` for num_workers; a knob not listed goes by its initials when it has several words, else by its name."""
    if knob in SHORT_KNOBS:
        return SHORT_KNOBS[knob]
    words = [part for part in knob.split("_") if part]
    return "".join(w[0] for w in words) if len(words) > 1 else knob


def _is_switch(value) -> bool:
    return isinstance(value, bool) or str(value).lower() in ("true", "false")


def short_value(knob: str, value) -> str:
    """One knob's part of a label: `pin` / `no-pin` for a switch, else `short=value`."""
    name = short_knob(knob)
    if _is_switch(value):
        return name if str(value).lower() == "true" else f"no-{name}"
    if isinstance(value, float) and value != value:  # NaN: a null knob (cache_after unset, say) in the summary
        value = "none"
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{name}={SHORT_VALUES.get(str(value), value)}"


WORDS_UP_TO = 2  # knobs a label names in words, `num_workers=2 cache_after=decode`; more, and it takes short codes


def word_value(knob: str, value) -> str:
    """One knob's part of a label in words: `cache_after=decode`, `pin_memory=false`, `cache_after=none` when unset."""
    if isinstance(value, float) and value != value:  # NaN: a null knob in the summary
        value = "none"
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{knob}={str(value).lower() if _is_switch(value) else value}"


def cell_label(cell, knobs: list[str]) -> str:
    """The label of one cell (a dict or a pandas row) over the knobs given: in words up to WORDS_UP_TO knobs
    (`num_workers=2 cache_after=decode`), else short (`w=2 pin nb t=ev`), read by key_text."""
    part = word_value if len(knobs) <= WORDS_UP_TO else short_value
    return " ".join(part(k, cell[k]) for k in knobs) or "(one cell)"


def key_text(knobs: list[str], cells=()) -> str:
    """The key of the labels of `cells` (dicts or rows): `w: num_workers · pin: pin_memory · t: timing · ev: events`;
    empty when the labels are in words."""
    if len(knobs) <= WORDS_UP_TO:
        return ""
    seen = {str(cell[k]) for cell in cells for k in knobs}
    parts = [f"{short_knob(k)}: {k}" for k in knobs]
    parts += [f"{short}: {value}" for value, short in SHORT_VALUES.items() if short != value and value in seen]
    if seen & {"True", "False", "true", "false"}:
        parts.append("no-x: x is false")
    return " · ".join(parts)
