"""Every plot kind fits at a large matrix: 5 axes, 32 cells. Checked with matplotlib's own renderer
(get_window_extent): no two tick labels of an axis overlap, no text leaves the figure, the title is
whole."""

from __future__ import annotations

import itertools
import json
import random
import re

import pandas as pd
import pytest
from feedbench.analysis import views
from feedbench.analysis.labels import VALUE_CHARS
from feedbench.analysis.plots import KINDS, SERIES_LIMIT, facet_knob, figure, stage_figure
from feedbench.analysis.report import experiment_context
from feedbench.core.metrics import PHASES
from matplotlib.backends.backend_agg import FigureCanvasAgg

AXES = {
    "num_workers": [0, 2],
    "pin_memory": [False, True],
    "non_blocking": [False, True],
    "timing": ["events", "naive"],
    "gpus_per_node": [1, 2],
}
TITLE = (
    "Where does a batch's time go, and what do pinning and non_blocking change? (PyTorch forum) "
    "A title long enough to be clipped at both ends if it were not wrapped"
)


def cell_id(point: dict) -> str:
    return "model-resnet18_" + "_".join(f"{k}-{str(v).lower()}" for k, v in point.items())


@pytest.fixture(scope="module")
def summary() -> pd.DataFrame:
    """A summary as aggregate writes it (the columns the plots read), 32 cells x 2 repeats, made-up
    timings."""
    random.seed(0)
    rows = []
    for levels in itertools.product(*AXES.values()):
        point = dict(zip(AXES, levels, strict=True))
        for repeat in range(2):
            phases = {f"{p}_ms": random.uniform(1, 20) for p in PHASES}
            step = sum(phases.values())
            rows.append(
                {
                    "experiment": "breakdown",
                    "cell": cell_id(point),
                    "repeat": repeat,
                    "status": "ok",
                    "scenario": "train",
                    "model": "resnet18",
                    "parallel": "dp",
                    "batch_size": 64,
                    **point,
                    **phases,
                    "step_ms_median": step,
                    "samples_per_s": 64_000 / step,
                    "stall_pct": 100 * phases["wait_ms"] / step,
                }
            )
    return pd.DataFrame(rows)


def boxes(texts, renderer):
    return [
        (t.get_text(), t.get_window_extent(renderer))
        for t in texts
        if t.get_visible() and t.get_text().strip()
    ]


def ticks_out_of_view(ax) -> list:
    """Tick labels matplotlib keeps but does not draw: their tick lies outside the axis's view (a
    colour bar's 0.0 below its data's range), so their place says nothing of the figure."""
    hidden = []
    for axis, coordinate in ((ax.xaxis, 0), (ax.yaxis, 1)):
        low, high = sorted(axis.get_view_interval())
        slack = 1e-9 * (high - low)
        for label in axis.get_ticklabels() + axis.get_ticklabels(minor=True):
            if not low - slack <= label.get_position()[coordinate] <= high + slack:
                hidden.append(label)
    return hidden


def overlapping(labelled) -> list[tuple[str, str]]:
    return [
        (a, b)
        for (a, box_a), (b, box_b) in itertools.combinations(labelled, 2)
        if box_a.overlaps(box_b)
    ]


