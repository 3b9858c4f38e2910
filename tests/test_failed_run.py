"""A run in which a cell failed says so and exits 1 (#33), through real Snakemake: a dataset factory that raises fails
every cell of its experiment; the run still makes its report, then names each failed cell in one line, and the other
experiment's cell is measured. Before, Snakemake printed "steps (100%) done" and exited 0."""

from __future__ import annotations

import csv
import json
import os

import pytest
from conftest import write_user_module
from snakemake_run import snakemake, workflow_copy

USER_CODE = """
def build(ctx, **args):
    raise RuntimeError("no shards under /data/text: is the volume mounted?\\nsecond line nobody needs")
"""
ERROR = "RuntimeError: no shards under /data/text: is the volume mounted?"
CONFIG = {
    "python_path": ["src"],  # relative to the config file, which snakemake() writes into the working directory
    "defaults": {"repeats": 1, "steps": 3, "warmup_steps": 1, "device": "cpu", "torch_threads": 1},
    "experiments": {
        "broken": {
            "base": {"scenario": "loader", "dataset": "text_shards:build", "batch_size": 4},
            "matrix": {"num_workers": [0, 1]},
        },
        "fine": {"base": {"scenario": "loader", "dataset": "memory", "input_size": 16, "batch_size": 4}},
    },
}
BROKEN = ["num_workers-0", "num_workers-1"]


def line(cell: str, where: str = "log: ") -> str:
    """The line the run's end prints for a cell of `broken`."""
    return f"broken / {cell} (rep1): {ERROR} ({where}logs/bench/broken/{cell}/rep1.log)"


def cell_lines(output: str) -> list[str]:
    """The lines of the run's output that name a cell of the config as failed."""
    return [text.strip() for text in output.splitlines() if text.strip().startswith(("broken / ", "fine / "))]


# The tests marked slow share this fixture's Snakemake run (three short cells), on one worker (xdist_group).
@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    """The workflow copy, its working directory with the user's module in src/, and the first run's process."""
    workflow, workdir = workflow_copy(tmp_path_factory.mktemp("failed-run"))
    write_user_module(workdir, "text_shards", USER_CODE)
    return workflow, workdir, snakemake(workflow, workdir, CONFIG)


@pytest.mark.slow
@pytest.mark.xdist_group("failed_run")
def test_the_run_makes_its_report_names_each_failed_cell_in_one_line_and_exits_1(failed):
    _, workdir, run = failed
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    assert (workdir / "results" / "report" / "index.html").exists()
    assert sorted(cell_lines(output)) == [line(cell) for cell in BROKEN], output[-4000:]
    assert "2 of 3 cell runs failed; the report lists them (results/report/index.html):" in output
    for cell in BROKEN:
        assert ERROR in (workdir / "logs" / "bench" / "broken" / cell / "rep1.log").read_text()
    result = json.loads((workdir / "results" / "cells" / "fine" / "base" / "rep1" / "result.json").read_text())
    assert result["status"] == "ok" and result["metrics"]["steps"] == 3, result["error"]
    with open(workdir / "results" / "summary.csv") as f:
        rows = {f"{r['experiment']}/{r['cell']}": r["status"] for r in csv.DictReader(f)}
    assert rows == {"broken/num_workers-0": "failed", "broken/num_workers-1": "failed", "fine/base": "ok"}


@pytest.mark.slow
@pytest.mark.xdist_group("failed_run")
def test_the_report_counts_the_failures_and_never_says_the_rest_completed(failed):
    _, workdir, _ = failed
    html = (workdir / "results" / "report" / "index.html").read_text()
    section = html[html.index('<section id="failed">') :]
    section = section[: section.index("</section>")]
    assert "2 of 3 runs failed, 1 completed. Experiment broken: all 2 runs failed." in section, section[:1500]
    assert "rest of the matrix" not in html
    broken = html[html.index('id="exp-broken"') :]
    assert "no cell of this experiment finished" in broken[: broken.index("</section>")]


@pytest.mark.slow
@pytest.mark.xdist_group("failed_run")
def test_a_dry_run_and_a_run_of_the_fine_cell_alone_exit_0(failed):
    """A dry run measures nothing; a run whose target is the fine cell alone does not answer for the broken ones."""
    workflow, workdir, _ = failed
    dry = snakemake(workflow, workdir, CONFIG, "--dry-run")
    assert dry.returncode == 0 and cell_lines(dry.stdout + dry.stderr) == [], dry.stdout[-3000:] + dry.stderr[-3000:]
    assert "broken/num_workers-0/rep1/result.json" in dry.stdout  # planned again: retry_failed
    target = "results/cells/fine/base/rep1/result.json"
    alone = snakemake(workflow, workdir, CONFIG, target, "--forcerun", "bench")
    assert alone.returncode == 0, alone.stderr[-4000:]
    assert f"output: {target}" in alone.stdout + alone.stderr and cell_lines(alone.stdout + alone.stderr) == []


@pytest.mark.slow
@pytest.mark.xdist_group("failed_run")
def test_a_failed_cell_an_earlier_run_left_still_fails_the_run_and_says_so(failed):
    """retry_failed: false keeps the failed results; a run that remakes the report still lists them, so it exits 1."""
    workflow, workdir, _ = failed
    run = snakemake(workflow, workdir, dict(CONFIG, retry_failed=False), "--forcerun", "aggregate")
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    assert "rule bench" not in output  # no cell ran
    earlier = "an earlier run's result, not run again this time; log: "
    assert sorted(cell_lines(output)) == [line(cell, earlier) for cell in BROKEN], output[-4000:]


def test_a_cells_line_comes_from_its_result_as_the_report_reads_it(tmp_path, monkeypatch):
    """Without Snakemake: no result says nothing, a failed one gives its error's first line, a damaged one its damage
    (plan.result.read_result decides, as for the summary)."""
    from feedbench.plan.failures import failed_cells_message, failure_line
    from feedbench.plan.job import result_path
    from feedbench.plan.result import failed_result, now, write_result

    monkeypatch.chdir(tmp_path)  # results/ and logs/ are relative to Snakemake's working directory
    labels = {"experiment": "e", "cell": "c", "repeat": 1}
    record = dict(failed_result(labels, None), started_at=now(), finished_at=now())
    record["error"] = {"type": "ValueError", "message": "the first line\nthe second", "traceback": ""}
    write_result(os.path.dirname(result_path("e", "c", 1)), record)
    os.makedirs(os.path.dirname(result_path("e", "d", 1)))
    with open(result_path("e", "d", 1), "w") as f:
        f.write('{"status": "ok"')
    assert failure_line("e", "c", 1, True) == "e / c (rep1): ValueError: the first line (log: logs/bench/e/c/rep1.log)"
    assert failure_line("e", "d", 1, False).startswith("e / d (rep1): UnusableResult: not valid JSON (")
    assert failure_line("e", "d", 1, False).endswith(
        "(an earlier run's result, not run again this time; log: logs/bench/e/d/rep1.log)"
    )
    assert failure_line("e", "none", 1, True) is None
    cells = [("e", "c", 1, True), ("e", "d", 1, False), ("e", "none", 1, True)]
    assert failed_cells_message(cells, "results/report/index.html").splitlines()[0] == (
        "feedbench: 2 of 3 cell runs failed; the report lists them (results/report/index.html):"
    )
    assert failed_cells_message(cells[2:], None) is None
