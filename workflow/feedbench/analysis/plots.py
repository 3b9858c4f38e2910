"""One SVG per experiment from the summary, drawn as its `plot` spec asks.

A spec is {x, y, hue, kind} (or a list of them: one axes each, stacked):
    line     y against x, one line per series, error bars from the repeats;
    bar      grouped bars, one bar per series at each x, error bars from the repeats;
    phases   one stacked bar per cell: median ms of wait, h2d, fwd, bwd, opt
             (y is not used), with the median step time and its interval as a marker;
    heatmap  median y as colour, x along the columns, the series along the rows.
A series is the hue knob plus every other knob that varies in the experiment
(except x), so cells are never pooled silently. Points are medians of the
repeats, error bars their 95 % interval (see verdict.py).

Labels that fit, at any matrix size. Only knobs that vary within the plotted data label anything, as
analysis.labels names them: in words, however many vary (`num_workers=2 cache_after=decode`, a knob
a line when too wide; a long value cut in its middle, never the knob's name), and no two bars or
series share a label. How long labels fit, per kind:
    phases   one bar per cell, so as many labels as cells: they stand vertical under their bars when
             they do not fit side by side (a legend would make the reader match dozens of colours,
             and facets would split the one comparison the plot exists for), and the figure widens
             with the number of cells;
    line/bar the series go to a legend outside the axes (it never hides a point); the x ticks are the levels of one
             knob and turn vertical only when they do not fit side by side;
    line     above SERIES_LIMIT lines one axes is a tangle a legend cannot untie: the plot becomes
             small multiples, one axes per level of one knob of the series (the one with the fewest
             levels, never the hue), side by side with a shared y axis, the legend once at the right
             (bars stay grouped: side-by-side bars do not cross, so they stay readable with many
             series);
    heatmap  series label the rows (horizontal text has room there), levels of x the columns,
             vertical when needed.
Titles are wrapped to the figure's width, never clipped.

The stage profile (`stage_figure`, knob stage_timing) is no kind: the report draws it beside the
experiment's own plot whenever its cells timed their stages, one stacked bar per cell
(analysis.stages gives the numbers).

Transfer experiments (every cell scenario=transfer) are plotted from the
per-size columns: GB/s against copy size, one line per pinning (and cell),
whatever x and y their spec names (say x: size_bytes, y: gb_per_s, hue: pinned).

User text (titles, column names, knob values in ticks, legends and series labels) goes through
`plain`: a `$` would otherwise start matplotlib's math parser, and a title like `Rate $\\nope$`
would stop the plot rule. `plain_text()` keeps TeX off (`text.usetex`) while a figure is built and
saved, whatever the user's matplotlibrc.

Figures are built with matplotlib's object API (no pyplot state) and saved
with text as SVG <text> (escaped by matplotlib, no font files) and a hash salt
per experiment, so element ids differ between the SVGs of one report and the
output is the same from run to run.
"""  # noqa: E501

from __future__ import annotations

import contextlib
import io
import os
import re
import textwrap

import matplotlib
import pandas as pd
from matplotlib.figure import Figure

from ..core.knobs import KNOBS
from ..core.metrics import PHASES
from ..core.result import atomic_write
from .aggregate import as_requested
from .labels import cell_label, cell_labels
from .stages import UNATTRIBUTED, names, profile
from .verdict import interval, knob_texts, natural_order, objective, varying_knobs

KINDS = ("line", "bar", "phases", "heatmap")
PHASE_COLOURS = {
    "wait": "#d62728",
    "device_prep": "#8c564b",
    "h2d": "#ff7f0e",
    "fwd": "#1f77b4",
    "bwd": "#2ca02c",
    "opt": "#9467bd",
    "gpu_idle": "#7f7f7f",
}
TRANSFER_COLUMN = re.compile(r"transfer_gb_per_s_(pinned|pageable)_(\d+)$")

