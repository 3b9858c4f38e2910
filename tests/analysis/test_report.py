"""The HTML report from real results: verdict first, escaped, self-contained, failures and
provenance shown."""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser

import pytest
from conftest import ROOT
from feedbench.analysis.aggregate import load_results, read_summary, write_summary
from feedbench.analysis.glossary import link_first_uses
from feedbench.analysis.publish import summarize
from feedbench.analysis.report import UnsafeSVG, inline_svg, write_report
from feedbench.analysis.verdict import summarize_experiment
from feedbench.core.records import load_records
from helpers.real_results import EXPERIMENTS, real_matrix  # noqa: F401 (fixture)
from helpers.reports import EVIL, config, make_report  # noqa: F401 (fixture)

# one worker: the module fixture `html` renders the report once
pytestmark = pytest.mark.xdist_group("report")


class Links(HTMLParser):
    """Every tag and every src/href value of a page."""

    def __init__(self):
        super().__init__()
        self.tags, self.links = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.links += [
            value for name, value in attrs if name in ("src", "href", "xlink:href") and value
        ]


@pytest.fixture(scope="module")
def html(real_matrix, config, tmp_path_factory):  # noqa: F811
    return make_report(str(tmp_path_factory.mktemp("report")), real_matrix.paths, config)


def test_markup_in_titles_and_config_is_escaped(html):
    assert EVIL not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    page = Links()
    page.feed(html)
    assert "script" not in page.tags


def test_nothing_is_loaded_from_outside_the_file(html):
    page = Links()
    page.feed(html)
    assert page.links, "the page has in-document links (nav, figures)"
    outside = [
        link for link in page.links if not (link.startswith("#") or link.startswith("data:image/"))
    ]
    assert outside == []
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert "<link" not in html and "@import" not in html
    assert not re.search(r"url\(\s*['\"]?(?!#)", html)  # CSS and SVG refer only to ids in the page
    assert "default-src 'none'" in html  # and the browser is told to refuse any request


def test_verdict_comes_first_with_best_speedup_and_bound(html, real_matrix, config):  # noqa: F811
    verdict, first_experiment = html.index('id="verdict"'), html.index('id="exp-')
    assert verdict < first_experiment < html.index('id="failed"') < html.index('id="provenance"')
    summary = load_results(real_matrix.paths)
    found = summarize_experiment(
        summary[summary["experiment"] == "train"], config["experiments"]["train"]["matrix"]
    )
    section = html[verdict:first_experiment]
    assert f"{found['speedup']:.2f}×" in section
    assert found["best"]["cell"] in section.replace("<wbr>", "")  # the id may wrap after _ and -
    assert f"bound-{found['best']['bound']}" in section
    assert "10 % of each step" in section  # the rule is stated, with its threshold


def test_each_experiment_has_its_figure_and_table(html, config):  # noqa: F811
    for name in config["experiments"]:
        start = html.index(f'id="exp-{name}"')
        section = html[start : html.index("</section>", start)]
        assert "<svg" in section
        if name != "broken":
            assert "95 % interval" in section and "<table" in section
    # Each experiment's plot, and the train experiment's stage profile (its cells run with
    # stage_timing).
    assert html.count("<figure>") == len(config["experiments"]) + 1


def test_failed_cells_are_listed_with_the_end_of_their_error(html, real_matrix):  # noqa: F811
    with open(real_matrix.failing) as f:
        error = json.load(f)["error"]
    failed = html[html.index('id="failed"') : html.index('id="provenance"')]
    assert "dataset-truncated" in failed and "OSError" in failed
    last_line = error["traceback"].strip().splitlines()[-1]
    assert last_line.replace("'", "&#39;").replace('"', "&#34;") in failed


def test_provenance_shows_the_allow_list(html, real_matrix):  # noqa: F811
    with open(real_matrix.paths[0]) as f:
        provenance = json.load(f)["provenance"]
    section = html[html.index('id="provenance"') :]
    assert "c0ffee42" in section
    for field in ("torch", "torchvision", "python", "host", "cpu", "git_commit"):
        assert f"<th>{field}</th>" in section
        if provenance[field] is not None:
            assert str(provenance[field]) in section
    assert "<th>snakemake</th>" in section
    assert "PATH" not in section and "HOME" not in section  # never the environment


