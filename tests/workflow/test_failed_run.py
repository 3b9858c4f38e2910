"""A run in which a cell failed says so and exits 1, through real Snakemake: a dataset that cannot
be read in a loader worker fails every cell of its experiment; the run still makes its report, then
names each failed cell in one line, and the other experiment's cell is measured. Before, Snakemake
printed "steps (100%) done" and exited 0.

In the same run, the preflight (feedbench.core.preflight): a dataset factory that raises stops its
experiment before any of its cells is submitted, in one line, said once for the two experiments
that share it; the ceiling experiments derived from one of them wait for its preflight, check
nothing, and stop the cells that bound it alone (what else a preflight finds, and how it names it:
test_preflight.py)."""

from __future__ import annotations

import csv
import json
import os

import pytest
from conftest import write_user_module
from helpers.browser import without_tags
from helpers.snakemake_run import snakemake, workflow_copy

USER_CODE = """
import torch
from torch.utils.data import Dataset, get_worker_info


class Shards(Dataset):  # reads in the main process (so its preflight passes), not in a loader worker
    def __len__(self):
        return 16

    def __getitem__(self, i):
        if get_worker_info() is not None:
            raise RuntimeError("no shards under /data/text: is the volume mounted?\\nsecond line nobody needs")
        return torch.zeros(4), torch.tensor(0)


def build(ctx, **args):
    raise RuntimeError("no index under /data/text: is the volume mounted?\\nsecond line nobody needs")


def model():
    return torch.nn.Linear(4, 2)

"""  # noqa: E501
ERROR = (
    "RuntimeError: no shards under /data/text: is the volume mounted? (in DataLoader "
    "worker process 0)"
)
CONFIG = {
    # relative to the config file, which snakemake() writes into the working directory
    "python_path": ["src"],
    "defaults": {"repeats": 1, "steps": 3, "warmup_steps": 1, "device": "cpu", "torch_threads": 1},
    "experiments": {
        "broken": {
            "base": {"scenario": "loader", "dataset": "text_shards:Shards", "batch_size": 4},
            "matrix": {"num_workers": [1, 2]},
        },
        "fine": {
            "base": {"scenario": "loader", "dataset": "memory", "input_size": 16, "batch_size": 4}
        },
        # Stopped by its preflight: its dataset factory raises.
        "stopped": {
            "base": {"scenario": "loader", "dataset": "text_shards:build", "batch_size": 4},
            "matrix": {"num_workers": [0, 1]},
        },
        # The same fault, in a training experiment with ceilings: said once for both.
        "stopped-train": {
            "base": {"dataset": "text_shards:build", "model": "text_shards:model", "batch_size": 4},
            "ceilings": True,
        },
    },
}
BROKEN = ["num_workers-1", "num_workers-2"]
STOPPED = {
    ("stopped", "stopped-train"): "feedbench: experiments stopped, stopped-train stopped by their "
    "preflights (the same faults), none of their cells ran: dataset 'text_shards:build' raised "
    "RuntimeError: no index under /data/text: is the volume mounted? (traceback: "
    "logs/preflight/stopped.log)",
}
CEILINGS = ("ceilings-loader", "ceilings-compute")


def line(cell: str, where: str = "log: ") -> str:
    """The line the run's end prints for a cell of `broken`."""
    return f"broken / {cell} (rep1): {ERROR} ({where}logs/bench/broken/{cell}/rep1.log)"


def cell_lines(output: str) -> list[str]:
    """The lines of the run's output that name a cell of the config as failed."""
    return [
        text.strip()
        for text in output.splitlines()
        if text.strip().startswith(("broken / ", "fine / "))
    ]


# The tests marked slow share this fixture's Snakemake run (three short cells), on one worker
# (xdist_group).
@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    """The workflow copy, its working directory with the user's module in src/, and the first run's
    process."""
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
        assert (
            "no shards under /data/text"
            in (workdir / "logs" / "bench" / "broken" / cell / "rep1.log").read_text()
        )
    result = json.loads(
        (workdir / "results" / "cells" / "fine" / "base" / "rep1" / "result.json").read_text()
    )
    assert result["status"] == "ok" and result["metrics"]["steps"] == 3, result["error"]
    with open(workdir / "results" / "summary.csv") as f:
        rows = {
            f"{r['experiment']}/{r['cell']}": (r["status"], r["error_type"])
            for r in csv.DictReader(f)
        }
    stopped = ("failed", "StoppedByPreflight")
    ceilings = {key: rows.pop(key) for key in list(rows) if key.startswith("ceilings-")}
    assert rows == {
        "broken/num_workers-1": ("failed", "RuntimeError"),
        "broken/num_workers-2": ("failed", "RuntimeError"),
        "fine/base": ("ok", ""),
        "stopped/num_workers-0": stopped,
        "stopped/num_workers-1": stopped,
        "stopped-train/base": stopped,
    }
    assert sorted(key.partition("/")[0] for key in ceilings) == sorted(CEILINGS)
    assert set(ceilings.values()) == {stopped}


