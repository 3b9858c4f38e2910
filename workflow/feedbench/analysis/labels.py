"""Cell labels for people, in the knobs' own words (`num_workers=2 cache_after=decode`); ids on disk
stay as they are.

A cell id such as `model-resnet18_gpus_per_node-1_pin_memory-false_timing-events` is stable, so
reruns find their results, but it is too long for a tick label or a table column. A label here names
only the knobs that vary in the plotted or tabulated cells, each as `knob=value`, however many vary:
never a code the reader must look up in a key. A knob's name is never shortened; a value longer than
VALUE_CHARS (a path, a dict of dataset_args) is cut in its middle, keeping its start and its end, to
the fewest characters that still tell it from the knob's other values, so two cells never share a
label. Where a label is too wide for its bar, the plots put each knob on a line of its own
(analysis.plots.fit_ticks). Torch-free: plots and the report import it.
"""

from __future__ import annotations

# a value longer than this is cut in its middle (`results/data/i…/images`), as unique as needed
VALUE_CHARS = 24
CUT = "…"


def _is_switch(value) -> bool:
    return isinstance(value, bool) or str(value).lower() in ("true", "false")


def value_text(value) -> str:
    """A knob's value as a label shows it, whole: `none` when unset (NaN in the summary), `2` for
    2.0, `false`."""
    # NaN: a null knob (cache_after unset, say) in the summary
    if isinstance(value, float) and value != value:
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).lower() if _is_switch(value) else str(value)


def _cut(text: str, chars: int) -> str:
    if len(text) <= chars:
        return text
    head = (chars - len(CUT) + 1) // 2
    return text[:head] + CUT + text[len(text) - (chars - len(CUT) - head) :]


def shown_values(texts) -> dict[str, str]:
    """Each distinct value text of one knob -> the text its labels show: whole up to VALUE_CHARS,
    else cut in the middle, widened until no two distinct values read the same."""
    distinct = list(dict.fromkeys(texts))
    for chars in range(VALUE_CHARS, max((len(t) for t in distinct), default=0) + 1):
        shown = {text: _cut(text, chars) for text in distinct}
        if len(set(shown.values())) == len(distinct):
            return shown
    return {text: text for text in distinct}


def cell_labels(cells, knobs: list[str]) -> list[str]:
    """The labels of `cells` (dicts or pandas rows) over the knobs given, in words: `num_workers=2
    cache_after=decode`. Cells that differ in a knob given never share a label."""
    cells = list(cells)
    shown = {k: shown_values(value_text(cell[k]) for cell in cells) for k in knobs}
    return [
        " ".join(f"{k}={shown[k][value_text(cell[k])]}" for k in knobs) or ONE_CELL
        for cell in cells
    ]


def cell_label(cell, knobs: list[str]) -> str:
    """One cell's label on its own (a panel's title, say): as cell_labels gives it."""
    return cell_labels([cell], knobs)[0]


ONE_CELL = "(one cell)"


def words(cell) -> str:
    """A cell of a verdict's sentence in words: its label (`label`, as cell_labels gives it), its
    id only where it has none; an experiment's only cell is "its only cell"."""
    label = cell.get("label") if hasattr(cell, "get") else None
    if label == ONE_CELL:
        return "its only cell"
    return label if isinstance(label, str) and label else str(cell.get("cell"))
