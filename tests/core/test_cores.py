"""The cores a cell may use: affinity mask, cgroup CPU quota and Slurm's CPUs, the fewest recorded
in the result's provenance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from feedbench.core import cores
from feedbench.core.result import read_result
from helpers.fake_cgroup import cgroup_tree


def test_the_smallest_quota_of_the_cgroup_and_its_parents(tmp_path):
    root, proc = cgroup_tree(
        tmp_path, "cpu.max", {"/": "max 100000", "/job": "250000 100000", "/job/step": "max 100000"}
    )
    assert cores.cgroup_cores(root, proc) == 2.5
    root, proc = cgroup_tree(tmp_path / "none", "cpu.max", {"/": "max 100000"})
    assert cores.cgroup_cores(root, proc) is None


def test_usable_cores_are_the_fewest_and_name_their_source(tmp_path):
    root, proc = cgroup_tree(tmp_path, "cpu.max", {"/job": "150000 100000"})
    facts = cores.usable_cores({}, root, proc)
    # a share of time, rounded down to whole cores
    assert facts["cgroup"] == 1 and facts["cgroup_quota"] == 1.5
    assert facts["usable"] == 1 and facts["bound_by"] == "cgroup"
    free = cores.usable_cores({}, str(tmp_path / "absent"), proc)
    assert free["usable"] == min(os.cpu_count(), len(os.sched_getaffinity(0)))
    assert free["cgroup"] is None and free["slurm"] is None


def test_slurm_cpus_per_task_first_then_the_jobs_cpus_on_the_node():
    assert cores.slurm_cpus({"SLURM_CPUS_PER_TASK": "3", "SLURM_CPUS_ON_NODE": "8"}) == 3
    assert cores.slurm_cpus({"SLURM_CPUS_ON_NODE": "8"}) == 8
    assert cores.slurm_cpus({}) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only: the affinity mask")
def test_a_cell_pinned_to_one_core_records_it(tmp_path):
    raw = {
        "scenario": "loader",
        "dataset": "memory",
        "model": "mlp",
        "input_size": 16,
        "batch_size": 8,
    }
    raw.update(steps=2, warmup_steps=1, torch_threads=1, device="cpu", num_samples=32)
    script = (
        "import json, os, sys\nos.sched_setaffinity(0, "
        "{sorted(os.sched_getaffinity(0))[0]})\nfrom feedbench.harness.runner import "
        "run\nsys.exit(run(json.loads(sys.argv[1]), sys.argv[2]))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "workflow"))
    env.pop("SLURM_CPUS_PER_TASK", None)
    env.pop("SLURM_CPUS_ON_NODE", None)
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(raw), str(tmp_path)], env=env, timeout=300
    )
    assert done.returncode == 0
    facts = read_result(str(tmp_path / "result.json"))["provenance"]["cores"]
    assert facts["usable"] == 1 and facts["affinity"] == 1
    assert facts["bound_by"] == ("machine" if os.cpu_count() == 1 else "affinity")


SPIN = '''
import time

import torch
from torch.utils.data import Dataset


class Spin(Dataset):
    """Burns 20 ms of CPU per sample: a CPU-bound worker."""

    def __len__(self):
        return 64

    def __getitem__(self, index):
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass
        return torch.zeros(16), 0


def make(ctx):
    return Spin()
'''


def worker_shares(tmp_path, **knobs) -> list[float]:
    from feedbench.harness.runner import run

    raw = {
        "scenario": "loader",
        "model": "mlp",
        "input_size": 16,
        "batch_size": 4,
        "num_workers": 2,
        "steps": 8,
    }
    raw.update(
        warmup_steps=1,
        torch_threads=1,
        device="cpu",
        num_samples=64,
        monitor_interval_s=0.05,
        **knobs,
    )
    assert run(raw, str(tmp_path)) == 0
    workers = read_result(str(tmp_path / "result.json"))["monitor"]["workers"]
    assert len(workers) == 2 and all(w["wall_s"] > 0 and w["cpu_s"] >= 0 for w in workers)
    return [w["cpu_share"] for w in workers]


def test_each_worker_records_its_cpu_time_beside_its_wall_time(tmp_path):
    """A worker that computes gets a CPU share several times that of one that sleeps (as on
    storage)."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "spin.py").write_text(SPIN)
    busy = worker_shares(
        tmp_path / "busy", dataset="spin:make", python_path=[str(tmp_path / "project")]
    )
    asleep = worker_shares(tmp_path / "asleep", dataset="memory", sample_delay_ms=20.0)
    assert min(busy) > 3 * max(asleep), (busy, asleep)


