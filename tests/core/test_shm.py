"""Shared memory: the bytes a cell's loader keeps in /dev/shm, checked before it starts.

The arithmetic and the refusals are plain unit tests. The done-when is real: in a private mount
namespace with a 1 MB tmpfs on /dev/shm (root only), a local run refuses a cell whose batches in
flight do not fit, with one line and before any job, and a tiny cell given sharing_strategy:
file_system runs there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import weakref

import feedbench
import pytest
import torch
import yaml
from conftest import ROOT
from feedbench.core import shm
from feedbench.core.ceilings import batch_bytes
from helpers.snakemake_run import snakemake_command, snakemake_env
from torch.utils.data import TensorDataset, default_collate

MB = 2**20
# A loader whose one batch is 8 x 65536 float32 (2 MB): more than a 1 MB /dev/shm holds even once.
BIG = {
    "scenario": "loader",
    "dataset": "memory",
    "model": "mlp",
    "input_size": 65536,
    "batch_size": 8,
}
# A few hundred bytes a batch: fits anywhere.
TINY = {
    "scenario": "loader",
    "dataset": "memory",
    "model": "mlp",
    "input_size": 16,
    "batch_size": 8,
}
RUN = {
    "steps": 3,
    "warmup_steps": 1,
    "torch_threads": 1,
    "device": "cpu",
    "num_samples": 64,
    "num_workers": 2,
}


def test_bytes_in_flight_are_the_prefetched_batches_plus_the_one_consumed():
    assert shm.in_flight(1000, 0, 8) == 0  # no workers: batches never leave the process
    assert shm.in_flight(1000, 4, None) == 1000 * (2 * 4 + 1)  # torch's prefetch_factor 2
    assert shm.in_flight(1000, 3, 5) == 1000 * (5 * 3 + 1)


def test_the_pinned_copies_of_the_batches_in_flight_are_counted_on_a_gpu_only():
    """pin_memory on a GPU: the pin thread holds a page-locked copy of each batch in flight, in
    CUDA's host allocator, not in /dev/shm (#24, the pinned pool); the harness passes pinned only
    there."""
    knobs = {**BIG, "num_workers": 2, "prefetch_factor": 2, "pin_memory": True}
    on_gpu = shm.facts(knobs, local=True, pinned=True)
    assert on_gpu["pinned_bytes"] == on_gpu["in_flight_bytes"] == 5 * batch_bytes(knobs)
    assert shm.facts(knobs, local=True)["pinned_bytes"] == 0
    # user code: no size before the batch is made
    user = {**knobs, "dataset": "mypackage.data:make_dataset"}
    assert shm.facts(user, local=True, pinned=True)["pinned_bytes"] is None


def test_the_pinned_pool_is_what_the_allocator_holds():
    """N3 (#35): PyTorch's pinned host allocator rounds each block up to a power of two and keeps
    it; the main thread pins with num_workers 0 too; the stream prefetcher holds its batches issued
    ahead. A batch of 250 x 1000 float32 (1,000,000 bytes) and 250 int64 labels (2,000 bytes) holds
    1 MiB + 2 KiB pinned, not 1,002,000 bytes."""
    assert [shm.pinned_block(n) for n in (1_000_000, 2**20, 2**20 + 1, 2_000, 1, 0)] == [
        2**20, 2**20, 2**21, 2**11, 1, 0,
    ]  # fmt: skip
    knobs = {
        "scenario": "train",
        "dataset": "memory",
        "model": "mlp",
        "input_size": 1000,
        "batch_size": 250,
    }
    block = 2**20 + 2**11

    def pool(**more):
        return shm.facts({**knobs, **more}, local=True, pinned=True)["pinned_bytes"]

    # 2 x 2 in flight + the one the step holds
    assert pool(num_workers=2, prefetch_factor=2) == 5 * block
    assert pool(num_workers=0) == 2 * block  # the one pinned while the step holds the last
    assert pool(num_workers=0, device_prefetch="stream", prefetch_depth=3) == (2 + 3) * block
    assert pool(num_workers=2, device_prefetch="stream") == (5 + 1) * block
    # no prefetcher there
    assert pool(num_workers=0, device_prefetch="stream", scenario="loader") == 2 * block
    # one batch of 4 x 250
    assert pool(num_workers=0, parallel="dp", gpus_per_node=4) == 2 * (2**22 + 2**13)
    # a loader per rank
    assert pool(num_workers=0, parallel="ddp", gpus_per_node=2) == 2 * 2 * block
    assert shm.facts({**knobs, "num_workers": 0}, local=True)["pinned_bytes"] == 0  # nothing pinned


def test_a_pinned_batch_the_knobs_do_not_shape_is_not_counted():
    """N9 (#50): torchvision-cuda's loader pins the JPEG bytes it yields (a block for each file, of
    its size), device_stages' loader the samples before its moved stages (of the pipeline's shape):
    neither is the float batch the knobs shape, which the count took, so the count is unknown."""
    knobs = {
        "scenario": "train",
        "dataset": "images",
        "model": "resnet18",
        "image_size": 64,
        "batch_size": 32,
    }
    # 1,572,864 bytes of images (a 2 MiB block) and 256 of labels, twice
    assert shm.facts(knobs, local=True, pinned=True)["pinned_bytes"] == 2 * (2**21 + 2**8)
    for more in ({"decoder": "torchvision-cuda"}, {"device_stages": "Normalize"}):
        assert shm.facts({**knobs, **more}, local=True, pinned=True)["pinned_bytes"] is None, more


@pytest.mark.parametrize(
    "more",
    [
        {},
        {"device_prefetch": "stream", "prefetch_depth": 3},
        {"scenario": "compute", "resident_batches": 3},
    ],
)
def test_the_pinned_batches_are_those_the_loop_holds_at_once(more):
    """N3 (#35) through the measured loop: with num_workers 0 the batches alive at once in the
    training process (each one pinned there on a GPU) are the count core.shm.pinned_batches gives:
    the one being made while the step holds the last, the stream prefetcher's batches ahead (on a
    CPU it still holds them), a compute cell's resident batches. Counted at each new batch."""
    alive, peak = [], []

    def collate(samples):
        batch = default_collate(samples)
        alive[:] = [ref for ref in alive if ref() is not None] + [weakref.ref(batch[0])]
        peak.append(len(alive))
        return batch

    data = TensorDataset(torch.randn(256, 6), torch.randint(3, (256,)))
    knobs = dict(device="cpu", steps=10, warmup_steps=1, batch_size=8, torch_threads=1, **more)
    result = feedbench.measure(dataset=data, model=torch.nn.Linear(6, 3), collate=collate, **knobs)
    assert result["status"] == "ok", result["error"]
    assert max(peak) == shm.pinned_batches({"scenario": "train", "num_workers": 0, **more})


