"""What each cell's workers hold: each worker's USS and PSS beside the main process's, the growth
per 1,000 samples, the samples until the cell's memory limit, and the verdict's copy-on-access
sentence."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time

import jsonschema
import pandas as pd
import psutil
import pytest
from conftest import ROOT
from feedbench.analysis import growth
from feedbench.analysis.aggregate import result_row
from feedbench.analysis.report import build as build_report
from feedbench.analysis.report import render
from feedbench.analysis.verdict import summarize_experiment
from feedbench.core import memory
from feedbench.core.records import record_of
from feedbench.core.result import schema
from feedbench.harness.memory import MemorySeries, _growth
from helpers.fake_cgroup import cgroup_tree

# Python objects of 2 KB: every page of the list's items holds an object header, so a worker that
# reads each item writes (copies) every page. 30,000 of them: 60 MB, split over the workers; the
# NumPy twin holds the same bytes in one array whose rows carry no reference count. (60,000 of 1 KB
# copy as much and cost twice the samples.) USER_CODE, imported by its path (the user_module
# fixture, tests/conftest.py)
USER_MODULE = "held_data"
USER_CODE = """
import numpy as np
import torch
from torch.utils.data import Dataset

ITEMS = 30_000
ITEM_BYTES = 2_000


class PythonList(Dataset):
    def __init__(self):
        self.items = [bytes([i % 251]) * ITEM_BYTES for i in range(ITEMS)]

    def __len__(self):
        return ITEMS

    def __getitem__(self, index):
        return torch.tensor([len(self.items[index])])


class NumpyRows(Dataset):
    def __init__(self):
        # the list's bytes, i % 251 (np.resize repeats 0..250), without 60 M int64 on the way (6 s on a busy machine)
        self.rows = np.resize(np.arange(251, dtype=np.uint8), ITEMS * ITEM_BYTES).reshape(ITEMS, ITEM_BYTES)

    def __len__(self):
        return ITEMS

    def __getitem__(self, index):
        return torch.tensor([int(self.rows[index, 0])])


def python_list(ctx):
    return PythonList()


def numpy_rows(ctx):
    return NumpyRows()