def test_multiprocessing_helpers_are_not_counted_as_workers():
    """A spawn loader's resource tracker outlives it: a later cell in the same process must not list
    it as a worker."""
    from multiprocessing import resource_tracker

    import psutil
    from feedbench.harness import monitor

    resource_tracker.ensure_running()
    me = psutil.Process()
    # a loaded machine: the tracker shows its command line once it has exec'd
    deadline = time.monotonic() + 30
    while not (
        helpers := {c.pid for c in me.children() if "resource_tracker" in " ".join(c.cmdline())}
    ):
        assert time.monotonic() < deadline, "no resource tracker started"
        time.sleep(0.05)
    assert not helpers & {w.pid for w in monitor._workers(me)}


ON_ONE_CORE = (
    "import json, os, sys\nos.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
    "from feedbench.harness.runner import run\n"
    "for raw, out in json.loads(sys.argv[1]):\n    assert run(raw, out) == 0, out\n"
)
ONE_CORE_CELL = {
    "scenario": "loader",
    "model": "mlp",
    "input_size": 16,
    "batch_size": 4,
    "num_workers": 4,
    "steps": 8,
}
ONE_CORE_CELL.update(
    warmup_steps=1, torch_threads=1, device="cpu", num_samples=64, monitor_interval_s=0.05
)


def on_one_core(cells: dict) -> dict:
    """Loader cells {out dir: knobs over ONE_CORE_CELL} run one after the other in one process whose
    affinity mask is one core (as taskset -c 0 would; torch imported once): their results."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "workflow"))
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE", "SLURM_JOB_ID"):
        env.pop(name, None)
    jobs = [({**ONE_CORE_CELL, **knobs}, str(out)) for out, knobs in cells.items()]
    done = subprocess.run(
        [sys.executable, "-c", ON_ONE_CORE, json.dumps(jobs)], env=env, timeout=600
    )
    assert done.returncode == 0
    return {out: read_result(os.path.join(str(out), "result.json")) for out in cells}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only: the affinity mask")
def test_cpu_bound_workers_beyond_the_cores_are_oversubscribed_and_sleeping_ones_are_not(tmp_path):
    """4 workers + the main process on one core: spinning workers are runnable nearly always while
    each gets a fraction of the core (starved, and shown so); workers that sleep as on storage are
    neither."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "spin.py").write_text(SPIN)
    cells = tmp_path / "results" / "cells" / "cpu"
    spin = {"dataset": "spin:make", "python_path": [str(tmp_path / "project")]}
    # one epoch
    sleep = {"dataset": "memory", "sample_delay_ms": 50.0, "steps": 16, "num_samples": 128}
    results = on_one_core({cells / "busy" / "rep1": spin, cells / "asleep" / "rep1": sleep})
    busy = results[cells / "busy" / "rep1"]["cpu"]
    assert busy["usable_cores"] == 1 and busy["demand_cores"] == 5
    assert busy["kind"] == "CPU-bound" and busy["oversubscribed"] is True, busy
    # starved: runnable, yet a fraction of a core
    assert busy["cpu_share"] < busy["runnable_share"] / 2, busy
    asleep = results[cells / "asleep" / "rep1"]["cpu"]
    assert (
        asleep["demand_cores"] == 5
        and asleep["kind"] == "waiting"
        and asleep["oversubscribed"] is False
    ), asleep

    # The summary carries it and the report marks the cell and names each cell's kind.
    from feedbench.analysis.aggregate import load_results, read_summary
    from feedbench.analysis.report import build, render

    paths = [str(cells / name / "rep1" / "result.json") for name in ("asleep", "busy")]
    load_results(paths).to_csv(tmp_path / "summary.csv", index=False)
    summary = read_summary(str(tmp_path / "summary.csv"))
    assert summary.set_index("cell")["oversubscribed"].to_dict() == {"asleep": False, "busy": True}
    html = render(
        build(
            summary,
            [],
            paths,
            {"experiments": {"cpu": {"matrix": {"dataset": ["memory", "spin"]}}}},
            "x",
        )
    )
    table = html[html.index('<table class="cells">') :]
    rows = {
        name: next(row for row in table.split("<tr")[1:] if f">{name}</code>" in row)
        for name in ("busy", "asleep")
    }
    assert 'CPU-bound <b class="oversubscribed">oversubscribed</b>' in rows["busy"]
    assert ">waiting</td>" in rows["asleep"] and "oversubscribed" not in rows["asleep"]