def test_a_compute_cell_pins_its_resident_batches_together():
    knobs = {
        "scenario": "compute",
        "dataset": "memory",
        "model": "mlp",
        "input_size": 1000,
        "batch_size": 250,
    }
    # resident_batches 8
    assert shm.facts(knobs, local=True, pinned=True)["pinned_bytes"] == 8 * (2**20 + 2**11)
    with_workers = {**knobs, "num_workers": 2, "resident_batches": 3}
    assert shm.facts(with_workers, local=True, pinned=True)["pinned_bytes"] == (2 * 2 + 3) * (
        2**20 + 2**11
    )


def test_ranks_multiply_the_loaders_and_dp_the_batch():
    ddp = {"parallel": "ddp", "gpus_per_node": 2, "nodes": 2}
    assert shm.loaders(ddp, local=True) == (4, 1)  # every emulated node on this host
    assert shm.loaders(ddp, local=False) == (2, 1)  # a node's own ranks
    assert shm.loaders({"parallel": "dp", "gpus_per_node": 4}, local=False) == (1, 4)
    assert shm.loaders({}, local=True) == (1, 1)


def test_a_cell_that_fits_passes_and_one_that_does_not_gets_one_line():
    knobs = {**BIG, "num_workers": 4}
    batch = batch_bytes(knobs)
    need = batch * (2 * 4 + 1)
    assert shm.shm_error(knobs, batch, need, local=True) is None
    line = shm.shm_error(knobs, batch, need - 1, local=True, path="/x/shm")
    assert "\n" not in line
    assert (
        f"{need / MB:.1f} MB" in line
        and "4 workers x prefetch_factor 2 + 1 batches of 2.0 MB" in line
    )
    assert (
        "/x/shm has" in line
        and "--shm-size" in line
        and "fewer num_workers" in line
        and "prefetch_factor" in line
    )
    assert shm.shm_error({**knobs, "num_workers": 0}, batch, 0, local=True) is None
    assert shm.shm_error(knobs, None, 0, local=True) is None  # a batch of unknown size
    assert shm.shm_error(knobs, batch, None, local=True) is None  # no shared-memory filesystem


def test_plan_names_the_first_cell_that_does_not_fit_and_leaves_a_users_batch_alone(monkeypatch):
    monkeypatch.setattr(shm, "free_bytes", lambda path=None: MB)
    cells = [("e", "small", {**TINY, "num_workers": 2}), ("e", "big", {**BIG, "num_workers": 1})]
    assert shm.plan_error(cells).startswith(
        "bad config: experiments.e: cell big needs 6.0 MB of shared memory"
    )
    user = {**BIG, "num_workers": 1, "dataset": "mypkg.data:Big"}
    assert shm.plan_error([("e", "user", user)]) is None


