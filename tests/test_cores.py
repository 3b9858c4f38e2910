"""The cores a cell may use: affinity mask, cgroup CPU quota and Slurm's CPUs, the fewest recorded in the result's
provenance (issue #24, part 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from feedbench.plan import cores
from feedbench.plan.result import read_result


def cgroup_tree(tmp_path, limits: dict[str, str], own: str = "/job/step") -> tuple[str, str]:
    """A fake /sys/fs/cgroup with cpu.max files at the given paths, and a /proc/self/cgroup naming `own`."""
    root = tmp_path / "cgroup"
    for path, text in limits.items():
        folder = root / path.strip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpu.max").write_text(text + "\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text(f"0::{own}\n")
    return str(root), str(proc)


def test_the_smallest_quota_of_the_cgroup_and_its_parents(tmp_path):
    root, proc = cgroup_tree(tmp_path, {"/": "max 100000", "/job": "250000 100000", "/job/step": "max 100000"})
    assert cores.cgroup_cores(root, proc) == 2.5
    root, proc = cgroup_tree(tmp_path / "none", {"/": "max 100000"})
    assert cores.cgroup_cores(root, proc) is None


def test_usable_cores_are_the_fewest_and_name_their_source(tmp_path):
    root, proc = cgroup_tree(tmp_path, {"/job": "150000 100000"})
    facts = cores.usable_cores({}, root, proc)
    assert facts["cgroup"] == 1 and facts["cgroup_quota"] == 1.5  # a share of time, rounded down to whole cores
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
    raw = {"scenario": "loader", "dataset": "memory", "model": "mlp", "input_size": 16, "batch_size": 8}
    raw.update(steps=2, warmup_steps=1, torch_threads=1, device="cpu", num_samples=32)
    script = (
        "import json, os, sys\nos.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
        "from feedbench.harness.runner import run\nsys.exit(run(json.loads(sys.argv[1]), sys.argv[2]))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "workflow"))
    env.pop("SLURM_CPUS_PER_TASK", None)
    env.pop("SLURM_CPUS_ON_NODE", None)
    done = subprocess.run([sys.executable, "-c", script, json.dumps(raw), str(tmp_path)], env=env, timeout=300)
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

    raw = {"scenario": "loader", "model": "mlp", "input_size": 16, "batch_size": 4, "num_workers": 2, "steps": 8}
    raw.update(warmup_steps=1, torch_threads=1, device="cpu", num_samples=64, monitor_interval_s=0.05, **knobs)
    assert run(raw, str(tmp_path)) == 0
    workers = read_result(str(tmp_path / "result.json"))["monitor"]["workers"]
    assert len(workers) == 2 and all(w["wall_s"] > 0 and w["cpu_s"] >= 0 for w in workers)
    return [w["cpu_share"] for w in workers]


def test_each_worker_records_its_cpu_time_beside_its_wall_time(tmp_path):
    """A worker that computes gets a CPU share several times that of one that sleeps (as on storage)."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "spin.py").write_text(SPIN)
    busy = worker_shares(tmp_path / "busy", dataset="spin:make", python_path=[str(tmp_path / "project")])
    asleep = worker_shares(tmp_path / "asleep", dataset="memory", sample_delay_ms=20.0)
    assert min(busy) > 3 * max(asleep), (busy, asleep)


def test_multiprocessing_helpers_are_not_counted_as_workers():
    """A spawn loader's resource tracker outlives it: a later cell in the same process must not list it as a worker."""
    from multiprocessing import resource_tracker

    import psutil
    from feedbench.harness import monitor

    resource_tracker.ensure_running()
    me = psutil.Process()
    deadline = time.monotonic() + 30  # a loaded machine: the tracker shows its command line once it has exec'd
    while not (helpers := {c.pid for c in me.children() if "resource_tracker" in " ".join(c.cmdline())}):
        assert time.monotonic() < deadline, "no resource tracker started"
        time.sleep(0.05)
    assert not helpers & {w.pid for w in monitor._workers(me)}