UNITS = [  # (pattern of a column name, axis label); the first match wins
    (r"samples_per_s$", "samples/s"),
    (r"tokens_per_s$", "tokens/s"),
    (r"gb_per_s", "GB/s"),
    (r"_pct(_mean)?$", "%"),
    (r"_share$", "share of step"),
    (r"_ms(_median|_p10|_p90)?$", "ms"),
    (r"_mb(_mean)?$", "MB"),
    (r"_s$", "s"),
    (r"^size_bytes$", "bytes"),
]


def plain(text) -> str:
    """User text as matplotlib shows it literally: every `$` escaped, so no math parsing starts.

    Escaping, not Text(parse_math=False): tick labels and legend entries are made at draw time,
    where a property set on today's Text objects does not reach, while our own number formatters
    still need math text.
    """
    return str(text).replace("$", r"\$")


@contextlib.contextmanager
def plain_text():
    """Build or save figures with TeX off: a user's matplotlibrc with text.usetex would run LaTeX on
    knob values."""
    with matplotlib.rc_context({"text.usetex": False}):
        yield


def axis_label(column: str) -> str:
    """'samples_per_s' -> 'samples per s [samples/s]': the name and its unit (plain text)."""
    for pattern, unit in UNITS:
        if re.search(pattern, column):
            return plain(f"{column.replace('_', ' ')} [{unit}]")
    return plain(column.replace("_", " "))


def transfer_long(rows: pd.DataFrame) -> pd.DataFrame:
    """Per-size transfer columns -> one row per cell, repeat, size and pinning (size_bytes, pinned,
    gb_per_s)."""
    keep = [c for c in rows.columns if not TRANSFER_COLUMN.match(c)]
    long = rows.melt(
        id_vars=keep,
        value_vars=[c for c in rows.columns if TRANSFER_COLUMN.match(c)],
        var_name="series_column",
        value_name="gb_per_s",
    )
    parts = long["series_column"].str.extract(TRANSFER_COLUMN)
    long["pinned"] = parts[0] == "pinned"
    long["size_bytes"] = parts[1].astype(int)
    return long.drop(columns="series_column").dropna(subset=["gb_per_s"])


def _bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:g} {unit}"
        size /= 1024
    return f"{size:g} TiB"


def _ordered(values) -> list:
    """Distinct values, numerically sorted when they all are numbers, else in first-seen order."""
    distinct = list(dict.fromkeys(v for v in values if not pd.isna(v)))
    try:
        return sorted(distinct, key=float)
    except (TypeError, ValueError):
        return distinct


def _series(data: pd.DataFrame, x: str, hue: str | None, knobs: list[str]) -> list[str]:
    keys = [hue] if hue and hue in data else []
    return keys + [
        k for k in knobs if k not in (x, hue) and k in data and knob_texts(data[k], k).nunique() > 1
    ]


