"""Cells a machine without CUDA runs alike, measured once (feedbench.plan.twins): which cells are
twins, and what a twin's job writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT
from feedbench.core.fit import cuda_possible
from feedbench.core.result import CELL_DIR, CELL_LOG, read_result
from feedbench.plan import twins
from feedbench.plan.matrix import build_cells
from helpers.plans import preset_cells

LOADER = {"scenario": "loader", "dataset": "synthetic", "image_size": 8, "batch_size": 4}


def cells_of(experiments: dict) -> dict:
    return {(c.experiment, c.id): c for c in build_cells({"experiments": experiments})}


def test_a_pinned_cell_runs_as_its_unpinned_twin_without_cuda():
    cells = cells_of(
        {
            "w": {"base": LOADER, "matrix": {"num_workers": [0, 2], "pin_memory": [True, False]}},
            # searched (as the Snakefile passes them) or on a GPU of its own: left alone
            "s": {"base": LOADER, "matrix": {"pin_memory": [False, True]}},
            "gpu": {"base": {**LOADER, "device": "cuda"}, "matrix": {"pin_memory": [False, True]}},
        }
    )
    assert twins.twins(cells, skip=["s"]) == {
        ("w", "num_workers-0_pin_memory-true"): "num_workers-0_pin_memory-false",
        ("w", "num_workers-2_pin_memory-true"): "num_workers-2_pin_memory-false",
    }


def test_with_cuda_only_cells_kept_on_the_cpu_are_twins():
    base = {**LOADER, "num_workers": 2}
    cells = cells_of(
        {
            "auto": {"base": base, "matrix": {"pin_memory": [False, True]}},
            "cpu": {"base": {**base, "device": "cpu"}, "matrix": {"pin_memory": [False, True]}},
        }
    )
    assert twins.twins(cells, cuda_available=True) == {
        ("cpu", "pin_memory-true"): "pin_memory-false"
    }


def test_knobs_that_need_workers_are_twins_at_zero_workers():
    cells = cells_of(
        {"p": {"base": LOADER, "matrix": {"num_workers": [0, 2], "prefetch_factor": [2, 4]}}}
    )
    assert twins.twins(cells) == {
        ("p", "num_workers-0_prefetch_factor-4"): "num_workers-0_prefetch_factor-2"
    }


def test_a_cell_that_cannot_run_has_no_twin():
    """An unchecked cell the harness would refuse (images without a data_dir) is left to its job,
    which says why in one line."""
    unchecked = build_cells(
        {
            "experiments": {
                "i": {
                    "base": {**LOADER, "dataset": "images"},
                    "matrix": {"pin_memory": [False, True]},
                }
            }
        },
        check=False,
    )
    assert twins.twins({(c.experiment, c.id): c for c in unchecked}) == {}


def test_the_default_matrix_measures_its_pinned_workers_cells_once():
    """config/config.yaml on a machine without CUDA: the 3 pinned cells of `workers` take their
    twins' results, nothing else does (9 of its 57 bench jobs)."""
    with open(os.path.join(ROOT, "config", "config.yaml")) as f:
        config = yaml.safe_load(f)
    planned = build_cells(config, images_dir="results/data/images")
    found = twins.twins({(c.experiment, c.id): c for c in planned})
    assert set(found) == {("workers", f"num_workers-{w}_pin_memory-true") for w in (0, 1, 2)}


def test_a_small_preset_on_the_cpu_measures_its_pinned_cells_once():
    cells = {(c.experiment, c.id): c for c in preset_cells("prefetch", "small")}
    found = twins.twins(cells)
    assert found and all("pin_memory-true" in cell for _, cell in found)
    assert all(
        twin == cell.replace("pin_memory-true", "pin_memory-false")
        for (_, cell), twin in found.items()
    )


def test_the_runs_answer_about_cuda_is_kept_for_its_jobs(tmp_path):
    """The run's parse decides once; a job's Snakemake (on a cluster node, say) inherits it."""
    environ = {}
    assert twins.cuda_here(environ) == cuda_possible()
    assert environ[twins.CUDA_VARIABLE] in ("0", "1")
    assert twins.cuda_here({twins.CUDA_VARIABLE: "1"}) is True
    assert twins.cuda_here({twins.CUDA_VARIABLE: "0"}) is False
    # any device file a CUDA runtime needs makes CUDA possible
    assert not cuda_possible((str(tmp_path / "nvidia*"),))
    (tmp_path / "nvidia0").write_text("")
    assert cuda_possible((str(tmp_path / "nvidia*"),))