SPECS = {
    "line": {"x": "num_workers", "y": "samples_per_s", "hue": "pin_memory"},
    "bar": {"x": "timing", "y": "samples_per_s", "hue": "non_blocking"},
    "phases": {"x": "pin_memory"},
    "heatmap": {"x": "num_workers", "y": "stall_pct", "hue": "pin_memory"},
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_fits_a_five_axis_matrix(summary, kind):
    fig = figure(summary, {**SPECS[kind], "kind": kind, "title": TITLE}, title=TITLE)
    assert_fits(fig, kind)
    assert " ".join(fig.get_suptitle().split()) == TITLE  # wrapped, never cut
    # A line plot of 16 series is split into panels (below): the spec's title heads the row of
    # panels.
    titled = fig.subfigs[0].get_suptitle() if kind == "line" else fig.axes[0].get_title()
    assert " ".join(titled.split()).startswith(TITLE)
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
    assert not any("model-" in t for t in ticks), "labels name what differs, never the id"
    assert not any(re.search(r"(^|\s)(w|pin|no-pin|nb|no-nb|t|gpus)(=|\s|$)", t) for t in ticks), (
        "in words, no codes"
    )


def test_the_breakdown_view_fits_a_five_axis_matrix(summary):
    """The study view of the issue's report: its two panels' labels collided at this size."""
    view = views.builder("breakdown")(
        summary, None, {"view": "breakdown", "matrix": AXES, "base": {}}
    )
    assert_fits(view.figure, "breakdown view")
    labels = [t.get_text().replace("\n", " ") for t in view.figure.axes[0].get_xticklabels()]
    assert "pin_memory=false non_blocking=false num_workers=0 gpus=1 batch=64" in labels


def test_the_stage_profile_fits_a_five_axis_matrix_of_many_stages(summary):
    """32 cells and 15 stages with long names (a deep user pipeline): the legend takes columns, the
    bars keep room."""
    stages = [f"RandomResizedCropNumber{i}" for i in range(14)] + ["unattributed"]
    timed = summary.assign(
        stage_worker_ms=15.0,
        **{
            f"stage_{n}_{stat}": value
            for n in stages
            for stat, value in (("share", 1 / 15), ("mean_ms", 1.0))
        },
    )
    fig = stage_figure(timed, TITLE)
    assert_fits(fig, "stage profile")
    assert (
        len(fig.axes[0].get_xticklabels()) == 32 and len(fig.axes[0].get_legend().get_texts()) == 16
    )


def test_a_line_plot_of_many_series_becomes_small_multiples(summary):
    """16 series (pin_memory, the hue, x 4 other knobs) tangle one axes: one panel per level of a
    series knob that is not the hue, the legend once, the same lines in each panel, and everything
    still fits."""
    spec = {**SPECS["line"], "kind": "line"}
    knob = facet_knob(summary, spec)
    assert knob in set(AXES) - {"num_workers", "pin_memory"}
    fig = figure(summary, spec, title=TITLE)
    assert len(fig.axes) == 2
    assert [bool(ax.get_legend()) for ax in fig.axes] == [False, True]
    lines = [ax.get_legend_handles_labels()[1] for ax in fig.axes]
    assert lines[0] == lines[1] and len(lines[0]) == 16 // 2 <= SERIES_LIMIT
    assert fig.axes[0].get_ylim() == fig.axes[1].get_ylim()  # shared y: panels compare by eye
    assert_fits(fig, "line in panels")


def test_a_line_plot_of_few_series_stays_one_axes(summary):
    # pin x nb: 4 series
    few = summary[(summary["timing"] == "events") & (summary["gpus_per_node"] == 1)]
    spec = {**SPECS["line"], "kind": "line"}
    assert facet_knob(few, spec) is None
    assert len(figure(few, spec).axes) == 1


def test_a_cell_fitted_to_the_machine_keeps_its_own_bar(summary):
    """pin_memory=true cells ran with false on a CPU: plotted as asked, never pooled with the false
    cells."""
    ran = summary.assign(
        requested=[json.dumps({"pin_memory": bool(v)}) for v in summary["pin_memory"]],
        pin_memory=False,
    )
    fig = figure(ran, {**SPECS["phases"], "kind": "phases"})
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert len(labels) == len(set(labels)) == summary["cell"].nunique() == 32
    assert (
        sum(label.startswith(("pin_memory=true ", "pin_memory=true\n")) for label in labels) == 16
    )


def assert_fits(fig, what: str) -> None:
    """No two tick labels of an axis overlap, and no text leaves the figure (as matplotlib's
    renderer draws them)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    page = fig.bbox.padded(1)
    for ax in fig.axes:
        for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
            assert overlapping(boxes(ticks, renderer)) == [], f"{what}: tick labels overlap"
    undrawn = {id(label) for ax in fig.axes for label in ticks_out_of_view(ax)}
    texts = fig.findobj(
        lambda o: (
            hasattr(o, "get_text") and hasattr(o, "get_window_extent") and id(o) not in undrawn
        )
    )
    outside = [
        text
        for text, box in boxes(texts, renderer)
        if not page.fully_contains(box.x0, box.y0) or not page.fully_contains(box.x1, box.y1)
    ]
    assert outside == [], f"{what}: text leaves the figure"


def test_five_varying_knobs_label_cells_in_words_and_never_twice(summary):
    """Where 3 or more knobs vary, the report's cell table, every plot kind and the stage profile
    still name each cell by its knobs in words (`num_workers=2`, never `w=2`), and no axis shows a
    label twice; a long value (a data_dir) is cut in its middle, its knob's name whole, still
    telling the cells apart."""
    dirs = {
        0: "/scratch/user/datasets/imagenet-subset/train-a",
        2: "/scratch/user/datasets/imagenet-subset/train-b",
    }
    rows = summary.assign(data_dir=summary["num_workers"].map(dirs), stage_worker_ms=15.0)
    rows = rows.assign(
        **{f"stage_decode_{stat}": value for stat, value in (("share", 1.0), ("mean_ms", 1.0))}
    )
    spec = {
        "matrix": {**AXES, "data_dir": list(dirs.values())},
        "plot": {**SPECS["phases"], "kind": "phases"},
    }
    table = [cell["label"] for cell in experiment_context("breakdown", spec, rows, None)["cells"]]
    figures = [figure(rows, {**SPECS[kind], "kind": kind}) for kind in KINDS] + [stage_figure(rows)]
    ticks = [
        [text.replace("\n", " ") for text in texts]
        for fig in figures
        for ax in fig.axes
        for texts in (
            [t.get_text() for t in ax.get_xticklabels()],
            [t.get_text() for t in ax.get_yticklabels()],
            ax.get_legend_handles_labels()[1],
        )
    ]
    assert len(table) == len(set(table)) == 32
    for labels in [table, *ticks]:
        assert len(labels) == len(set(labels)), labels
    named = [label for label in [*table, *(t for axis in ticks for t in axis)] if "=" in label]
    assert len(named) > 100
    for label in named:
        parts = dict(part.split("=", 1) for part in label.split(" "))
        assert set(parts) <= {*AXES, "data_dir"}, label  # every knob by its own name
        assert len(parts.get("data_dir", "")) <= VALUE_CHARS, label
    assert {"/scratch/use…set/train-a", "/scratch/use…set/train-b"} == {
        label.split("data_dir=")[1].split(" ")[0] for label in table
    }
    assert all(len(label.split(" ")) == 6 for label in table)  # the 5 axes and data_dir, each named
