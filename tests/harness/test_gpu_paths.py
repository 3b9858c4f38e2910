"""The GPU paths' decisions, checked on the CPU where they can be: which device, which GPU, which
dtype, which tensors. What only a device can show is in test_gpu.py."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
import weakref

import feedbench
import pytest
import torch
from feedbench.core.cell import parse_cell
from feedbench.core.knobs import KnobError
from feedbench.harness import launch, runner
from feedbench.harness.batches import copied_bytes, unpinned_note
from feedbench.harness.distributed import World, node_gpus, rank_device
from feedbench.harness.fit import resolve
from feedbench.harness.loop import Autocast, Measurement, WithLoss, measure, wrap_parallel
from feedbench.harness.models import SleepModel
from feedbench.harness.monitor import Monitor
from feedbench.harness.prefetch import streamed
from torch.cuda._utils import _get_device_index


@pytest.mark.parametrize("world", [World(), World(rank=3, local_rank=1, world_size=4, node_rank=1)])
def test_every_cuda_device_has_an_index(world):
    """torch.cuda.set_device and init_process_group(device_id=) refuse a bare torch.device("cuda");
    the single-rank ddp cell got one (bug 1). _get_device_index is the check set_device makes first,
    before any CUDA call."""
    device = rank_device("cuda", world, gpu_count=2)
    assert device.index is not None
    assert _get_device_index(device) == world.local_rank
    with pytest.raises(ValueError, match="specified index"):  # what the bare device met
        _get_device_index(torch.device("cuda"))


def test_emulated_nodes_get_distinct_gpus():
    """2 emulated nodes x 4 ranks on an 8-GPU host: torchrun gives each node LOCAL_RANK 0-3, so
    without a slice of its own each node's ranks shared GPUs 0-3 (bug 2)."""
    visible = [f"GPU-{i}" for i in range(8)]  # CUDA_VISIBLE_DEVICES may name GPUs by UUID
    slices = node_gpus(2, 4, visible)
    placed = []
    for node, names in enumerate(slices):
        mine = names.split(",")
        for local_rank in range(4):
            device = rank_device(
                "cuda", World(node * 4 + local_rank, local_rank, 8, node), gpu_count=len(mine)
            )
            placed.append(mine[device.index])
    assert sorted(placed) == sorted(visible)


@pytest.mark.parametrize("nodes, gpus_per_node", [(1, 2), (2, 1)])
def test_more_ranks_than_gpus_on_a_host_are_refused(nodes, gpus_per_node):
    """ddp and independent ranks (the launcher's check, as dp's in resolve): 2 ranks on 1 visible
    GPU."""
    with pytest.raises(KnobError, match="more than the 1 GPU"):
        node_gpus(nodes, gpus_per_node, ["0"])


def test_sleep_model_calibrates_once_under_dataparallel_replicas():
    """DataParallel builds its replicas at every forward with _replicate_for_data_parallel (a
    shallow copy of the module's __dict__): a calibration kept in a replica was lost, and every step
    of every GPU paid it (bug 5). The calibration itself needs a GPU; here it is a function that
    counts its calls."""
    model = SleepModel(compute_ms=1.0)
    calls = []

    def calibrate(device):
        calls.append(device.index)
        return 1000.0 + device.index

    for _step in range(3):
        for gpu in range(2):
            # what DataParallel's replicate() does, per GPU
            replica = model._replicate_for_data_parallel()
            assert replica.cycles_per_ms(torch.device("cuda", gpu), calibrate) == 1000.0 + gpu
    assert calls == [0, 1]


def test_the_prefetcher_records_only_device_tensors():
    """A mover that keeps lengths on the host (for pack_padded_sequence): record_stream of a CPU
    tensor raises NotImplementedError, so the prefetcher crashed at its first batch (bug 7). That
    the CUDA tensors are recorded needs a GPU: test_gpu.py's stream prefetch tests."""
    lengths = torch.tensor([3, 2])
    with pytest.raises(NotImplementedError):  # what the prefetcher met
        lengths.record_stream(torch.Stream(device="cpu"))
    assert streamed({"tokens": torch.ones(2, 3), "lengths": lengths}) == []


