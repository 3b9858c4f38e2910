"""The verdict's other-load sentence (analysis.other_load): a cell measured beside other work on its
CPUs is named, so that its figures are not read as a quiet machine's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from feedbench.analysis.aggregate import load_results, write_summary
from feedbench.analysis.other_load import disturbed, note
from feedbench.analysis.report import write_report
from feedbench.analysis.verdict import cell_table
from helpers.browser import without_tags
from helpers.cells import run_cell_process


def cells(*rows: dict) -> pd.DataFrame:
    """A cell table, a cell per row: its name, other load and CPUs, one rank unless given."""
    return pd.DataFrame([{"world_size": 1, "measured_as": None, **row} for row in rows])


def test_a_tenth_of_the_cpus_and_a_fifth_of_a_core_is_other_load():
    table = cells(
        {"cell": "quiet", "other_load_cores": 0.1, "affinity_cores": 2},
        # a fifth of a core is a tenth of 2 CPUs; 1.5 of 32 CPUs is under a tenth
        {"cell": "edge", "other_load_cores": 0.2, "affinity_cores": 2},
        {"cell": "big", "other_load_cores": 1.5, "affinity_cores": 32},
        {"cell": "unread", "other_load_cores": None, "affinity_cores": None},
    )
    assert [c["cell"] for c in disturbed(table)] == ["edge"]
    busy = disturbed(cells({"cell": "busy", "other_load_cores": 0.9, "affinity_cores": 2}))
    # the run's one sentence, the largest share first, whichever experiment it is in
    found = [("loader", c) for c in disturbed(table)] + [("train", c) for c in busy]
    assert note(found) == (
        "Measured beside other load: other processes took 0.9 of the 2 CPUs cell busy of train ran "
        "on (45 %); 1 more cell also ran beside other load. Those figures are lower than a quiet "
        "machine gives; rerun them alone before comparing them."
    )


def test_ranks_of_one_cell_and_a_cell_that_took_anothers_result_are_not_other_load():
    """Rank 0's monitor counts the cell's other ranks on the host as other work; a twin repeats the
    cell it took its result from."""
    table = cells(
        {"cell": "ddp", "other_load_cores": 1.0, "affinity_cores": 2, "world_size": 2},
        {"cell": "pinned", "other_load_cores": 1.0, "affinity_cores": 2, "measured_as": "plain"},
        {"cell": "quiet", "other_load_cores": 0.0, "affinity_cores": 2},
    )
    assert disturbed(table) == [] and note([]) is None


@pytest.mark.slow
def test_a_cell_beside_a_spinning_process_on_its_cpu_says_so_in_the_verdict(tmp_path):
    """A real cell whose one CPU a spinning process shares: the harness reads the spinner's work as
    other load, and the verdict, the page and the terminal's text name the cell.

    The cell sleeps (the sleep model, one thread), so the spinner has most of the CPU: other load
    only adds to it, so a busy machine cannot make the bound fail."""
    cpu = max(os.sched_getaffinity(0))
    spinner = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    knobs = dict(
        experiment="shared",
        cell="sleep",
        repeat=1,
        baseline=True,
        model="sleep",
        compute_ms=50.0,
        image_size=8,
        batch_size=2,
        steps=20,
        warmup_steps=2,
        torch_threads=1,
        device="cpu",
    )
    try:
        done = run_cell_process(
            tmp_path / "cell", knobs, preexec_fn=lambda: os.sched_setaffinity(0, {cpu})
        )
    finally:
        spinner.kill()
        spinner.wait()
    assert done.returncode == 0, done.stderr[-2000:]
    path = str(tmp_path / "cell" / "result.json")
    with open(path) as f:
        offered = json.load(f)["monitor"]["cpu_offered"]
    assert offered["cores"] == 1 and offered["other_cores"] >= 0.5, offered

    rows = load_results([path])
    assert rows.loc[0, "other_load_cores"] == offered["other_cores"]
    (cell,) = disturbed(cell_table(rows))
    sentence = note([("shared", cell)])
    assert sentence.startswith(
        f"Measured beside other load: other processes took {offered['other_cores']:.1f} of the 1 "
        "CPU cell sleep of shared ran on ("
    ), sentence
    summary, html = tmp_path / "summary.csv", tmp_path / "report" / "index.html"
    write_summary(rows, str(summary))
    config = {"experiments": {"shared": {"title": "A cell on a shared CPU"}}}
    verdict = tmp_path / "report" / "verdict.txt"
    write_report(str(summary), [], [path], config, "c0ffee42", str(html), verdict=str(verdict))
    # under the experiments' lines, once for the run, in the page and the terminal's text
    page = html.read_text()
    shown = page[page.index('<p class="other-load">') :]
    assert without_tags(shown[: shown.index("</p>") + 4]) == sentence  # a term there may be a link
    assert verdict.read_text().endswith(f"\n{sentence}\n")
