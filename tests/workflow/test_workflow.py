"""The Snakemake workflow for real: a tiny config in a temporary directory, then what reruns when
something changes.

Every test runs a copy of the workflow (Snakefile, rules, scripts, the feedbench
package, schema, profile) so that editing the harness of the copy exercises the
code trigger without touching the source tree, and edits made elsewhere in the
tree meanwhile cannot disturb the run.
"""

from __future__ import annotations

import csv
import json
import os
import re

import pytest
import yaml
from feedbench.core.result import READ_LOG
from helpers.cells import tiny_mlp_base
from helpers.snakemake_run import copy_workflow, planned, snakemake, workflow_copy

pytestmark = [
    pytest.mark.slow,  # real Snakemake runs: about a minute for the module
    # one worker: the module fixture `done` runs the workflow once
    pytest.mark.xdist_group("workflow"),
]

TINY = {
    "defaults": {"repeats": 2, "steps": 3, "warmup_steps": 1, "device": "cpu"},
    "images": {"count": 16, "size": 32, "classes": 2},
    "experiments": {
        "loader": {
            "title": "Workers on tiny JPEGs",
            "base": {"scenario": "loader", "dataset": "images", "image_size": 16, "batch_size": 4},
            "matrix": {"num_workers": [0, 1]},
            "plot": {"x": "num_workers", "y": "samples_per_s", "kind": "line"},
        },
        "mlp": {
            "title": "A tiny mlp, and a cell that fails",
            "base": tiny_mlp_base(),
            "matrix": {"hidden_layers": [1]},
            # Valid config, but no CIFAR in the folder: the harness fails this cell at run time.
            "include": [{"dataset": "cifar10", "data_dir": "empty"}],
            "plot": [
                {"x": "hidden_layers", "kind": "bar"},
                {"x": "hidden_layers", "kind": "phases"},
            ],
        },
    },
}
CELLS = {
    "loader": ["num_workers-0", "num_workers-1"],
    "mlp": ["hidden_layers-1", "hidden_layers-1_data_dir-empty_dataset-cifar10"],
}


def failed_cells(config: dict) -> set[str]:
    """The cells of TINY that fail by design: every run retries them (retry_failed)."""
    return {k for k in everything(config) if "cifar10" in k}


def everything(config: dict) -> set[str]:
    return {
        f"{e}/{c}/rep{k}"
        for e, cells in CELLS.items()
        for c in cells
        for k in range(1, config["defaults"]["repeats"] + 1)
    }


def changed(config: dict, **edits) -> dict:
    """A deep copy of config with experiments.<name> keys replaced: changed(c, mlp={"base":
    {...}})."""
    config = json.loads(json.dumps(config))
    for name, keys in edits.items():
        config["experiments"][name].update(keys)
    return config


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """The workflow copy and a working directory where the tiny config has run to the report."""
    workflow = copy_workflow(tmp_path_factory.mktemp("workflow"))
    workdir = tmp_path_factory.mktemp("run")
    (workdir / "empty").mkdir()
    # every result read and validated, in every process of the run
    with pytest.MonkeyPatch.context() as env:
        env.setenv(READ_LOG, str(workdir.parent / "reads.txt"))
        run = snakemake(workflow, workdir, TINY)
    # The cifar10 cell fails by design: the run still ends with its report, names each failed repeat
    # and exits 1.
    assert run.returncode == 1, run.stderr[-4000:]
    failed = sorted(line for line in run.stderr.splitlines() if line.startswith("mlp / "))
    cell = "hidden_layers-1_data_dir-empty_dataset-cifar10"
    assert [line.split(":")[0] for line in failed] == [f"mlp / {cell} (rep{k})" for k in (1, 2)], (
        run.stderr[-4000:]
    )
    assert all(
        "cifar10 not found" in line and f"(log: logs/bench/mlp/{cell}/rep" in line
        for line in failed
    ), failed
    return workflow, workdir


def test_runs_end_to_end_and_writes_every_output(done):
    workflow, workdir = done
    for key in everything(TINY):
        folder = workdir / "results" / "cells" / key
        result = json.loads((folder / "result.json").read_text())
        experiment, cell, rep = key.split("/")
        assert (
            result["cell"]["experiment"] == experiment
            and result["cell"]["cell"] == cell
            and result["cell"]["repeat"] == int(rep[3:])
        )
        assert yaml.safe_load((folder / "cell.yaml").read_text())["cell"] == cell
        assert (folder / "benchmark.tsv").read_text().startswith("s\th:m:s")
        assert (workdir / "logs" / "bench" / f"{key}.log").exists()
        assert result["status"] == ("failed" if "cifar10" in cell else "ok"), result.get("error")
    assert len(list((workdir / "results" / "data" / "images" / "train").glob("*/*.JPEG"))) == 16
    rows = list(csv.DictReader(open(workdir / "results" / "summary.csv")))
    assert sorted((r["experiment"], r["cell"], r["repeat"], r["status"]) for r in rows) == sorted(
        (
            k.split("/")[0],
            k.split("/")[1],
            k.split("/")[2][3:],
            "failed" if "cifar10" in k else "ok",
        )
        for k in everything(TINY)
    )
    for name in TINY["experiments"]:
        assert (
            (workdir / "results" / "plots" / f"{name}.svg").read_text().lstrip().startswith("<?xml")
        )
    html = (workdir / "results" / "report" / "index.html").read_text()
    assert "Workers on tiny JPEGs" in html
    assert (
        "hidden_layers-1_data_dir-empty_dataset-cifar10" in html and "cifar10 not found" in html
    )  # the failure, listed