def test_unsafe_svg_is_refused():
    # Crafted SVGs: what our matplotlib output never contains and inline_svg must refuse.
    base = (
        '<svg xmlns="http://www.w3.org/2000/svg" '
        'xmlns:xlink="http://www.w3.org/1999/xlink">{}</svg>'
    )
    for body in [
        "<script>alert(1)</script>",
        '<rect onload="alert(1)"/>',
        '<image xlink:href="https://example.com/x.png"/>',
        '<a href="javascript:alert(1)"><text>x</text></a>',
        "<foreignObject><div/></foreignObject>",
        '<rect style="fill: url(https://example.com/p.svg#x)"/>',
        "<style>@import 'https://example.com/a.css';</style>",
    ]:
        with pytest.raises(UnsafeSVG):
            inline_svg(base.format(body))
    assert str(
        inline_svg(
            '<?xml version="1.0"?>\n'
            + base.format(
                '<use xlink:href="#a" clip-path="url(#p1)"/><style>*{stroke-linecap: butt}</style>'
            )
        )
    ).startswith("<svg")


def test_report_without_config_still_lists_every_experiment(real_matrix, tmp_path):  # noqa: F811
    summary = tmp_path / "summary.csv"
    write_summary(load_results(real_matrix.paths), str(summary))
    html = tmp_path / "index.html"
    write_report(str(summary), [], real_matrix.paths, {}, "none", str(html))
    text = html.read_text()
    for name in ("loader", "train", "transfer", "broken"):
        assert f'id="exp-{name}"' in text
    # The baseline comes with the results (their `baseline` label), not from the config.
    assert "no baseline" not in text
    assert re.search(
        r"baseline (hidden_layers=1, sample_delay_ms=0|sample_delay_ms=0, " r"hidden_layers=1):",
        text,
    )


def test_rule_report_reads_the_records_rule_aggregate_wrote(real_matrix, tmp_path):  # noqa: F811
    """Rule report has no results as inputs: it reads rule aggregate's records (core.records), one
    per summary row in its order, damaged ones included, and renders from them what it renders from
    the result files; an empty summary has none."""
    damaged = tmp_path / "damaged" / "result.json"
    damaged.parent.mkdir()
    damaged.write_text("{")
    paths = [*real_matrix.paths, str(damaged)]
    summary, records = tmp_path / "summary.csv", tmp_path / "records.json"
    summarize(paths, str(summary), records=str(records))
    found = load_records(str(records))
    assert [r.path for r in found] == list(read_summary(str(summary))["result"])
    assert sorted(r.path for r in found) == sorted(paths)
    assert [r.path for r in found if r.damaged] == [str(damaged)] and found[-1].error[
        "type"
    ] == "UnusableResult"
    pages = {"records": found, "files": paths}
    for name, given in pages.items():
        write_report(str(summary), [], given, {}, "none", str(tmp_path / f"{name}.html"))
    assert (tmp_path / "records.html").read_text() == (tmp_path / "files.html").read_text()
    summarize([], str(tmp_path / "empty.csv"), records=str(tmp_path / "empty.json"))
    assert load_records(str(tmp_path / "empty.json")) == []
    (tmp_path / "bad.json").write_text('{"path": "x"}')
    with pytest.raises(ValueError, match="not a list of result records"):
        load_records(str(tmp_path / "bad.json"))


def test_every_axis_is_a_column_and_an_adjusted_value_is_marked(html):
    # pin_memory is an axis of `loader`; on a CPU the harness runs it as false, which must show,
    # with why.
    section = html[html.index('id="exp-loader"') : html.index('id="exp-train"')]
    header = section[section.index("<thead>") : section.index("</thead>")]
    assert "<th>num_<wbr>workers</th>" in header
    assert "pin_<wbr>memory" in header
    marked = re.findall(
        r'<td class="adjusted" title="([^"]*)">true → false<sup>\*</sup></td>', section
    )
    assert marked and all(m.startswith("pin_memory=true ignored") for m in marked)
    assert "asked → ran" in section


def test_cells_carry_a_label_in_words_and_their_id_wraps(html):
    section = html[html.index('id="exp-train"') : html.index('id="exp-transfer"')]
    assert "Key</b>" not in section  # two knobs vary: the labels are in words, and need no key
    assert '<b class="label">hidden_layers=4 sample_delay_ms=0.5</b>' in section
    wrapped = "hidden_<wbr>layers-<wbr>4_<wbr>sample_<wbr>delay_<wbr>ms-<wbr>0.5"
    assert (
        f'<code class="id" title="hidden_layers-4_sample_delay_ms-0.5">{wrapped}</code>' in section
    )
    assert '<div class="scroll" id="cells-train">\n  <table class="cells">' in section