@pytest.mark.slow
@pytest.mark.xdist_group("failed_run")
def test_a_preflight_that_fails_submits_no_cell_of_its_experiment_and_says_so_in_one_line(failed):
    """The preflight's one line per stopped experiment: which factory, the exception's type and
    first line, and the log with its whole traceback; no bench job of the experiment ran, and each
    of its cells has a stopped record."""
    _, workdir, run = failed
    output = run.stdout + run.stderr
    for experiments, said in STOPPED.items():
        assert output.count(said) == 1, output[-4000:]
        for experiment in [*experiments, *CEILINGS]:
            assert not (workdir / "logs" / "bench" / experiment).exists()
            assert not list((workdir / "results" / "cells" / experiment).glob("*/rep1/result.json"))
        for experiment in experiments:
            assert (
                "Traceback (most recent call last)"
                in (workdir / "logs" / "preflight" / f"{experiment}.log").read_text()
            )
    # the ceilings' preflights waited for stopped-train's, and checked nothing: it was stopped
    assert "experiment ceilings-" not in output
    for experiment in CEILINGS:
        record = json.loads((workdir / "results" / "preflight" / f"{experiment}.json").read_text())
        assert record["status"] == "ok" and record["checked"] == [], record
        assert [s["why"] for s in record["skipped"]] == [
            "it bounds only cells of experiments their preflight stopped: stopped-train"
        ]
        (cell,) = (workdir / "results" / "cells" / experiment).glob("*/rep1/stopped.json")
        assert json.loads(cell.read_text())["error"]["message"].startswith(
            "stopped by the preflight of experiment stopped-train, whose cells it bounds, not "
            "run: dataset 'text_shards:build' raised RuntimeError: no index"
        )
    record = json.loads((workdir / "results" / "preflight" / "stopped.json").read_text())
    assert (
        record["status"] == "failed"
        and record["error"]["stage"] == "dataset"
        and record["checked"] == []
    )
    checked = json.loads((workdir / "results" / "preflight" / "broken.json").read_text())["checked"]
    assert [(c["cell"], c["stages"]) for c in checked] == [
        ("num_workers-1", ["dataset", "sample", "batch"])
    ]
    # no user code: no preflight
    assert not (workdir / "results" / "preflight" / "fine.json").exists()
    stopped = json.loads(
        (
            workdir / "results" / "cells" / "stopped" / "num_workers-1" / "rep1" / "stopped.json"
        ).read_text()
    )
    assert stopped["error"]["message"].startswith(
        "stopped by its experiment's preflight, not run: dataset 'text_shards:build' raised "
        "RuntimeError: no index"
    )


@pytest.mark.slow
@pytest.mark.xdist_group("failed_run")
def test_the_report_counts_the_failures_and_never_says_the_rest_completed(failed):
    _, workdir, _ = failed
    html = (workdir / "results" / "report" / "index.html").read_text()
    section = html[html.index('<section id="failed">') :]
    section = section[: section.index("</section>")]
    text = without_tags(section)
    assert (
        "7 of 8 runs failed, 1 completed. Experiment broken: all 2 runs failed. Experiment "
        "ceilings-compute: stopped by the preflight of the experiments it bounds, its only run "
        "not started. Experiment ceilings-loader: stopped by the preflight of the experiments it "
        "bounds, its only run not started. Experiment stopped: stopped by its preflight, none of "
        "its 2 runs started. Experiment stopped-train: stopped by its preflight, its only run not "
        "started."
    ) in text, text[:1500]
    assert "stopped by its experiment&#39;s preflight, not run: dataset" in section, section[:3000]
    assert "rest of the matrix" not in html
    broken = html[html.index('id="exp-broken"') :]
    assert "no cell of this experiment finished" in without_tags(
        broken[: broken.index("</section>")]
    )