def job(workdir, knobs: dict) -> subprocess.CompletedProcess:
    """Rule bench's command for a cell of experiment `e`, repeat 1, in workdir."""
    labels = {"experiment": "e", "repeat": 1, "baseline": False, "attempt": "first"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "feedbench",
            "job",
            "--cell",
            json.dumps({**knobs, **labels}),
            "--runtime",
            "5",
        ],  # fmt: skip
        cwd=workdir,
        env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "workflow")),
        capture_output=True,
        text=True,
        timeout=300,
    )


def folder(workdir, cell: str):
    return workdir / CELL_DIR.format(experiment="e", cell=cell, repeat=1)


@pytest.fixture(scope="module")
def measured_twin(tmp_path_factory):
    """The unpinned cell, measured by its job."""
    workdir = tmp_path_factory.mktemp("twins")
    knobs = {**LOADER, "num_workers": 1, "steps": 3, "warmup_steps": 1, "torch_threads": 1}
    ran = job(workdir, {**knobs, "cell": "pin-false"})
    assert ran.returncode == 0, ran.stderr
    return workdir, knobs


def test_a_twins_job_takes_the_measured_result_as_its_own(measured_twin):
    workdir, knobs = measured_twin
    ran = job(
        workdir, {**knobs, "pin_memory": True, "cell": "pin-true", "measured_as": "pin-false"}
    )
    assert ran.returncode == 0, ran.stderr
    log = (workdir / CELL_LOG.format(experiment="e", cell="pin-true", repeat=1)).read_text()
    assert log.startswith("not run: cell pin-false runs alike"), log
    twin = json.loads((folder(workdir, "pin-false") / "result.json").read_text())
    taken = json.loads((folder(workdir, "pin-true") / "result.json").read_text())
    assert taken["metrics"] == twin["metrics"] and taken["started_at"] == twin["started_at"]
    assert taken["requested"]["pin_memory"] is True and "measured_as" not in taken["requested"]
    assert (taken["cell"]["cell"], taken["cell"]["pin_memory"]) == ("pin-true", False)
    assert taken["adjustments"][0] == "pin_memory=true ignored: no accelerator to pin for"
    assert taken["adjustments"][-1].startswith("not measured again: cell pin-false runs alike")
    steps = folder(workdir, "pin-true") / twin["files"]["steps"]
    assert steps.read_text() == (folder(workdir, "pin-false") / twin["files"]["steps"]).read_text()
    assert "measured_as" not in (folder(workdir, "pin-true") / "cell.yaml").read_text()


def test_a_twin_measured_on_a_gpu_leaves_the_cell_to_measure_itself(measured_twin):
    """The plan's guess about CUDA is checked against what the twin recorded: a twin that ran on
    cuda (a cluster's GPU node) is not this cell's run, and neither is a twin that failed."""
    workdir, knobs = measured_twin
    result = folder(workdir, "pin-false") / "result.json"
    twin = json.loads(result.read_text())
    for name, changed in (
        ("on-gpu", {**twin, "cell": {**twin["cell"], "device": "cuda"}}),
        (
            "failed",
            {**twin, "status": "failed", "error": {"type": "E", "message": "e", "traceback": ""}},
        ),
    ):
        os.makedirs(folder(workdir, name))
        (folder(workdir, name) / "result.json").write_text(json.dumps(changed))
        read_result(str(folder(workdir, name) / "result.json"))  # a result the job can read
        ran = job(
            workdir, {**knobs, "pin_memory": True, "cell": f"{name}-pin", "measured_as": name}
        )
        assert ran.returncode == 0, ran.stderr
        own = json.loads((folder(workdir, f"{name}-pin") / "result.json").read_text())
        assert own["status"] == "ok" and own["started_at"] != twin["started_at"], name
        assert not any(n.startswith("not measured again") for n in own["adjustments"]), name