def _stats(data: pd.DataFrame, keys: list[str], x: str, y: str) -> pd.DataFrame:
    """Median and interval of y over repeats for each series and x."""
    rows = []
    for key, group in data.groupby(keys + [x], sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        stats = interval(group[y])
        if stats.n:
            rows.append(
                {
                    **dict(zip(keys + [x], key, strict=True)),
                    "median": stats.median,
                    "below": stats.below,
                    "above": stats.above,
                }
            )
    frame = pd.DataFrame(rows)
    return frame.sort_values(keys + [x], key=natural_order, kind="stable") if rows else frame


def _labels(keys: list[str], series: list) -> list[str | None]:
    """The label of each series (a tuple of the keys' values), in words (analysis.labels); None
    without keys."""
    cells = [dict(zip(keys, v if isinstance(v, tuple) else (v,), strict=True)) for v in series]
    return [plain(label) for label in cell_labels(cells, keys)] if keys else [None] * len(series)


WIDEST_IN = 12.0  # the widest a stage figure grows to give its labels room side by side
# inches of vertical tick labels a figure's height leaves room for (18 characters at 8 pt)
LABEL_ROOM_IN = 1.2
# a character's mean width in ems of DejaVu Sans, a little generous: estimates err on the safe side
CHAR_WIDTH = 0.62


def fit_ticks(
    ax, positions, labels: list[str], slot_in: float, fontsize: float = 8.0, axis: str = "x"
) -> None:
    """Set tick labels; on the x axis a label too wide for its slot (inches) puts each knob on a
    line of its own, and the labels turn vertical when even that does not fit."""

    def width(texts: list[str]) -> float:
        return (
            max((len(line) for text in texts for line in text.split("\n")), default=0)
            * CHAR_WIDTH
            * fontsize
            / 72
        )

    stacked = [label.replace(" ", "\n") for label in labels]
    if axis == "x" and width(labels) > 0.9 * slot_in and width(stacked) <= 0.9 * slot_in:
        labels = stacked
    rotation = 90 if axis == "x" and width(labels) > 0.9 * slot_in else 0
    # vertical labels longer than the room a figure leaves them grow it, so the axes keep their
    # height
    if rotation:
        page, spec = _page(ax), ax.get_subplotspec()
        # Once per row of panels side by side: what the figure grew by for each row's labels is kept
        # on it.
        grown = page.__dict__.setdefault("_grown_for_labels", {})
        row, needed = (
            (id(spec.get_gridspec()), spec.rowspan.start),
            max(width(labels) - LABEL_ROOM_IN, 0),
        )
        if needed > grown.get(row, 0.0):
            page.set_figheight(page.get_figheight() + needed - grown.get(row, 0.0))
            grown[row] = needed
    if axis == "x":
        ax.set_xticks(positions, labels, fontsize=fontsize, rotation=rotation)
    else:
        ax.set_yticks(positions, labels, fontsize=fontsize)


def _page(ax) -> Figure:
    """The whole figure an axes is drawn on, also when the axes sits in a subfigure (small
    multiples)."""
    return ax.figure.figure


def slot(ax, count: int) -> float:
    """Inches of axes width per category, from the axes' place in its grid (before the layout
    shrinks it a little)."""
    return ax.get_position().width * _page(ax).get_figwidth() / max(count, 1)


def wrap(text: str, width_in: float, fontsize: float) -> str:
    """Text wrapped to lines that fit `width_in` inches at `fontsize` points."""
    return "\n".join(
        textwrap.wrap(str(text), max(int(width_in * 72 / (CHAR_WIDTH * fontsize)), 10))
    ) or str(text)


def _draw_lines_or_bars(ax, stats: pd.DataFrame, keys: list[str], x: str, kind: str) -> None:
    xs = _ordered(stats[x])
    numeric = kind == "line" and all(
        pd.api.types.is_number(v) and not pd.api.types.is_bool(v) for v in xs
    )
    position = {v: (float(v) if numeric else i) for i, v in enumerate(xs)}
    groups = list(stats.groupby(keys, sort=False, dropna=False)) if keys else [((), stats)]
    width = 0.8 / max(len(groups), 1)
    names = _labels(keys, [values for values, _ in groups])
    for i, ((_, group), name) in enumerate(zip(groups, names, strict=True)):
        group = group.assign(_pos=group[x].map(position)).sort_values("_pos")
        yerr = [group["below"], group["above"]]
        if kind == "line":
            ax.errorbar(
                group["_pos"], group["median"], yerr=yerr, marker="o", capsize=3, label=name
            )
        else:
            offset = (i - (len(groups) - 1) / 2) * width
            ax.bar(
                group["_pos"] + offset,
                group["median"],
                width=width,
                yerr=yerr,
                capsize=3,
                label=name,
            )
    if not numeric:
        fit_ticks(ax, range(len(xs)), [plain(v) for v in xs], slot(ax, len(xs)))
    elif len(xs) <= 12:
        ax.set_xticks([float(v) for v in xs], [f"{v:g}" for v in xs])
    if x == "size_bytes":
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [_bytes(v) for v in xs], rotation=30)


def _median_marks(ax, stats: list, label: str) -> None:
    """A black mark at each bar's median over the repeats, with its 95 % interval (none where
    nothing finished)."""
    ax.errorbar(
        range(len(stats)),
        [s.median if s.n else float("nan") for s in stats],
        yerr=[[s.below for s in stats], [s.above for s in stats]],
        marker="_",
        markersize=18,
        color="black",
        linestyle="none",
        capsize=3,
        label=label,
    )