def test_an_nvml_error_stops_gpu_sampling_only():
    """One NVML error ended the monitor's thread, and the host's CPU and memory samples with it.
    Here NVML is the real library, asked before nvmlInit: it raises as a failing GPU would."""
    import pynvml

    monitor = Monitor(0.01, torch.device("cpu"))
    monitor.nvml.handle, monitor.nvml.pynvml = object(), pynvml
    monitor.start()
    deadline = time.monotonic() + 10  # a busy machine only delays the samples
    while len(monitor.samples) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    monitor.stop()
    assert len(monitor.samples) >= 3 and all("host_cpu_pct" in sample for sample in monitor.samples)
    assert monitor.summary()["notes"][0].startswith("NVML failed while sampling")


def test_the_runner_builds_each_ranks_device_through_rank_device(tmp_path, monkeypatch):
    """Bug 1 through the runner itself: rank 1 of a ddp cell on a host of 2 GPUs runs on cuda:1, an
    indexed device. The host's GPUs are patched in (there is none here); the first CUDA call the
    runner makes with the rank's device, naming its GPU for the provenance, is where this test
    looks. The run then fails on the CUDA there is not."""
    asked = []

    def get_device_name(device=None):
        asked.append(device)
        raise RuntimeError("no GPU here: the device was seen")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", get_device_name)
    raw = {
        "device": "cuda",
        "parallel": "ddp",
        "gpus_per_node": 2,
        "scenario": "compute",
        "model": "mlp",
    }
    assert runner.run(raw, str(tmp_path), world=World(rank=1, local_rank=1, world_size=2)) != 0
    assert asked == [torch.device("cuda", 1)]