@pytest.mark.slow
@pytest.mark.xdist_group("failed_run")
def test_a_dry_run_and_a_run_of_the_fine_cell_alone_exit_0(failed):
    """A dry run measures nothing; a run whose target is the fine cell alone does not answer for the
    broken ones."""
    workflow, workdir, _ = failed
    dry = snakemake(workflow, workdir, CONFIG, "--dry-run")
    assert dry.returncode == 0 and cell_lines(dry.stdout + dry.stderr) == [], (
        dry.stdout[-3000:] + dry.stderr[-3000:]
    )
    assert "broken/num_workers-1/rep1/result.json" in dry.stdout  # planned again: retry_failed
    # A failed preflight is tried again (the volume may be mounted now); its cells wait for it,
    # unplanned till then.
    assert (
        "output: results/preflight/stopped.json" in dry.stdout
        and "cells/stopped/" not in dry.stdout
    )
    target = "results/cells/fine/base/rep1/result.json"
    alone = snakemake(workflow, workdir, CONFIG, target, "--forcerun", "bench")
    assert alone.returncode == 0, alone.stderr[-4000:]
    assert (
        f"output: {target}" in alone.stdout + alone.stderr
        and cell_lines(alone.stdout + alone.stderr) == []
    )


@pytest.mark.slow
@pytest.mark.xdist_group("failed_run")
def test_a_failed_cell_an_earlier_run_left_still_fails_the_run_and_says_so(failed):
    """retry_failed: false keeps the failed results; a run that remakes the report still lists them,
    so it exits 1."""
    workflow, workdir, _ = failed
    run = snakemake(workflow, workdir, dict(CONFIG, retry_failed=False), "--forcerun", "aggregate")
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    # no cell ran, no preflight again
    assert "rule bench" not in output and "rule preflight" not in output
    earlier = "an earlier run's result, not run again this time; log: "
    assert sorted(cell_lines(output)) == [line(cell, earlier) for cell in BROKEN], output[-4000:]
    assert all(output.count(said) == 1 for said in STOPPED.values()), output[-4000:]


def test_a_cells_line_comes_from_its_result_as_the_report_reads_it(tmp_path, monkeypatch):
    """Without Snakemake: no result says nothing, a failed one gives its error's first line, a
    damaged one its damage (core.result.read_result decides, as for the summary); from the run's
    records, the same without reading them."""
    from feedbench.core.records import read_record, write_records
    from feedbench.core.result import READ_LOG, failed_result, now, write_result
    from feedbench.plan.failures import failed_cells_message, failure_line
    from feedbench.plan.job import result_path

    monkeypatch.chdir(tmp_path)  # results/ and logs/ are relative to Snakemake's working directory
    labels = {"experiment": "e", "cell": "c", "repeat": 1}
    record = dict(failed_result(labels, None), started_at=now(), finished_at=now())
    record["error"] = {
        "type": "ValueError",
        "message": "the first line\nthe second",
        "traceback": "",
    }
    write_result(os.path.dirname(result_path("e", "c", 1)), record)
    os.makedirs(os.path.dirname(result_path("e", "d", 1)))
    with open(result_path("e", "d", 1), "w") as f:
        f.write('{"status": "ok"')
    assert (
        failure_line("e", "c", 1, True) == "e / c (rep1): ValueError: the first line "
        "(log: logs/bench/e/c/rep1.log)"
    )
    assert failure_line("e", "d", 1, False).startswith(
        "e / d (rep1): UnusableResult: not valid JSON ("
    )
    assert failure_line("e", "d", 1, False).endswith(
        "(an earlier run's result, not run again this time; log: logs/bench/e/d/rep1.log)"
    )
    assert failure_line("e", "none", 1, True) is None
    cells = [("e", "c", 1, True), ("e", "d", 1, False), ("e", "none", 1, True)]
    assert failed_cells_message(cells, "results/report/index.html").splitlines()[0] == (
        "feedbench: 2 of 3 cell runs failed; the report lists them (results/report/index.html):"
    )
    assert failed_cells_message(cells[2:], None) is None
    # An experiment its preflight stopped: its one line, the report named on the last where no cell
    # failed.
    stopped = ["feedbench: experiment s stopped by its preflight, none of its cells ran: ..."]
    assert (
        failed_cells_message(cells[2:], "r.html", stopped) == f"{stopped[0]}; the report "
        "lists its cells (r.html)"
    )
    assert failed_cells_message(cells, None, stopped).splitlines()[:2] == [
        stopped[0],
        "feedbench: 2 of 3 cell runs failed:",
    ]
    # From the run's records (core.records, as rule aggregate writes them): the same lines, no
    # result.json opened.
    records = "results/records.json"
    write_records([read_record(result_path("e", cell, 1)) for cell in ("c", "d")], records)
    message = failed_cells_message(cells, "results/report/index.html")
    monkeypatch.setenv(READ_LOG, str(tmp_path / "reads.txt"))
    assert failed_cells_message(cells, "results/report/index.html", records=records) == message
    assert not (tmp_path / "reads.txt").exists()