"""  # noqa: E501

# Two forked workers read every item each epoch, restarted at each boundary (persistent_workers
# off); 300 batches an epoch keep a worker's life long enough to have settled points to fit
# (harness.memory.SETTLE_S).
CELL = {
    "scenario": "loader",
    "device": "cpu",
    "torch_threads": 1,
    "batch_size": 100,
    "num_workers": 2,
    "multiprocessing_context": "fork",
    "epochs": 2,
    "warmup_steps": 1,
    "shuffle": False,
    "monitor_interval_s": 0.02,
}


def _run(tmp_path, name: str, **knobs) -> tuple[dict, dict]:
    """One cell in a process of its own, as the bench job runs it: a process that had held another
    cell's dataset reuses those freed pages, and each write there makes a page its workers still
    share their own (USS)."""
    out = tmp_path / "cells" / "held" / name / "rep0"
    script = "import json, sys\nfrom feedbench.harness.runner import run\n"
    script += "sys.exit(run(json.loads(sys.argv[1]), sys.argv[2]))"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "workflow"))
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps({**CELL, **knobs}), str(out)],
        env=env,
        timeout=300,
    )
    assert done.returncode == 0
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, schema())
    return result, result_row(record_of(result, str(out / "result.json")))


def test_a_python_list_grows_the_workers_and_a_numpy_twin_does_not(user_module, tmp_path):
    listed, listed_row = _run(
        tmp_path, "list", dataset="held_data:python_list", python_path=[user_module]
    )
    numpy, numpy_row = _run(
        tmp_path, "numpy", dataset="held_data:numpy_rows", python_path=[user_module]
    )
    held = listed["monitor"]["memory"]
    # each worker's own series, by id, one run per process: the workers restarted at the epoch
    # boundary
    assert [w["worker"] for w in held["workers"]] == [0, 1]
    assert all(
        len(w["runs"]) >= 2 and len({r["pid"] for r in w["runs"]}) == len(w["runs"])
        for w in held["workers"]
    )
    assert all(w["growth_mb_per_1k"] > 0.3 and w["r2"] > 0.8 for w in held["workers"]), held[
        "workers"
    ]
    assert held["main"]["uss_mb"] and held["main"]["pss_mb"] and held["limit"]["limit_mb"] > 0
    # each worker copies its half of 60 MB in an epoch (the fit starts after its start-up); the
    # floor is 16 MB
    assert listed_row["workers_uss_grown_mb"] >= 2 * memory.GROWTH_FLOOR_MB, held
    assert listed_row["samples_to_memory_limit"] > 0 and listed_row["memory_limit_by"] in (
        "ram",
        "cgroup",
        "slurm",
    )
    assert numpy_row["workers_uss_grown_mb"] < memory.GROWTH_FLOOR_MB / 2, numpy["monitor"][
        "memory"
    ]
    assert numpy_row["samples_to_memory_limit"] is None
    rows = pd.DataFrame([{**listed_row, "baseline": True}, {**numpy_row, "baseline": False}])
    matrix = {"dataset": ["held_data:python_list", "held_data:numpy_rows"]}
    note = summarize_experiment(rows, matrix)["memory"]
    # cells in words: the knob that varies (#49)
    listed_cell, numpy_cell = "dataset=held_data:python_list", "dataset=held_data:numpy_rows"
    assert note.startswith(f"cell {listed_cell}: the workers' memory (USS, summed) grows"), note
    assert (
        "copy-on-access" in note
        and "NumPy arrays or Arrow tables" in note
        and f"cell {numpy_cell}" not in note
    )
    html = render(
        build_report(rows, [], [], {"experiments": {"held": {"matrix": matrix}}}, "c0ffee42")
    )
    start = html.index('<small class="memory">')
    sentence = html[start : html.index("</small>", start)]
    assert (
        f"cell {listed_cell}:" in sentence
        and f"cell {numpy_cell}" not in sentence
        and html.count("copy-on-access") == 1
    )
    assert "worker MB per 1k samples" in html and "samples to memory limit" in html


def test_forkserver_workers_are_workers_and_the_server_is_not():
    """A forkserver's workers are the server's children and carry its command line: they are
    workers, the server (a child of the cell's process) a helper. Real processes."""
    from feedbench.harness.monitor import _workers

    context = multiprocessing.get_context("forkserver")
    workers = [context.Process(target=_sleeper, args=(30,)) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        found = {p.pid for p in _workers(psutil.Process())}
        assert {w.pid for w in workers} <= found
        servers = [
            p
            for p in psutil.Process().children()
            if "multiprocessing.forkserver" in " ".join(p.cmdline())
        ]
        assert servers and not {p.pid for p in servers} & found
    finally:
        for worker in workers:
            worker.terminate()
            worker.join()


def test_a_workers_start_up_is_not_fitted_as_growth():
    """A worker started anew at an epoch boundary starts while the loader waits (the count holds
    still): a spawned one imports torch, from 3 MB to 290 (as measured in a spawn cell). Then it
    reads without growing."""
    start_up = [3.0, 10.0, 85.0, 150.0, 230.0, 288.0]
    run = {
        "pid": 1,
        "samples": [256] * 6 + [272, 304, 336, 368, 400],
        "uss_mb": start_up + [288.4] * 5,
    }
    run["fit_from"] = 0
    found = _growth([run])
    assert abs(found["growth_mb_per_1k"]) < 0.5 and not memory.growing(
        found["grown_mb"], found["r2"]
    ), found
    waiting = {
        **run,
        "samples": run["samples"] + [400, 400],
        "uss_mb": run["uss_mb"] + [347.5, 300.0],
    }
    # shutting down: the count stopped
    assert _growth([waiting])["growth_mb_per_1k"] == found["growth_mb_per_1k"]
    # not settled yet: nothing to fit
    assert _growth([{**run, "fit_from": None}])["growth_mb_per_1k"] is None


def _sleeper(seconds: float) -> None:
    time.sleep(seconds)


def test_restarted_workers_take_the_ids_the_old_ones_left():
    """Real processes: two workers, shut down, two new ones. Each id keeps two runs, one per
    process, in start order."""
    me, series = psutil.Process(), MemorySeries()
    context = multiprocessing.get_context("fork")
    for generation in range(2):
        workers = [context.Process(target=_sleeper, args=(30,)) for _ in range(2)]
        for worker in workers:
            worker.start()
        for delivered in (0, 100):
            series.record(
                delivered + 1000 * generation, me, [psutil.Process(w.pid) for w in workers]
            )
        for worker in workers:
            # SIGKILL: the SIGTERM handler run_cell's runner left here only asks to stop
            worker.kill()
            worker.join()
    summary = series.summary("fork")
    assert [w["worker"] for w in summary["workers"]] == [0, 1]
    assert [len(w["runs"]) for w in summary["workers"]] == [2, 2]
    assert summary["main"]["samples"] == [0, 100, 1000, 1100] and summary["start_method"] == "fork"


def test_the_fit_gives_each_run_its_own_intercept():
    """A worker restarted at a boundary drops back: the within-run slope is the growth, not the
    drop."""
    found = memory.fit([([0, 1000, 2000], [10, 12, 14]), ([3000, 4000, 5000], [10, 12, 14])])
    assert found["mb_per_sample"] == pytest.approx(0.002) and found["r2"] == pytest.approx(1.0)
    assert found["span"] == 4000 and found["runs"] == 2
    assert memory.fit([([0], [1]), ([5, 5], [1, 2])]) is None  # no run spans two sample counts
    assert memory.samples_to_limit(1000.0, 400.0, 0.002) == 300_000
    assert (
        memory.samples_to_limit(1000.0, 1200.0, 0.002) == 0
        and memory.samples_to_limit(None, 0, 1) is None
    )
    assert (
        memory.growing(20.0, 0.9)
        and not memory.growing(4.0, 0.99)
        and not memory.growing(20.0, 0.1)
    )


def test_the_limit_is_the_smallest_of_ram_cgroup_and_slurm(tmp_path):
    root, proc = cgroup_tree(
        tmp_path, "memory.max", {"/": "max", "/job": str(3 * 2**30), "/job/step": "max"}
    )
    assert memory.cgroup_bytes(root, proc) == 3 * 2**30
    facts = memory.memory_limit({}, root, proc)
    assert facts["cgroup_mb"] == 3072 and facts["slurm_mb"] is None
    assert facts["bound_by"] == ("cgroup" if facts["ram_mb"] > 3072 else "ram")
    slurm = memory.memory_limit({"SLURM_MEM_PER_NODE": "1000"}, root, proc)
    assert slurm["limit_mb"] == 1000 and slurm["bound_by"] == "slurm"
    free = memory.memory_limit({}, str(tmp_path / "absent"), proc)
    assert free["bound_by"] == "ram" and free["limit_mb"] == free["ram_mb"] > 0


def test_cgroup_v1_and_its_no_limit(tmp_path):
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    proc = tmp_path / "proc_cgroup"
    proc.write_text("")
    assert memory.cgroup_bytes(str(tmp_path / "v1"), str(proc)) is None
    (v1 / "memory.limit_in_bytes").write_text(f"{2**30}\n")
    assert memory.cgroup_bytes(str(tmp_path / "v1"), str(proc)) == 2**30


def test_slurm_memory_per_node_else_per_cpu_times_its_cpus():
    assert (
        memory.slurm_bytes({"SLURM_MEM_PER_NODE": "4096", "SLURM_MEM_PER_CPU": "1"}) == 4096 * 2**20
    )
    assert (
        memory.slurm_bytes({"SLURM_MEM_PER_CPU": "2000", "SLURM_CPUS_ON_NODE": "4"}) == 8000 * 2**20
    )
    assert (
        memory.slurm_bytes({"SLURM_MEM_PER_CPU": "2000", "SLURM_CPUS_PER_TASK": "3"})
        == 6000 * 2**20
    )
    assert (
        memory.slurm_bytes({"SLURM_MEM_PER_CPU": "2000"}) is None and memory.slurm_bytes({}) is None
    )


def test_the_sentence_names_copy_on_access_for_forked_workers_only():
    cell = {
        "cell": "c",
        "growth_mb_per_1k": 2.0,
        "grown_mb": 40.0,
        "growth_r2": 0.99,
        "samples_to_limit": 5e6,
    }
    cell.update(memory_limit_mb=16000.0, memory_limit_by="cgroup")
    forked = growth.sentence({**cell, "start_method": "fork"})
    assert "copy-on-access" in forked and "(pytorch/pytorch #13246)" in forked
    assert "reaches the 16,000 MB it may use (cgroup) after about 5,000,000 more samples" in forked
    spawned = growth.sentence({**cell, "start_method": "spawn"})
    assert "not copy-on-access (spawn workers" in spawned and "NumPy" not in spawned
    assert growth.sentence({**cell, "grown_mb": float("nan")}) is None
