"""Every plot kind gives a valid SVG with a drawing, units on its axes and error bars from the
repeats."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from feedbench.analysis.aggregate import load_results
from feedbench.analysis.plots import KINDS, axis_label, plot_experiment, transfer_long
from feedbench.analysis.report import inline_svg
from helpers.real_results import EXPERIMENTS, real_matrix  # noqa: F401 (fixture)

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def summary(real_matrix):  # noqa: F811
    return load_results(real_matrix.paths)


def draw(summary, tmp_path, experiment, spec, title="") -> tuple[ET.Element, str]:
    path = tmp_path / f"{experiment}.svg"
    plot_experiment(summary, experiment, spec, str(path), title)
    text = path.read_text()
    return ET.fromstring(text), text


def groups(root: ET.Element, prefix: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("id", "").startswith(prefix)]


def texts(root: ET.Element) -> str:
    return " ".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_draws_a_valid_svg(summary, tmp_path, kind):
    spec = {"x": "hidden_layers", "y": "samples_per_s", "hue": "sample_delay_ms", "kind": kind}
    root, _ = draw(summary, tmp_path, "train", spec)
    assert root.tag == f"{SVG}svg"
    axes = groups(root, "axes_")
    assert axes, "no axes drawn"
    drawn = {"line": "line2d_", "bar": "patch_", "phases": "patch_", "heatmap": "image"}[kind]
    if kind == "heatmap":
        images = list(root.iter(f"{SVG}image"))
        assert images and all(int(float(i.get("width"))) > 0 for i in images)
    else:
        shapes = [g for g in groups(axes[0], drawn) if g.find(f"{SVG}path") is not None]
        # line: 4 cells -> 2 lines of 2 points (plus their error bars); bar: 4 bars; phases: 4 bars
        # x 4 phases.
        assert len(shapes) >= {"line": 2, "bar": 4, "phases": 16}[kind]
    labels = texts(root)
    unit = {
        "line": "[samples/s]",
        "bar": "[samples/s]",
        "phases": "[ms]",
        "heatmap": "[samples/s]",
    }[kind]
    assert unit in labels


def test_error_bars_come_from_the_repeats(summary, tmp_path):
    root, _ = draw(
        summary, tmp_path, "loader", {"x": "num_workers", "y": "samples_per_s", "kind": "line"}
    )
    bars = groups(root, "LineCollection_")
    assert bars, "no error bars"
    # Each error bar is one segment per point: 2 x-levels here.
    segments = [p for g in bars for p in g.iter(f"{SVG}path")]
    assert len(segments) >= 2


def test_spec_list_gives_one_axes_per_spec_in_one_svg(summary, tmp_path):
    root, _ = draw(summary, tmp_path, "loader", EXPERIMENTS["loader"]["plot"])
    assert {"axes_1", "axes_2"} <= {g.get("id") for g in groups(root, "axes_")}
    labels = texts(root)
    assert "samples_per_s by num_workers" in labels and "stall_pct by num_workers" in labels
    assert "[%]" in labels and "[samples/s]" in labels


def test_transfer_is_bandwidth_against_size(summary, tmp_path):
    root, _ = draw(summary, tmp_path, "transfer", EXPERIMENTS["transfer"]["plot"])
    labels = texts(root)
    assert "[GB/s]" in labels and "64 KiB" in labels and "1 MiB" in labels
    assert re.search(r"\bpinned=(true|false)\b", labels)  # the series in words
    long = transfer_long(summary[summary["experiment"] == "transfer"])
    assert set(long["size_bytes"]) == {65536, 1048576} and long["gb_per_s"].gt(0).all()
    # Whatever a transfer spec says, the probe's own axes are used.
    root, _ = draw(
        summary, tmp_path, "transfer", {"x": "num_workers", "y": "samples_per_s", "kind": "bar"}
    )
    assert "[GB/s]" in texts(root)


def test_title_cannot_inject_markup(summary, tmp_path):
    root, text = draw(
        summary, tmp_path, "train", EXPERIMENTS["train"]["plot"], title="<script>alert(1)</script>"
    )
    assert "<script>alert(1)</script>" in texts(root)  # the title is there, as text
    assert "<script" not in text and "&lt;script&gt;" in text
    assert not list(root.iter(f"{SVG}script"))
    inline_svg(text)  # and the report accepts it as inert


def test_experiment_without_a_finished_cell_still_gets_a_figure(summary, tmp_path):
    root, _ = draw(summary, tmp_path, "broken", {"x": "model", "y": "samples_per_s", "kind": "bar"})
    assert "no cell of this experiment finished" in texts(root)


def test_unknown_kind_names_the_choices(summary, tmp_path):
    with pytest.raises(ValueError, match="line, bar, phases, heatmap"):
        draw(summary, tmp_path, "train", {"x": "hidden_layers", "kind": "pie"})


def test_same_input_same_svg(summary, tmp_path):
    spec = EXPERIMENTS["train"]["plot"]
    plot_experiment(summary, "train", spec, str(tmp_path / "a.svg"))
    plot_experiment(summary, "train", spec, str(tmp_path / "b.svg"))
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()
    plot_experiment(summary, "loader", EXPERIMENTS["loader"]["plot"], str(tmp_path / "c.svg"))
    ids = lambda p: set(re.findall(r'id="(p[0-9a-f]{8,})"', p.read_text()))  # noqa: E731 (clip paths)
    assert ids(tmp_path / "a.svg") and not ids(tmp_path / "a.svg") & ids(tmp_path / "c.svg")


@pytest.mark.parametrize(
    "column, unit",
    [
        ("samples_per_s", "[samples/s]"),
        ("tokens_per_s", "[tokens/s]"),
        ("step_ms_median", "[ms]"),
        ("stall_pct", "[%]"),
        ("h2d_gb_per_s", "[GB/s]"),
        ("wait_share", "[share of step]"),
        ("time_to_first_batch_s", "[s]"),
        ("gpu_util_pct_mean", "[%]"),
        ("num_workers", ""),
    ],
)
def test_axis_labels_carry_units(column, unit):
    assert axis_label(column).endswith(unit) if unit else "[" not in axis_label(column)


def test_a_gpu_bar_stacks_the_gpus_idle_time_not_the_hosts_overlapping_wait():
    """Under events timing the host's wait overlaps the GPU's compute: stacked with it the bar read
    229 ms of a 129 ms step (the H200 calibration's balanced cell, one worker). A CPU cell keeps its
    wait."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from feedbench.analysis.plots import _draw_phases

    rows = pd.DataFrame(
        {
            "num_workers": [1, 0],
            "wait_ms": [127.7, 100.0],
            "h2d_ms": [0.1, 0.0],
            "fwd_ms": [115.2, 50.0],
            "gpu_idle_ms": [13.7, None],
            "step_ms_median": [129.1, 150.0],
        }
    )
    fig, ax = plt.subplots()
    _draw_phases(ax, rows, [], "num_workers")
    tops = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    plt.close(fig)
    assert tops[0] == pytest.approx(150.0) and tops[1] == pytest.approx(129.0)


def test_a_hue_knob_unset_in_some_cells_keeps_their_bars():
    """The default's decode experiment: cells without cache_after (null, NaN in the summary) beside
    one with it. The bars of the unset ones were dropped with their NaN group."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from feedbench.analysis.plots import draw

    rows = pd.DataFrame(
        {
            "experiment": "decode",
            "cell": ["num_workers-0", "num_workers-1", "num_workers-0_cache_after-decode"],
            "repeat": 1,
            "status": "ok",
            "num_workers": [0, 1, 0],
            "cache_after": [None, None, "decode"],
            "samples_per_s": [300.0, 400.0, 390.0],
        }
    )
    fig, ax = plt.subplots()
    draw(ax, rows, {"x": "num_workers", "y": "samples_per_s", "hue": "cache_after", "kind": "bar"})
    heights = sorted(round(bar.get_height()) for bar in ax.patches)
    labels = sorted(text.get_text() for text in ax.get_legend().get_texts())
    plt.close(fig)
    assert heights == [300, 390, 400] and labels == ["cache_after=decode", "cache_after=none"]