def test_a_run_reads_each_result_once(done):
    """Rule aggregate reads and validates each result.json once, into the records the report and the
    run's end read (feedbench.core.records): the report's failures and provenance, and the failed
    cells the run names, open none."""
    workflow, workdir = done
    reads = [
        os.path.realpath(path) for path in (workdir.parent / "reads.txt").read_text().splitlines()
    ]
    cells = os.path.realpath(workdir / "results" / "cells")
    assert sorted(reads) == sorted(
        os.path.join(cells, key, "result.json") for key in everything(TINY)
    ), reads
    records = json.loads((workdir / "results" / "records.json").read_text())
    assert [r["labels"]["cell"] for r in records] == [
        r["cell"] for r in csv.DictReader(open(workdir / "results" / "summary.csv"))
    ]


def test_nothing_changed_means_nothing_to_do_but_retry_the_failed_cells(done):
    workflow, workdir = done
    assert planned(workflow, workdir, TINY) == failed_cells(TINY)
    assert planned(workflow, workdir, dict(TINY, retry_failed=False)) == set()
    # A separate run of an all-ok matrix: nothing changed means nothing at all to do. One ok cell,
    # one repeat and no JPEGs are enough to show it (the rules, the retry input and the report are
    # the same as for TINY).
    ok_only = changed(TINY, mlp={"include": []})
    ok_only["experiments"] = {"mlp": ok_only["experiments"]["mlp"]}
    ok_only["defaults"] = dict(ok_only["defaults"], repeats=1)
    workdir_ok = workdir.parent / "run-ok"
    workdir_ok.mkdir(exist_ok=True)
    first = snakemake(workflow, workdir_ok, ok_only)
    assert first.returncode == 0, first.stderr[-3000:]
    run = snakemake(workflow, workdir_ok, ok_only, "--dry-run")
    assert run.returncode == 0 and "Nothing to be done" in run.stdout, run.stdout


def test_a_retried_cell_that_succeeds_is_left_alone_afterwards(tmp_path):
    """A cell fails (its image folder is empty), its cause is mended, the next run retries it alone;
    then it is done."""
    from feedbench.harness.images import make_images

    workflow, workdir = workflow_copy(tmp_path)
    (workdir / "imgs").mkdir()
    config = changed(
        TINY,
        mlp={
            "include": [
                {
                    "scenario": "loader",
                    "dataset": "images",
                    "data_dir": "imgs",
                    "image_size": 16,
                    "batch_size": 4,
                }
            ]
        },
    )
    config["experiments"] = {"mlp": config["experiments"]["mlp"]}
    config["defaults"] = dict(config["defaults"], repeats=1)
    assert snakemake(workflow, workdir, config).returncode == 1  # the cell failed: the run says so
    cell = "mlp/hidden_layers-1_batch_size-4_data_dir-imgs_dataset-images_image_size-16_scenario-loader/rep1"  # noqa: E501
    result = workdir / "results" / "cells" / cell / "result.json"
    assert json.loads(result.read_text())["status"] == "failed"
    assert planned(workflow, workdir, config) == {cell}
    make_images(str(workdir / "imgs"), count=8, size=24, classes=2)
    rerun = snakemake(workflow, workdir, config)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert re.findall(r"output: results/cells/(\S+)/result\.json", rerun.stdout + rerun.stderr) == [
        cell
    ]
    assert json.loads(result.read_text())["status"] == "ok"
    assert planned(workflow, workdir, config) == set()


def test_adding_a_level_runs_only_the_new_cells(done):
    workflow, workdir = done
    config = changed(TINY, loader={"matrix": {"num_workers": [0, 1, 2]}})
    assert planned(workflow, workdir, config) == {
        "loader/num_workers-2/rep1",
        "loader/num_workers-2/rep2",
    } | failed_cells(TINY)


def test_changing_a_knob_of_one_experiment_reruns_only_its_cells(done):
    workflow, workdir = done
    config = changed(TINY, mlp={"base": {**TINY["experiments"]["mlp"]["base"], "batch_size": 4}})
    assert planned(workflow, workdir, config) == {
        k for k in everything(TINY) if k.startswith("mlp/")
    }


def test_changing_a_default_reruns_every_cell(done):
    workflow, workdir = done
    config = json.loads(json.dumps(TINY))
    config["defaults"]["steps"] = 4
    assert planned(workflow, workdir, config) == everything(TINY)


def test_changing_the_harness_code_reruns_the_cells(done, tmp_path):
    workflow, workdir = done
    edited = copy_workflow(tmp_path, source=workflow)
    # same code elsewhere: only the retries
    assert planned(edited, workdir, TINY) == failed_cells(TINY)
    with open(os.path.join(edited, "workflow", "feedbench", "core", "metrics.py"), "a") as f:
        f.write("\n# an edit of the harness\n")
    assert planned(edited, workdir, TINY) == everything(TINY)


def test_changing_a_module_the_harness_does_not_run_reruns_no_cell(done, tmp_path):
    workflow, workdir = done
    edited = copy_workflow(tmp_path, source=workflow)
    with open(os.path.join(edited, "workflow", "feedbench", "plan", "matrix.py"), "a") as f:
        f.write("\n# an edit of the workflow's own module\n")
    assert planned(edited, workdir, TINY) == failed_cells(TINY)


def test_snakemake_report_builds(done, tmp_path):
    workflow, workdir = done
    out = tmp_path / "report.html"
    run = snakemake(workflow, workdir, TINY, "--report", str(out))
    assert run.returncode == 0, run.stderr[-4000:]
    assert out.stat().st_size > 0