def _draw_phases(ax, data: pd.DataFrame, keys: list[str], x: str) -> None:
    order = [x] + keys
    ranks = {k: {v: i for i, v in enumerate(_ordered(data[k]))} for k in order}
    cells = sorted(
        data.groupby(order, sort=False, dropna=False),
        key=lambda item: [ranks[k].get(v, -1) for k, v in zip(order, item[0], strict=True)],
    )
    present = [p for p in PHASES if f"{p}_ms" in data and data[f"{p}_ms"].notna().any()]
    bottoms = [0.0] * len(cells)
    # One timeline per bar: a GPU cell under events timing stacks its GPU's idle time, not the
    # host's wait, which overlaps its compute (feedbench.core.metrics.stall_phase).
    on_gpu = ["gpu_idle_ms" in group and group["gpu_idle_ms"].notna().any() for _, group in cells]
    for phase in present:
        heights = [
            float(group[f"{phase}_ms"].median())
            if group[f"{phase}_ms"].notna().any() and not (phase == "wait" and gpu)
            else 0.0
            for (_, group), gpu in zip(cells, on_gpu, strict=True)
        ]
        ax.bar(range(len(cells)), heights, bottom=bottoms, color=PHASE_COLOURS[phase], label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    _median_marks(ax, [interval(group["step_ms_median"]) for _, group in cells], "step (median)")
    labels = _labels(order, [values for values, _ in cells])
    fit_ticks(ax, range(len(cells)), labels, slot(ax, len(cells)))
    ax.set_ylabel("median time per step [ms]")
    ax.set_ylim(bottom=0)


def _draw_heatmap(ax, stats: pd.DataFrame, keys: list[str], x: str, y: str) -> None:
    rows = (
        _labels(keys, [tuple(r) for r in stats[keys].itertuples(index=False)]) if keys else plain(y)
    )
    stats = stats.assign(_row=rows)
    grid = stats.pivot_table(index="_row", columns=x, values="median", aggfunc="first", sort=False)
    grid = grid.reindex(columns=_ordered(grid.columns))
    values = grid.to_numpy(dtype=float)
    image = ax.imshow(values, aspect="auto", cmap="viridis")
    fit_ticks(ax, range(grid.shape[1]), [plain(c) for c in grid.columns], slot(ax, grid.shape[1]))
    fit_ticks(ax, range(grid.shape[0]), list(grid.index), 0, axis="y")
    for (i, j), value in pd.DataFrame(values).stack().items():
        light = image.norm(value) > 0.5  # viridis is light at the top: dark text there
        ax.text(
            j,
            i,
            f"{value:.3g}",
            ha="center",
            va="center",
            color="black" if light else "white",
            fontsize="small",
        )
    ax.figure.colorbar(image, ax=ax, label=axis_label(y))
    ax.set_xlabel(axis_label(x))


def rate_column(rows: pd.DataFrame, y: str) -> str:
    """The column a spec's y draws: samples_per_s (the default) becomes tokens_per_s where the
    experiment counts tokens, so its axis is in the unit of the rest of its report (verdict.unit);
    any other column as named."""
    return objective(rows) if y == "samples_per_s" and objective(rows) == "tokens_per_s" else y


def draw(ax, rows: pd.DataFrame, spec: dict) -> None:
    """Draw one spec on one axes from the experiment's summary rows."""
    kind = spec.get("kind", "line")
    if kind not in KINDS:
        raise ValueError(f"plot kind {kind!r} is not one of {', '.join(KINDS)}")
    knobs = varying_knobs(rows)
    data = rows[rows["status"] == "ok"]
    x, y, hue = spec.get("x"), rate_column(rows, spec.get("y", "samples_per_s")), spec.get("hue")
    if "scenario" in rows and len(rows) and (rows["scenario"] == "transfer").all():
        # A probe has its own axes, whatever the spec names: bandwidth against copy size.
        data, x, y, kind = (
            transfer_long(data),
            "size_bytes",
            "gb_per_s",
            "line" if kind == "phases" else kind,
        )
        hue, knobs = hue if hue in data else "pinned", knobs + ["pinned"]
    missing = (
        [c for c in (x, y) if c not in data]
        if kind != "phases"
        else [c for c in (x,) if c not in data]
    )
    keys = _series(data, x, hue, knobs) if not missing else []
    stats = (
        _stats(data, keys, x, y) if not missing and not data.empty and kind != "phases" else None
    )
    why = None
    if data.empty:
        why = "no cell of this experiment finished"
    elif missing:
        why = f"no column {', '.join(map(str, missing))} in the summary"
    elif stats is not None and stats.empty:
        why = f"no value of {y} in this experiment"
    if why:
        ax.text(0.5, 0.5, plain(why), ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    if kind == "phases":
        _draw_phases(ax, data, keys, x)
    elif kind == "heatmap":
        _draw_heatmap(ax, stats, keys, x, y)
    else:
        _draw_lines_or_bars(ax, stats, keys, x, kind)
        ax.set_xlabel(axis_label(x))
        ax.set_ylabel(axis_label(y))
        ax.set_ylim(bottom=0)
    if kind != "heatmap" and ax.get_legend_handles_labels()[0]:
        entries = len(ax.get_legend_handles_labels()[0])
        page = _page(ax)
        # rows of 8 pt in the height of the axes' row (side-by-side panels share it)
        height_in = ax.figure.bbox.height / page.dpi / ax.get_subplotspec().get_gridspec().nrows
        fits = max(int(LEGEND_SHARE * height_in / LEGEND_ROW_IN), 1)
        ax.legend(
            fontsize=8,
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            borderaxespad=0,
            ncols=-(-entries // fits),
        )
    title = spec.get("title") or (f"{kind} by {x}" if kind == "phases" else f"{y} by {x}")
    # the legend may take the rest
    ax.set_title(wrap(plain(title), 0.5 * _page(ax).get_figwidth(), 10), fontsize=10)
    ax.grid(axis="y", alpha=0.3)


SERIES_LIMIT = 8  # more lines than this on one axes, and a line plot is split into small multiples


def facet_knob(rows: pd.DataFrame, spec: dict) -> str | None:
    """The knob a line plot is split by when it would draw more than SERIES_LIMIT lines (see the
    module docstring); None when its lines fit one axes."""
    if spec.get("kind", "line") != "line" or "status" not in rows or "cell" not in rows:
        return None
    if "scenario" in rows and (rows["scenario"] == "transfer").all():
        return None
    data = rows[rows["status"] == "ok"]
    x, hue = spec.get("x"), spec.get("hue")
    if x not in data or rate_column(rows, spec.get("y", "samples_per_s")) not in data:
        return None
    keys = _series(data, x, hue, varying_knobs(rows))
    others = [k for k in keys if k != hue]
    if not others or data.groupby(keys, dropna=False).ngroups <= SERIES_LIMIT:
        return None
    return min(others, key=lambda k: knob_texts(data[k], k).nunique())


def draw_facets(fig, rows: pd.DataFrame, spec: dict, knob: str) -> None:
    """Small multiples of one line spec in `fig` (a subfigure): one axes per level of `knob`, y
    shared."""
    levels = _ordered(rows[knob])
    axes = fig.subplots(1, len(levels), sharey=True, squeeze=False)[0]
    for ax, level in zip(axes, levels, strict=True):
        draw(
            ax,
            rows[rows[knob].astype(str) == str(level)],
            {**spec, "title": cell_label({knob: level}, [knob])},
        )
        if ax is not axes[-1] and ax.get_legend():
            ax.get_legend().remove()
        if ax is not axes[0]:
            ax.set_ylabel("")  # the y axis is shared: its label once, at the left
    title = (
        spec.get("title")
        or f"{rate_column(rows, spec.get('y', 'samples_per_s'))} by {spec.get('x')}"
    )
    fig.suptitle(
        wrap(plain(f"{title}, one panel per {knob}"), 0.95 * fig.figure.get_figwidth(), 10),
        fontsize=10,
    )


LEGEND_ROW_IN = 8 * 2.2 / 72  # a legend entry's row at 8 pt, with its spacing
LEGEND_SHARE = 0.7  # of an axes row's height a legend may fill


def legend_room(rows: pd.DataFrame, spec: dict, facets: int) -> tuple[float, float]:
    """(width, height) in inches a line or bar spec needs so that its legend of series, in words,
    stands in one column at the right of its axes (or `facets` panels) without squeezing them; (0,
    0) for a kind without one."""
    if (
        spec.get("kind", "line") not in ("line", "bar")
        or "status" not in rows
        or "cell" not in rows
    ):
        return 0.0, 0.0
    data = rows[rows["status"] == "ok"]
    x = spec.get("x")
    if x not in data or ("scenario" in rows and (rows["scenario"] == "transfer").all()):
        return 0.0, 0.0
    keys = _series(data, x, spec.get("hue"), varying_knobs(rows))
    labels = cell_labels(data.drop_duplicates(keys).to_dict("records"), keys) if keys else []
    legend = max((len(label) for label in labels), default=0) * CHAR_WIDTH * 8 / 72 + 0.6
    series = len(labels) // max(facets, 1) if facets > 1 else len(labels)
    return max(facets, 1) * 2.8 + legend + 0.8, (series + 2) * LEGEND_ROW_IN / LEGEND_SHARE


def figure(rows: pd.DataFrame, spec: dict | list[dict], title: str = "") -> Figure:
    """A figure with one axes per spec, titled with the experiment's title."""
    specs = spec if isinstance(spec, list) else [spec]
    # Knobs as the matrix asked for them: a pin_memory=true cell fitted to a CPU ran with false, yet
    # is its own cell (taken as it ran, it would be pooled with the pin_memory=false cell into one
    # bar with a meaningless interval).
    rows = as_requested(rows, [k for k in KNOBS if k in rows])
    cells = rows["cell"].nunique() if "cell" in rows else 1
    phases = any(one.get("kind") == "phases" for one in specs)
    width = max(7.5, 0.25 * cells + 2) if phases else 7.5  # a bar per cell needs room for its label
    facets = [facet_knob(rows, one) for one in specs]
    # Series labelled in words need a wider legend, many series a taller one: the figure grows by
    # it, so that the legend stands in one column and the axes keep their room.
    rooms = [
        legend_room(rows, one, rows[k].nunique() if k else 1)
        for one, k in zip(specs, facets, strict=True)
    ]
    width = max([width] + [room[0] for room in rooms])
    with plain_text():
        # A heatmap has a row per series (at most a row per cell), a phase plot vertical labels:
        # both need height.
        tall = {"heatmap": max(3.8, 0.2 * cells + 1.5), "phases": 3.8 + (1.5 if cells > 8 else 0)}
        heights = [
            max(tall.get(one.get("kind"), 3.8), room[1])
            for one, room in zip(specs, rooms, strict=True)
        ]
        fig = Figure(figsize=(width, sum(heights)), layout="constrained")
        if any(facets):  # a subfigure per spec, so that one spec may hold a row of axes
            for sub, one, knob in zip(
                fig.subfigures(len(specs), 1, squeeze=False, height_ratios=heights)[:, 0],
                specs,
                facets,
                strict=True,
            ):
                if knob:
                    draw_facets(sub, rows, one, knob)
                else:
                    draw(sub.subplots(), rows, one)
        else:
            for ax, one in zip(
                fig.subplots(len(specs), 1, squeeze=False, height_ratios=heights)[:, 0],
                specs,
                strict=True,
            ):
                draw(ax, rows, one)
        if title:
            fig.suptitle(wrap(plain(title), 0.95 * width, 12), fontsize=12)
    return fig


def _draw_stages(ax, cells: list[tuple[str, pd.DataFrame]], stages: list[str]) -> None:
    """One stacked bar per cell: the mean ms per sample of each stage, `unattributed` grey on top; a
    marker at the worker's ms per sample (median of the repeats) with its 95 % interval."""
    profiles = [profile(group) for _, group in cells]
    bottoms = [0.0] * len(cells)
    # distinct colours for 19 named stages
    colours = matplotlib.colormaps["tab10" if len(stages) <= 10 else "tab20"]
    for i, stage in enumerate(stages):
        heights = [(p["stages"].get(stage) or (0.0, 0.0))[0] if p else 0.0 for p in profiles]
        colour = "#bbbbbb" if stage == UNATTRIBUTED else colours(i % colours.N)
        ax.bar(range(len(cells)), heights, bottom=bottoms, color=colour, label=plain(stage))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    _median_marks(ax, [interval(group["stage_worker_ms"]) for _, group in cells], "worker (median)")
    ax.set_ylabel("ms per sample in the loader")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)


def _stage_legend(ax, ncols: int) -> None:
    """The legend outside the axes: the stages top first, as the stacked bars read them, the
    worker's mark last."""
    handles, texts = ax.get_legend_handles_labels()
    order = [*range(len(handles) - 2, -1, -1), len(handles) - 1]
    ax.legend(
        [handles[i] for i in order],
        [texts[i] for i in order],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        borderaxespad=0,
        ncols=ncols,
    )


def stage_figure(rows: pd.DataFrame, title: str = "") -> Figure | None:
    """The stage profile of an experiment's cells (knob stage_timing), for the report beside the
    experiment's own plot; None when no finished cell timed its stages."""
    rows = as_requested(rows, [k for k in KNOBS if k in rows])
    data = rows[rows["status"] == "ok"] if "status" in rows else rows.iloc[:0]
    stages = names(data)
    if not stages:
        return None
    knobs = varying_knobs(rows)
    firsts = data.drop_duplicates("cell")
    firsts = firsts.sort_values(knobs, key=natural_order, kind="stable") if knobs else firsts
    cells = [
        (cell, data[data["cell"] == cell])
        for cell in firsts["cell"]
        if profile(data[data["cell"] == cell])
    ]
    height = 3.8 + (1.5 if len(cells) > 8 else 0)
    # The legend's room is known before drawing (rows of 8 pt, as draw() counts them): the figure
    # widens by it, so that many stages never squeeze the bars, and the tick labels are fitted to
    # what is left for the axes.
    ncols = -(-(len(stages) + 1) // max(int(0.7 * height * 72 / (8 * 2.2)), 1))
    legend_in = ncols * (
        max(len(s) for s in [*stages, "worker (median)"]) * CHAR_WIDTH * 8 / 72 + 0.6
    )
    labels = (
        _labels(knobs, [tuple(group.iloc[0][knobs]) for _, group in cells])
        if knobs
        else [plain(c) for c, _ in cells]
    )
    # Room for each label with a knob a line (fit_ticks), up to WIDEST_IN: past that they stand
    # vertical.
    stacked = (
        max((len(line) for label in labels for line in label.split(" ")), default=0)
        * CHAR_WIDTH
        * 8
        / 72
    )
    room = min(len(cells) * stacked / 0.9 + legend_in + 1.0, WIDEST_IN)
    width = max(7.5, 0.25 * len(cells) + 2 + legend_in, room)
    with plain_text():
        fig = Figure(figsize=(width, height), layout="constrained")
        ax = fig.subplots()
        _draw_stages(ax, cells, stages)
        fit_ticks(ax, range(len(cells)), labels, (width - legend_in - 1.0) / max(len(cells), 1))
        _stage_legend(ax, ncols)
        heading = f"{title}: stage time per sample" if title else "Stage time per sample"
        ax.set_title(wrap(plain(heading), width - legend_in - 1.0, 10), fontsize=10)
    return fig


def svg_text(fig: Figure, salt: str) -> str:
    """The figure as SVG text: text stays text, ids are salted (unique within a page), no date (same
    bytes each run)."""
    buffer = io.StringIO()
    with matplotlib.rc_context(
        {"svg.fonttype": "none", "svg.hashsalt": salt, "text.usetex": False}
    ):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def save_svg(fig: Figure, path: str, salt: str) -> None:
    """Write the SVG atomically."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write(path, svg_text(fig, salt))


def plot_experiment(
    summary: pd.DataFrame, experiment: str, spec: dict | list[dict], svg: str, title: str = ""
) -> None:
    """The plot rule's work: the rows of one experiment -> its SVG."""
    rows = summary[summary["experiment"] == experiment]
    save_svg(figure(rows, spec, title or experiment), svg, salt=experiment)
