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
from feedbench.analysis.other_load import cells, disturbed, note
from feedbench.analysis.report import cell_words, write_report
from feedbench.core.fit import TWIN_NOTE
from helpers.browser import without_tags
from helpers.cells import ENDLESS_SLEEP, cell_command


def summary(*rows: dict) -> pd.DataFrame:
    """Summary rows of finished single-process repeats on 2 CPUs over 2 s windows, `rows` over
    them."""
    base = {"experiment": "loader", "status": "ok", "window_s": 2.0, "affinity_cores": 2}
    return pd.DataFrame([{**base, "world_size": None, "adjustments": None, **row} for row in rows])


def test_a_tenth_of_the_cpus_and_a_fifth_of_a_core_is_other_load():
    rows = summary(
        {"cell": "quiet", "other_load_cores": 0.31},
        # half a core is over a tenth of 2 CPUs; 1.5 of 32 CPUs is under a tenth
        {"cell": "edge", "other_load_cores": 0.5},
        {"cell": "big", "other_load_cores": 1.5, "affinity_cores": 32},
        # the medians of the repeats, as the report's figures: one disturbed repeat of three is not
        *[{"cell": "once", "other_load_cores": load} for load in (0.0, 0.0, 1.0)],
        {"cell": "busy", "experiment": "train", "other_load_cores": 0.9},
    )
    assert [c["cell"] for c in disturbed(cells(rows))] == ["busy", "edge"]  # largest share first
    assert note(rows) == (
        "Measured beside other load: other work took 0.9 of the 2 CPUs cell busy of train ran on "
        "(45 %); 1 more cell also ran beside other load. Those figures are lower than a quiet "
        "machine gives; rerun them alone before comparing them."
    )
    # the cell in words, as the page names it (report.cell_words): a ceiling's id runs to 200
    long = summary({"cell": "x" * 80, "other_load_cores": 1.0})
    assert "2 CPUs cell num_workers=2 of loader ran on" in note(
        long, lambda experiment, cell: "cell num_workers=2" if cell == "x" * 80 else cell
    )


def test_what_is_not_other_load_or_cannot_be_read_as_it():
    """Rank 0's monitor counts the cell's other ranks on the host as other work; a twin repeats the
    cell it took its result from; a window under a second is read in too few clock ticks; a failed
    repeat measured nothing; results before the harness read it have no column."""
    rows = summary(
        {"cell": "ddp", "other_load_cores": 1.0, "world_size": 2},
        {"cell": "pinned", "other_load_cores": 1.0, "adjustments": TWIN_NOTE.format(twin="plain")},
        {"cell": "fast", "other_load_cores": 1.4, "window_s": 0.02},
        {"cell": "broken", "other_load_cores": 1.0, "status": "failed"},
    )
    assert disturbed(cells(rows)) == [] and note(rows) is None
    assert note(rows.drop(columns=["other_load_cores"])) is None


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
    # sleep steps on tiny images, one thread (helpers.cells): 30 of 50 ms, over MIN_WINDOW_S
    knobs = dict(ENDLESS_SLEEP, steps=30, warmup_steps=2, compute_ms=50.0, device="cpu")
    knobs.update(experiment="shared", cell="sleep", repeat=1, baseline=True)
    try:
        command = ["taskset", "-c", str(cpu), *cell_command(tmp_path / "cell", knobs)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
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
    sentence = note(rows)
    assert sentence.startswith(
        f"Measured beside other load: other work took {offered['other_cores']:.1f} of the 1 CPU "
        "cell sleep of shared ran on ("
    ), sentence
    written, html = tmp_path / "summary.csv", tmp_path / "report" / "index.html"
    write_summary(rows, str(written))
    config = {"experiments": {"shared": {"title": "A cell on a shared CPU"}}}
    # the page names the cell in words: its experiment's only cell
    sentence = note(rows, cell_words(rows, config))
    assert "of the 1 CPU the only cell of shared ran on (" in sentence, sentence
    verdict = tmp_path / "report" / "verdict.txt"
    write_report(str(written), [], [path], config, "c0ffee42", str(html), verdict=str(verdict))
    # under the experiments' lines, once for the run, in the page and the terminal's text
    page = html.read_text()
    shown = page[page.index('<p class="other-load">') :]
    assert without_tags(shown[: shown.index("</p>") + 4]) == sentence  # a term there may be a link
    assert verdict.read_text().endswith(f"\n{sentence}\n")