def test_a_loader_that_ran_out_of_shared_memory_is_named():
    text = (
        "Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent "
        "call last):\nRuntimeError: unable to allocate shared memory(shm) for file "
        "</torch_1_2_0>: No space left on device (28)"
    )
    reason = shm.failure(text)
    assert (
        reason.startswith("the loader ran out of shared memory")
        and "No space left on device" in reason
    )
    assert "--shm-size" in reason and "\n" not in reason
    sigbus = "DataLoader worker (pid 7) is killed by signal: Bus error. It is possible that ..."
    assert "Bus error" in shm.failure(sigbus)
    assert shm.failure("CUDA out of memory") is None


def test_the_node_refuses_a_cell_that_does_not_fit_and_writes_its_failed_result(
    tmp_path, monkeypatch
):
    from feedbench.harness.runner import run

    monkeypatch.setattr(shm, "free_bytes", lambda path=None: MB)
    code = run({**BIG, **RUN, "num_workers": 1}, str(tmp_path))
    result = json.loads((tmp_path / "result.json").read_text())
    assert code == 2 and result["status"] == "failed"
    assert result["error"]["message"].startswith(
        "knob 'num_workers': value 1 needs 6.0 MB of shared memory"
    )


def _namespace_unusable() -> str | None:
    """Why a private mount namespace with its own /dev/shm cannot be made here, else None."""
    if not sys.platform.startswith("linux"):
        return "Linux only: /dev/shm and mount namespaces"
    if os.geteuid() != 0:
        return "needs root: mounting a tmpfs in a private mount namespace"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --mount is not allowed here: {probe.stderr.strip()}"
    return None


small_shm = pytest.mark.skipif(_namespace_unusable() is not None, reason=str(_namespace_unusable()))


def in_small_shm(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """`command` in a private mount namespace whose /dev/shm is a 1 MB tmpfs."""
    wrapped = [
        "unshare",
        "--mount",
        "sh",
        "-c",
        'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"',
        "sh",
    ]
    return subprocess.run(wrapped + command, capture_output=True, text=True, timeout=600, **kwargs)


def local_run(workdir, config: dict, *targets: str) -> subprocess.CompletedProcess:
    path = os.path.join(workdir, "config.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    command = snakemake_command(ROOT, workdir, *targets, "--configfile", path)
    return in_small_shm(command, env=snakemake_env())


@pytest.mark.slow
@small_shm
def test_a_local_plan_refuses_a_cell_bigger_than_shared_memory_before_any_job(tmp_path):
    config = {
        "defaults": {"repeats": 1, **{k: v for k, v in RUN.items() if k != "num_workers"}},
        "experiments": {
            "shm": {"title": "Too big", "base": BIG, "matrix": {"num_workers": [0, 1]}}
        },
    }
    run = local_run(tmp_path, config)
    assert run.returncode != 0
    lines = [line for line in (run.stderr + run.stdout).splitlines() if "of shared memory" in line]
    assert len(lines) == 1, run.stderr + run.stdout
    assert (
        "cell num_workers-1 needs 6.0 MB of shared memory" in lines[0]
        and "/dev/shm has 1.0 MB free" in lines[0]
    )
    assert not (tmp_path / "results" / "cells").exists()  # no job ran, not even the cell that fits


@pytest.mark.slow
@small_shm
def test_a_cell_given_the_file_system_strategy_runs_in_a_small_shared_memory(tmp_path):
    config = {
        "defaults": {"repeats": 1, **RUN},
        "experiments": {
            "fs": {"title": "Tiny", "base": TINY, "matrix": {"sharing_strategy": ["file_system"]}}
        },
    }
    target = "results/cells/fs/sharing_strategy-file_system/rep1/result.json"
    run = local_run(tmp_path, config, target)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / target).read_text())
    assert (
        result["status"] == "ok"
        and result["metrics"]["steps"] == 3
        and result["cell"]["sharing_strategy"] == "file_system"
    )


@pytest.mark.slow
@small_shm
def test_a_loader_that_runs_out_of_shared_memory_anyway_fails_with_that_reason(tmp_path):
    """The check passed (here: told there is room), the loader dies in a worker: the result names
    the cause."""
    raw = {**BIG, **RUN, "num_workers": 1}
    script = (
        "import json, sys\nfrom feedbench.core import shm\nshm.free_bytes = lambda path=None: 1 "
        "<< 40\nfrom feedbench.harness.runner import run\nsys.exit(run(json.loads(sys.argv[1]), "
        "sys.argv[2]))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "workflow"))
    run = in_small_shm([sys.executable, "-c", script, json.dumps(raw), str(tmp_path)], env=env)
    result = json.loads((tmp_path / "result.json").read_text())
    assert run.returncode == 1 and result["status"] == "failed", run.stderr[-3000:]
    assert result["error"]["message"].startswith("the loader ran out of shared memory (/dev/shm: ")