def test_a_mapping_knob_shows_as_its_json_and_is_not_called_adjusted():
    """A user's dataset_args reach the summary as JSON text and the requested knobs as a mapping."""
    import pandas as pd
    from feedbench.analysis.report import axis_values, fmt

    rows = pd.DataFrame(
        [
            {
                "cell": "c",
                "dataset_args": '{"shards": 4}',
                "requested": '{"dataset_args": {"shards": 4}}',
                "adjustments": "",
            }
        ]
    )
    cells = [{"cell": "c"}]
    axis_values(rows, cells, ["dataset_args"])
    assert cells[0]["shown"]["dataset_args"] == ('{"shards": 4}', None)
    assert fmt({"b": 1, "a": [2]}) == '{"a": [2], "b": 1}' and fmt("x") == "x"


def test_a_failed_cell_without_its_knobs_leaves_the_others_integers(tmp_path):
    """A cell that failed before its knobs were known leaves num_workers empty in the summary: read
    typed (aggregate.read_summary), the other cells still show 1, 2, 4 workers, not 1.00, 2.00, 4.00
    as a float column did."""
    import pandas as pd
    import yaml

    stored = os.path.join(ROOT, "tests", "stored", "workers-small")
    rows = pd.read_csv(os.path.join(stored, "summary.csv"), dtype=str, keep_default_na=False)
    lost = {c: "" for c in rows.columns} | {
        "experiment": "workers",
        "cell": "num_workers-8",
        "repeat": "1",
    }
    lost |= {
        "status": "failed",
        "error_type": "Terminated",
        "error_message": "lost",
        "requested": "{}",
    }
    pd.concat([rows, pd.DataFrame([lost])]).to_csv(tmp_path / "summary.csv", index=False)
    config = yaml.safe_load(open(os.path.join(stored, "config.yaml")))  # noqa: F811
    write_report(
        str(tmp_path / "summary.csv"), [], [], config, "c0ffee42", str(tmp_path / "index.html")
    )
    cells = (tmp_path / "index.html").read_text()
    cells = cells[
        cells.index('class="cells"') : cells.index("</table>", cells.index('class="cells"'))
    ]
    shown = re.findall(r"<td>([^<]*)</td>", cells)  # the knob columns
    assert {"1", "2", "4"} <= set(shown) and not {"1.00", "2.00", "4.00"} & set(shown)


def test_report_sections_and_inputs_register_as_views_do():
    """Each input of the report (report.INPUTS) is read by a section that names it, each section's
    inputs are known, and a section's template is one report.html.j2 includes: a new input is its
    reader, its section and its files in rule report's input (common.smk REPORT_INPUTS), not a
    keyword threaded through every function on the way."""
    from feedbench.analysis import report

    read = {name for section in report.SECTIONS for name in section.inputs}
    assert read == set(report.INPUTS)
    with open(os.path.join(report.TEMPLATES, "report.html.j2")) as f:
        page = f.read()
    for section in report.SECTIONS:
        assert section.template is None or f'{{% include "{section.template}" %}}' in page, (
            section.name
        )
    with open(os.path.join(ROOT, "workflow", "rules", "common.smk")) as f:
        rules = f.read()
    given = rules.split("REPORT_INPUTS = {")[1].split("}")[0]
    assert set(re.findall(r'^    "(\w+)": ', given, re.M)) == set(report.INPUTS)


def test_an_unknown_report_input_is_one_line(tmp_path):
    from feedbench.analysis.report import build

    summary = load_results([])
    with pytest.raises(
        TypeError,
        match=r"report input 'links' is not known; allowed: " r"references, searches, ceil",
    ):
        build(summary, [], [], {}, "c0ffee42", links={})


def test_a_terms_first_use_in_each_section_links_to_its_definition_and_nothing_else_changes():
    page = (
        "<h2>cell</h2><section id='a'><h3>A cell</h3><p>The <code>cell</code> of one cell, "
        "another cell &amp; its "
        "CPU-bound worker; data-bound.</p></section><section id='b'><p>Cells.</p>"
        '<details id="glossary"><dd>a baseline '
        "cell</dd></details><p>baseline<br>cell</p></section><p>cell</p>"
    )
    assert link_first_uses(page) == (
        "<h2>cell</h2><section id='a'><h3>A cell</h3><p>The <code>cell</code> of one "
        '<a class="term" href="#term-cell">cell</a>, another cell &amp; its CPU-bound worker; '
        '<a class="term" href="#term-bound">data-bound</a>.</p></section><section id=\'b\'><p>'
        '<a class="term" href="#term-cell">Cells</a>.</p><details id="glossary"><dd>a baseline '
        "cell</dd></details><p>"
        '<a class="term" href="#term-baseline">baseline</a><br>cell</p></section><p>cell</p>'
    )
