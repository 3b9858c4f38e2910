"""User text reaches matplotlib as text: a `$` in a title, a knob value or a host name never starts
the math parser."""

from __future__ import annotations

import json
import os

import pytest
from feedbench.analysis import views
from feedbench.analysis.aggregate import load_results, read_summary, write_summary
from feedbench.analysis.plots import figure, plain, plot_experiment, svg_text
from feedbench.analysis.report import write_report
from helpers.real_results import EXPERIMENTS, real_matrix  # noqa: F401 (fixture)

# matplotlib's math parser refuses \nope: drawn as math, the figure cannot be saved
MATH = r"Rate $\nope$"


@pytest.fixture(scope="module")
def summary(real_matrix, tmp_path_factory):  # noqa: F811
    path = str(tmp_path_factory.mktemp("plain") / "summary.csv")
    write_summary(load_results(real_matrix.paths), path)
    return read_summary(path)


def test_the_parser_would_refuse_the_title():
    """The case is real: without plain(), saving a figure titled MATH raises."""
    from matplotlib.figure import Figure

    fig = Figure()
    fig.subplots().set_title(MATH)
    with pytest.raises(ValueError):
        svg_text(fig, "x")
    assert plain(MATH) == r"Rate \$\nope\$" and plain(r"a \$ b") == r"a \\$ b"


@pytest.mark.parametrize("kind", ["line", "bar", "phases", "heatmap"])
def test_every_kind_of_plot_draws_user_text_literally(summary, tmp_path, kind):
    # Crafted: a column whose values carry math as the hue, so it reaches tick labels, legends and
    # heatmap rows.
    rows = summary[summary["experiment"] == "train"]
    rows = rows.assign(label=rows["sample_delay_ms"].map({0.0: "$x^2$", 0.5: MATH}))
    spec = {"x": "hidden_layers", "y": "samples_per_s", "hue": "label", "kind": kind, "title": MATH}
    svg = os.path.join(tmp_path, f"{kind}.svg")
    plot_experiment(rows, "train", spec, svg, title=f"{MATH} ($1 per sample)")
    with open(svg) as f:
        text = f.read()
    assert "Rate $\\nope$" in text and "$1 per sample" in text  # saved, and shown as typed
    if kind in ("line", "bar"):
        assert "label=$x^2$" in text  # the legend entry, literally


def test_a_missing_column_named_with_math_is_said_in_plain_text(summary):
    rows = summary[summary["experiment"] == "train"]
    svg = svg_text(figure(rows, {"x": "$\\nope$", "y": "samples_per_s"}), "m")
    assert "no column $\\nope$ in the summary" in svg


def test_a_view_names_a_host_with_math_literally(summary):
    # Crafted: a host name carrying math reaches the workers view's title and labels
    # (hardware(rows)).
    rows = summary[summary["experiment"] == "loader"].assign(host="rack$\\nope$")
    view = views.builder("workers")(
        rows, None, {"view": "workers", "matrix": EXPERIMENTS["loader"]["matrix"]}
    )
    assert "rack$\\nope$" in svg_text(view.figure, "v")


def test_the_report_is_made_with_math_in_every_title(real_matrix, tmp_path):  # noqa: F811
    """The plot rule and the report rule end to end, with the issue's title as experiment title and
    plot title."""
    experiments = json.loads(json.dumps(EXPERIMENTS))
    for spec in experiments.values():
        spec["title"] = MATH
        for one in spec["plot"] if isinstance(spec["plot"], list) else [spec["plot"]]:
            one["title"] = MATH
    summary_csv = os.path.join(tmp_path, "summary.csv")
    write_summary(load_results(real_matrix.paths), summary_csv)
    svgs = []
    for name, spec in experiments.items():
        svgs.append(os.path.join(tmp_path, "plots", f"{name}.svg"))
        plot_experiment(read_summary(summary_csv), name, spec["plot"], svgs[-1], spec["title"])
    html = os.path.join(tmp_path, "index.html")
    write_report(
        summary_csv, svgs, real_matrix.paths, {"experiments": experiments}, "c0ffee42", html
    )
    with open(html) as f:
        assert f.read().count("Rate $\\nope$") >= 2 * len(experiments)