def test_each_emulated_node_gets_its_own_slice_of_the_visible_gpus(monkeypatch):
    """Bug 2 through the launcher: each torchrun of 2 emulated nodes x 2 ranks gets its own
    CUDA_VISIBLE_DEVICES, taken from the GPUs this host shows (patched: 4 named by UUID, none here);
    a CPU cell's nodes keep the environment."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c,GPU-d")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    cell = parse_cell({"device": "cuda", "parallel": "ddp", "gpus_per_node": 2, "nodes": 2})
    envs = launch._node_envs(cell, {"MASTER_PORT": "1"}, 2)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["GPU-a,GPU-b", "GPU-c,GPU-d"]
    assert all(env["MASTER_PORT"] == "1" for env in envs)
    cpu = parse_cell({"parallel": "ddp", "gpus_per_node": 2, "nodes": 2, "device": "cpu"})
    assert launch._node_envs(cpu, {"MASTER_PORT": "1"}, 2) == [{"MASTER_PORT": "1"}] * 2


def test_the_launcher_starts_each_emulated_node_with_its_own_slice_of_the_gpus(
    tmp_path, monkeypatch
):
    """Bug 2 at its call site (#50): launch() must start each node's torchrun in the environment
    _node_envs makes; a revert of that call (every node in the launcher's own environment) passed
    every CPU test. The host's GPUs are patched in (4 named by UUID, none here), and each node's
    command, in place of torchrun, prints the CUDA_VISIBLE_DEVICES it was started with, in its log:
    the launcher's real processes, environments and logs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c,GPU-d")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # torchrun per node, not srun
    show = [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]
    monkeypatch.setattr(launch, "torchrun_commands", lambda *args: [show, show])
    raw = {"device": "cuda", "parallel": "ddp", "gpus_per_node": 2, "nodes": 2}
    launch.launch(raw, parse_cell(raw), [], str(tmp_path), time_limit=60)
    seen = [(tmp_path / "ranks" / f"node{node}.log").read_text().strip() for node in (0, 1)]
    assert seen == ["GPU-a,GPU-b", "GPU-c,GPU-d"]


def test_wrap_parallel_hands_dataparallel_the_replica_in_the_cells_autocast():
    """Bug 4 through wrap_parallel: what DataParallel replicates for a bf16 dp cell on 2 GPUs is
    dp_replica's Autocast (on a host without CUDA, DataParallel keeps its module and runs it as is),
    and that replica computes in bf16 in a thread whose autocast default is float16, as in
    parallel_apply."""
    seen = []
    probe = torch.nn.Linear(4, 4)
    probe.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    cell = parse_cell({"amp": "bf16", "parallel": "dp", "gpus_per_node": 2, "device": "cuda"})
    wrapped = wrap_parallel(
        WithLoss(probe, lambda out, batch: out.float().mean()), cell, torch.device("cuda", 0)
    )
    assert isinstance(wrapped, torch.nn.DataParallel) and isinstance(wrapped.module, Autocast)
    replica = wrapped.module
    # the CPU's autocast stands in for CUDA's: the same thread-local default
    replica.device_type = "cpu"

    def worker():
        torch.set_autocast_dtype("cpu", torch.float16)
        with torch.amp.autocast("cpu", enabled=True):
            replica(torch.ones(2, 4))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [torch.bfloat16]


def test_tensors_already_on_a_device_are_neither_copied_nor_pinned():
    """N2 (#35): a batch decoded on the GPU (decoder torchvision-cuda, device_stages) has its images
    there already: they are not copied bytes, and is_pinned() is false for them, which named every
    such batch unpinned. Here a tensor on the meta device stands in for the GPU's: not in host
    memory. Only the host tensors count."""
    on_device, labels = torch.empty(4, 3, 8, 8, device="meta"), torch.zeros(4, dtype=torch.int64)
    assert copied_bytes((on_device, labels)) == 4 * 8
    assert unpinned_note({"image": on_device}) is None
    assert "1 of 1 host tensors, batch type tuple" in unpinned_note((on_device, labels))


def test_the_loop_counts_only_the_host_bytes_it_copies():
    """N2 through the measured loop: a batch whose samples a user's dataset already placed off the
    host, its labels on the host; the copied bytes the loop adds up (h2d_gb_per_s's numerator) are
    the labels' alone."""

    class OffHost(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, index):
            return torch.empty(6, device="meta"), index

    def to_device(batch, device, non_blocking):
        return [batch[0], batch[1].to(device)]  # the samples are where they are

    def step(model, batch, ctx):
        return model(torch.ones(len(batch[1]), 6)).mean()

    knobs = dict(steps=3, warmup_steps=1, batch_size=8, torch_threads=1, device="cpu")
    user = {
        "dataset": lambda ctx, **args: OffHost(),
        "model": lambda ctx, **args: torch.nn.Linear(6, 1),
    }
    user.update(to_device=to_device, step=step)
    knobs.update({name: f"feedbench.api:{name}_object" for name in user})
    cell, _ = resolve(parse_cell(knobs), False)
    m = Measurement()
    measure(cell, torch.device("cpu"), m, user=user)
    assert m.completed == 3 and m.h2d_bytes == 3 * 8 * 8  # 3 steps of 8 int64 labels


class Cycle:
    """Cyclic garbage: only the collector frees it."""

    def __init__(self):
        self.me = self


# a weak reference to the garbage of an earlier cell, as a forked worker inherits it
GARBAGE: list = []


class Inherited(torch.utils.data.Dataset):
    """A dataset that fails in a loader worker that inherited the earlier cell's garbage
    uncollected."""

    def __len__(self):
        return 32

    def __getitem__(self, index):
        if GARBAGE and GARBAGE[0]() is not None:
            raise RuntimeError("the worker inherited uncollected garbage of an earlier cell")
        return torch.zeros(6), index % 3


def test_a_cpu_cell_forks_its_workers_only_after_collecting_once_cuda_was_initialised(monkeypatch):
    """N5 (#35): in a process where CUDA was initialised (an earlier cell on the GPU: patched here,
    there is none), a CPU cell's loader collects before it forks its workers: a CUDA event in the
    inherited garbage, destroyed by the collector in a worker, aborts it ("CUDA error:
    initialization error"). The collector is off for the test, so the one collection that can free
    the garbage is the harness's own."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    garbage = Cycle()
    GARBAGE[:] = [weakref.ref(garbage)]
    del garbage
    gc.disable()
    try:
        knobs = dict(
            steps=3, warmup_steps=1, batch_size=8, torch_threads=1, device="cpu", num_workers=1
        )
        result = feedbench.measure(dataset=Inherited(), model=torch.nn.Linear(6, 3), **knobs)
    finally:
        gc.enable()
        GARBAGE.clear()
    assert result["status"] == "ok", result["error"]


FIRST_CELL = """
import gc, json, sys
import feedbench, torch
from feedbench.harness.loop import Measurement
from feedbench.harness.timing import PhaseClock

data = torch.utils.data.TensorDataset(torch.randn(64, 6), torch.randint(3, (64,)))
gc.collect()
gc.disable()  # what the cell leaves to the collector stays there until the end
result = feedbench.measure(dataset=data, model=torch.nn.Linear(6, 3), device=sys.argv[1], steps=3, warmup_steps=1,
                           batch_size=8, torch_threads=1)
gc.set_debug(gc.DEBUG_SAVEALL)  # the collected objects kept in gc.garbage, for a look
found = gc.collect()
held = (torch.nn.Module, torch.nn.Parameter, torch.optim.Optimizer, Measurement, PhaseClock, torch.cuda.Event)
print(json.dumps({"status": result["status"], "found": found,
                  "held": sorted({type(o).__name__ for o in gc.garbage if isinstance(o, held)})}))
"""  # noqa: E501


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_first_cell_of_a_process_leaves_no_garbage_holding_its_model_or_its_events(device):
    """N5 (#35): torch.optim imports torch._dynamo at the first optimizer of a process, and that
    import leaves a frame in a reference cycle whose callers' frames held the cell's model,
    optimizer and measurement (on a GPU, its parameters and CUDA events) for the collector, which
    could then run in a later cell's forked worker. A fresh process (the first cell), the collector
    off during the cell, then one collection with DEBUG_SAVEALL: what it found holds none of the
    cell. On a GPU (not yet run there) none of its CUDA events either."""
    done = subprocess.run(
        [sys.executable, "-c", FIRST_CELL, device], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["status"] == "ok"
    assert seen["found"] > 0  # the import's own cycles: the collector did look
    assert seen["held"] == []


def test_the_machines_facts_name_no_gpu_where_cuda_is_absent():
    """The provenance of a cuda device on a machine whose CUDA cannot be used (here: none, no
    driver) says no GPU: torch.cuda.get_device_name, which raises there, is read only inside the
    guard."""
    from feedbench.harness.provenance import machine_facts

    facts = machine_facts(torch.device("cuda", 0))
    assert (facts["gpu"], facts["gpu_count"], facts["driver"]) == (None, 0, None)


def test_a_broken_cuda_naming_its_gpu_still_writes_the_result(tmp_path, monkeypatch):
    """A CUDA that says it is there but fails at its first call (a lost driver, a GPU fallen off the
    bus): naming the GPU for the provenance, before the cell's guarded run, does not end the run
    unwritten. The cell fails on the CUDA it then really calls, and result.json says so."""

    def get_device_name(device=None):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", get_device_name)
    code = runner.run(
        {"device": "cuda", "scenario": "compute", "model": "mlp", "steps": 1}, str(tmp_path)
    )
    with open(tmp_path / "result.json") as f:
        result = json.load(f)
    assert code != 0 and result["status"] == "failed" and result["error"]["message"], result
    assert result["provenance"]["gpu"] is None