def test_the_cpu_load_rule():
    spinning = [{"cpu_share": 0.3, "runnable_share": 0.95}] * 3
    assert cores.cpu_load(spinning, 2, 1, 3)["oversubscribed"] is True
    # 4 cores hold 3 workers and the main process
    assert cores.cpu_load(spinning, 4, 1, 3)["oversubscribed"] is False
    assert (
        cores.cpu_load(spinning, 8, 2, 3)["oversubscribed"] is False
        and cores.cpu_load(spinning, 7, 2, 3)["oversubscribed"]
    )
    waiting = [{"cpu_share": 0.02, "runnable_share": cores.CPU_BOUND_SHARE - 0.01}] * 8
    assert (
        cores.cpu_load(waiting, 1, 1, 8)["kind"] == "waiting"
        and not cores.cpu_load(waiting, 1, 1, 8)["oversubscribed"]
    )
    assert (
        cores.cpu_load([], 4, 1, 0) is None
        and cores.cpu_load([], 4, 1, 2)["oversubscribed"] is None
    )
    assert (
        cores.most_workers(4, 1) == 3
        and cores.most_workers(1, 1) == 0
        and cores.most_workers(8, 2) == 3
    )


def test_the_trainers_threads_count_where_its_model_computes_on_the_cpu():
    """Issue #39: ranks x (workers + the trainer's threads): 2 CPU-bound workers beside a trainer of
    2 threads on 2 cores ask for 4; beside one of 1 thread, for 3. A loader cell or a GPU trainer
    counts its main process only."""
    spinning = [{"cpu_share": 0.9, "runnable_share": 0.95}] * 2
    assert (
        cores.trainer_cores("train", "cpu", 2) == 2
        and cores.trainer_cores("train", "cpu", None) == 1
    )
    assert (
        cores.trainer_cores("loader", "cpu", 2) == 1
        and cores.trainer_cores("train", "cuda", 8) == 1
    )
    load = cores.cpu_load(spinning, 2, 1, 2, trainer=2)
    assert (
        load["demand_cores"] == 4 and load["trainer_cores"] == 2 and load["oversubscribed"] is True
    )
    # 1 worker + 1 thread fit
    assert cores.cpu_load(spinning[:1], 2, 1, 1, trainer=1)["oversubscribed"] is False
    # 1 worker + 2 threads do not
    assert cores.cpu_load(spinning[:1], 2, 1, 1, trainer=2)["oversubscribed"] is True
    # per rank, on every rank
    assert cores.cpu_load(spinning, 8, 2, 2, trainer=2)["demand_cores"] == 8
    assert cores.most_workers(4, 1, trainer=2) == 2 and cores.most_workers(2, 1, trainer=2) == 0


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="two cores: the affinity mask",
)
def test_a_cpu_training_cell_whose_workers_and_threads_outnumber_its_cores_is_oversubscribed(
    tmp_path,
):
    """One CPU-bound worker beside a trainer on 2 cores: fits beside 1 intra-op thread, not beside
    2."""
    from feedbench.harness.masked import run_masked

    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "spin.py").write_text(SPIN)
    # a model that computes on the CPU
    net = "import torch\n\n\ndef make(ctx):\n    return torch.nn.Linear(16, 2)\n"
    (tmp_path / "project" / "net.py").write_text(net)
    train = {
        "scenario": "train",
        "dataset": "spin:make",
        "python_path": [str(tmp_path / "project")],
    }
    train.update(model="net:make", batch_size=4, num_workers=1, steps=8, warmup_steps=1)
    train.update(device="cpu", num_samples=64, monitor_interval_s=0.05)
    project = (str(tmp_path / "project"),)
    one = run_masked({**train, "torch_threads": 1}, str(tmp_path / "one"), 2, project)["cpu"]
    two = run_masked({**train, "torch_threads": 2}, str(tmp_path / "two"), 2, project)["cpu"]
    assert one["kind"] == two["kind"] == "CPU-bound", (one, two)
    assert one["usable_cores"] == two["usable_cores"] == 2
    assert (
        one["trainer_cores"] == 1 and one["demand_cores"] == 2 and one["oversubscribed"] is False
    ), one
    assert (
        two["trainer_cores"] == 2 and two["demand_cores"] == 3 and two["oversubscribed"] is True
    ), two


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only: the affinity mask")
def test_the_search_stops_at_the_cores_it_has(tmp_path):
    """Loader ceilings of CPU-bound workers at 0, 1 and 4 workers, measured on one core (one
    process, so torch is imported once): however high the prediction of 4 workers, the search stops
    at the level that fits one core (0 workers: the main process alone), runs the one above to show
    it, and says why; beyond_cores lifts the stop."""
    from feedbench.analysis.aggregate import load_results
    from feedbench.analysis.worker_load import loader_cpu
    from feedbench.core import search

    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "spin.py").write_text(SPIN)
    levels = [0, 1, 4]
    outs = {
        w: tmp_path / "results" / "cells" / "ceilings-loader" / f"num_workers-{w}" / "rep1"
        for w in levels
    }
    spin = {"dataset": "spin:make", "python_path": [str(tmp_path / "project")]}
    on_one_core({outs[w]: {**spin, "num_workers": w} for w in levels})
    paths = {w: str(outs[w] / "result.json") for w in levels}
    ceilings = load_results(list(paths.values()))
    cpu = {w: loader_cpu(ceilings, [paths[w]]) for w in levels}
    assert (
        cpu[0]["oversubscribed"] is None and cpu[1]["oversubscribed"] and cpu[4]["oversubscribed"]
    ), cpu
    assert (
        cpu[4]["usable_cores"] == 1
        and cpu[4]["demand_cores"] == 5
        and cpu[4]["workers_kind"] == "CPU-bound"
    )

    # A prediction that grows with the workers (as a loader measured on more cores would give) puts
    # the knee at 4.
    group = {
        "knobs": {},
        "cells": {w: f"num_workers-{w}" for w in levels},
        "predicted": {0: 10.0, 1: 20.0, 4: 40.0},
    }
    decided = search.plan("knee", "num_workers", [{**group, "cpu": cpu}], "num_workers-0")
    (stopped,) = decided["groups"]
    assert stopped["predicted_knee"] == 4 and stopped["knee"] == 0 and stopped["levels"] == [0, 1]
    assert stopped["why"].startswith("stopped at 0 workers by the cores: at 4, the predicted knee")
    assert "asked for 5 cores and it had 1" in stopped["why"] and stopped["why"] in search.sentence(
        decided
    )
    beyond = search.plan(
        "knee", "num_workers", [{**group, "cpu": cpu}], "num_workers-0", beyond=True
    )
    assert beyond["groups"][0]["knee"] == 4 and beyond["beyond_cores"] is True
