"""GPU paths: CUDA events, the side-stream prefetcher, pinned copies, NVML. Skipped without a GPU.

Run on a GPU machine with `.venv/bin/python -m pytest -m gpu -v` and record what
you saw in docs/results/gpu-validation.md.
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.gpu

SLEEP = dict(
    model="sleep",
    dataset="memory",
    image_size=32,
    batch_size=32,
    num_samples=1024,
    steps=30,
    warmup_steps=5,
    device="cuda",
)


def best_of_alternating(run_cell, knobs: dict, rounds: int = 2, **choices) -> list[dict]:
    """The fastest of `rounds` runs of each choice of one knob, taken in turn after one run that is
    thrown away.

    On an H200 a pair of single runs compared the first cell of a process, its GPU still at idle
    clocks, with the second: the first ran 13 % slow whichever mode it measured. Alternating spreads
    clock and heat drift over both.
    """
    ((knob, values),) = choices.items()
    run_cell(**knobs, **{knob: values[0]})
    runs: dict = {value: [] for value in values}
    for _ in range(rounds):
        for value in values:
            code, result = run_cell(**knobs, **{knob: value})
            assert code == 0, result["error"]
            runs[value].append(result)
    return [max(runs[value], key=lambda r: r["metrics"]["samples_per_s"]) for value in values]


def test_gpu_sleep_model_is_timed_by_events(run_cell):
    code, result = run_cell(**SLEEP, compute_ms=20, timing="events")
    assert code == 0, result["error"]
    assert result["timing"]["effective"] == "events"
    fwd = result["metrics"]["phases"]["fwd"]["median_ms"]
    assert fwd == pytest.approx(20, rel=0.05)
    assert result["metrics"]["step_ms"]["median"] == pytest.approx(20, rel=0.1)


@pytest.mark.timing
@pytest.mark.parametrize("timing", ["events", "sync"])
def test_the_stall_is_the_gpus_idle_time_not_the_hosts_wait(run_cell, timing):
    """One worker delivers a batch every 40 ms, the GPU computes 36 ms of it: the GPU idles 4 ms of
    each 40 ms step. With events the host runs ahead and waits out the GPU's compute for the next
    batch too: on an H200 the stall read from that wait was 88 % where the GPU idled 10 % (#27, the
    calibration run on a GPU)."""
    code, result = run_cell(
        model="sleep",
        dataset="synthetic",
        image_size=8,
        batch_size=4,
        sample_delay_ms=10,
        num_workers=1,
        compute_ms=36,
        num_samples=4096,
        steps=20,
        warmup_steps=4,
        device="cuda",
        timing=timing,
        torch_threads=1,
    )
    assert code == 0, result["error"]
    metrics = result["metrics"]
    assert metrics["step_ms"]["median"] == pytest.approx(40, rel=0.05)
    assert metrics["stall_pct"] == pytest.approx(10, abs=4), metrics["phases"]
    if timing == "events":
        assert metrics["phases"]["wait"]["share"] > 0.5  # what the stall read before


@pytest.mark.timing
@pytest.mark.xfail(
    reason="measured on an H200 (2026-11-25): events 7 % slower than sync on this "
    "launch-bound ResNet-18, the fastest of two alternating runs each (6688 against "
    "7215 samples/s); cause not found yet (docs/results/gpu-validation.md)",
    strict=False,
)
def test_events_and_sync_agree_on_phase_times(run_cell):
    knobs = dict(
        model="resnet18",
        dataset="memory",
        image_size=64,
        num_classes=100,
        batch_size=64,
        num_samples=1024,
        steps=50,
        warmup_steps=5,
        device="cuda",
        torch_threads=1,  # one thread, pinned: timed
    )
    events, sync = best_of_alternating(run_cell, knobs, timing=("events", "sync"))
    for phase in ("fwd", "bwd"):
        assert events["metrics"]["phases"][phase]["median_ms"] == pytest.approx(
            sync["metrics"]["phases"][phase]["median_ms"], rel=0.25
        )
    # The instrument must not slow the loop: events keep the host ahead of the GPU.
    assert events["metrics"]["samples_per_s"] >= 0.95 * sync["metrics"]["samples_per_s"]


def test_naive_timing_misplaces_asynchronous_work(run_cell):
    knobs = dict(SLEEP, compute_ms=20)
    _, naive = run_cell(**knobs, timing="naive")
    # The host returns from the kernel launch at once: the 20 ms lands in another phase.
    assert naive["metrics"]["phases"]["fwd"]["median_ms"] < 5


def test_pinned_copies_beat_pageable(run_cell):
    code, result = run_cell(
        scenario="transfer", transfer_sizes=[64 * 2**20], steps=10, warmup_steps=2, device="cuda"
    )
    assert code == 0
    transfer = result["metrics"]["transfer"]
    assert transfer["peak_gb_per_s_pinned"] > transfer["peak_gb_per_s_pageable"]


@pytest.mark.timing
@pytest.mark.xfail(
    reason="measured on an H200 (2026-11-25): stream prefetch 4-6 % slower than none on this "
    "MLP in two runs (the fastest of two alternating runs: 40557 against 43100 "
    "samples/s); cause not found yet (docs/results/gpu-validation.md)",
    strict=False,
)
def test_stream_prefetch_overlaps_copy_with_compute(run_cell):
    knobs = dict(
        model="mlp",
        dataset="memory",
        input_size=4096,
        width=4096,
        hidden_layers=4,
        batch_size=4096,
        num_samples=4096 * 8,
        steps=30,
        warmup_steps=5,
        device="cuda",
        pin_memory=True,
        non_blocking=True,
        torch_threads=1,  # one thread, pinned: timed
    )
    none, stream = best_of_alternating(run_cell, knobs, device_prefetch=("none", "stream"))
    assert stream["metrics"]["phases"]["h2d"]["median_ms"] > 0
    # The study's gain is 1-3 %, within the noise of two runs: prefetch must not lose beyond that.
    assert stream["metrics"]["samples_per_s"] >= 0.97 * none["metrics"]["samples_per_s"]


def test_nvml_monitor_samples_gpu(run_cell):
    code, result = run_cell(**SLEEP, compute_ms=50, monitor_interval_s=0.1)
    stats = result["monitor"]["stats"]
    assert stats["gpu_util_pct"]["max"] > 50
    assert result["provenance"]["gpu"] and result["provenance"]["driver"]


def test_resnet_fp16_channels_last_on_gpu(run_cell):
    code, result = run_cell(
        model="resnet50",
        dataset="synthetic",
        image_size=64,
        batch_size=16,
        steps=5,
        warmup_steps=2,
        amp="fp16",
        channels_last=True,
        device="cuda",
        num_workers=2,
        pin_memory=True,
        non_blocking=True,
        profile=True,
    )
    assert code == 0, result["error"]
    assert result["metrics"]["cuda_init_s"] > 0


def test_a_stopped_cell_keeps_its_gpu_phases(tmp_path):
    """Stopped by its time limit with the host ahead of the GPU: the events were read
    unsynchronised, elapsed_time raised "device not ready", and every GPU phase was dropped."""
    from feedbench.harness.runner import run

    code = run(
        dict(SLEEP, compute_ms=5, steps=1_000_000, timing="events"), str(tmp_path), time_limit=8
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert code == 1 and result["error"]["type"] == "Terminated"
    assert result["metrics"]["phases"]["fwd"]["median_ms"] == pytest.approx(5, rel=0.1)
    assert not any("GPU phases not recorded" in note for note in result["adjustments"])


@pytest.mark.timing
def test_sync_timing_keeps_the_stream_prefetch_overlap(run_cell):
    """timing: sync waits for the compute stream only: a device-wide sync also waited for the side
    stream's next copy, a wait in the step and in no phase, which removed the overlap it
    measured."""
    code, result = run_cell(
        # 100 MB batches: copies of milliseconds
        **dict(SLEEP, image_size=256, batch_size=128, num_samples=512),
        compute_ms=20,
        timing="sync",
        device_prefetch="stream",
        pin_memory=True,
        torch_threads=1,  # one thread, pinned: timed
    )
    assert code == 0, result["error"]
    phases = {name: p["median_ms"] for name, p in result["metrics"]["phases"].items()}
    assert phases["h2d"] > 1  # an H200 copied these 100 MB in 1.9 ms
    outside = result["metrics"]["step_ms"]["median"] - (
        phases["wait"] + phases["fwd"] + phases["bwd"] + phases["opt"]
    )
    assert outside < 0.5 * phases["h2d"]


def test_single_rank_ddp_on_a_gpu(run_cell):
    """A bare torch.device("cuda") made set_device and init_process_group refuse the cell."""
    code, result = run_cell(**SLEEP, compute_ms=5, parallel="ddp")
    assert code == 0, result["error"]


needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


@needs_two
def test_bf16_under_dp_on_two_gpus():
    """Every DataParallel replica computes in bfloat16, not in its thread's default float16."""
    from feedbench.core.cell import parse_cell
    from feedbench.harness.loop import WithLoss, wrap_parallel

    seen = []
    probe = torch.nn.Linear(64, 64).cuda(0)
    probe.register_forward_hook(
        lambda module, args, out: seen.append((out.device.index, out.dtype))
    )
    cell = parse_cell({"amp": "bf16", "parallel": "dp", "gpus_per_node": 2, "device": "cuda"})
    model = wrap_parallel(
        WithLoss(probe, lambda out, batch: out.float().mean()), cell, torch.device("cuda", 0)
    )
    with torch.autocast("cuda", dtype=torch.bfloat16):  # as the harness's train_step enters it
        model(torch.ones(8, 64, device="cuda:0"))
    assert sorted(seen) == [(0, torch.bfloat16), (1, torch.bfloat16)]


@needs_two
def test_sleep_model_under_dp_takes_its_compute_time(run_cell):
    """The calibration ran at every step of every replica: ~10 ms and a host sync more per step."""
    code, result = run_cell(**SLEEP, compute_ms=20, parallel="dp", gpus_per_node=2, timing="events")
    assert code == 0, result["error"]
    assert result["metrics"]["step_ms"]["median"] == pytest.approx(20, rel=0.15)


@needs_two
def test_ddp_on_two_emulated_nodes_uses_distinct_gpus(tmp_path):
    """Each emulated node's torchrun numbers LOCAL_RANK from 0: without a slice of GPUs of its own,
    node 1's rank took node 0's GPU and NCCL refused it."""
    from feedbench.__main__ import run_or_launch

    knobs = dict(SLEEP, compute_ms=5, steps=5, parallel="ddp", gpus_per_node=1, nodes=2)
    assert run_or_launch(knobs, str(tmp_path)) == 0


@pytest.mark.parametrize("scenario, num_workers", [("loader", 2), ("loader", 0), ("train", 0)])
def test_the_pinned_pool_holds_what_the_result_counts(tmp_path, scenario, num_workers):
    """pin_memory on a GPU: the page-locked copies of the batches the cell holds pinned, as CUDA's
    host allocator saw them in a fresh process, against the result's shm.pinned_bytes
    (core.shm.pinned_pool), and the pool the result says the allocator held
    (shm.pinned_held_bytes). Loader cells: batches of sizes that are not powers of two (1,000,000
    bytes of features, 2,000 of labels), which the allocator rounds up to 1 MiB and 2 KiB blocks;
    with num_workers 0 the main thread pins; the step may hold one batch more. The train cell (N9,
    #50) copies 3,072,000-byte batches non_blocking under events while the GPU spins 20 ms a step:
    the host runs ahead, and each freed batch whose copy is still queued keeps its block, which no
    count from the knobs can know; the held pool is at least the count."""
    import subprocess
    import sys

    if not hasattr(torch.cuda, "host_memory_stats"):
        pytest.skip(
            f"torch {torch.__version__} has no torch.cuda.host_memory_stats to read the pinned pool"
        )
    knobs = dict(
        scenario=scenario, dataset="memory", input_size=1000, batch_size=250, num_samples=8000,
        num_workers=num_workers, pin_memory=True, steps=20, warmup_steps=2, device="cuda", torch_threads=1,  # noqa: E501
    )  # fmt: skip
    if num_workers:
        knobs["prefetch_factor"] = 2
    if scenario == "train":
        knobs.update(
            model="sleep", compute_ms=20, image_size=32, non_blocking=True, timing="events"
        )
    script = (
        "import json, sys, torch\n"
        "from feedbench.harness.runner import run\n"
        "assert run(json.loads(sys.argv[1]), sys.argv[2]) == 0\n"
        "print(json.dumps(torch.cuda.host_memory_stats()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(knobs), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    with open(tmp_path / "result.json") as f:
        found = json.load(f)["shm"]
    pinned, held = found["pinned_bytes"], found["pinned_held_bytes"]
    assert held == stats["allocated_bytes.current"], sorted(stats)
    if scenario == "train":  # one batch pinned while the step holds the last: 4 MiB + 2 KiB each
        assert pinned == 2 * (2**22 + 2**11) and held >= pinned, (pinned, held)
        return
    block = 2**20 + 2**11  # one batch as the allocator holds it
    assert pinned == (5 if num_workers else 2) * block
    assert block <= held <= pinned + block
    # whole rounded blocks, not multiples of 1,002,000 bytes
    assert held % 2**11 == 0, held


def test_a_compute_cell_on_this_gpu_is_measured_there_for_a_target_naming_it(run_cell):
    """`target: {compute: measured}`: the cell core.target.measured_cells plans (the compute ceiling
    on a GPU), run here, is taken over the estimate for a target that names this GPU: CUDA's name
    for it matches the table's."""
    from feedbench.core.target import find_gpu, gpu_table, measured_compute, same_gpu

    name = torch.cuda.get_device_name(0)
    known = [row for row in gpu_table() if same_gpu(name, find_gpu(row))]
    if not known:
        pytest.skip(f"{name} is not a GPU of core/gpus.yaml")
    knobs = dict(
        model="resnet18",
        dataset="synthetic",
        image_size=64,
        batch_size=64,
        steps=20,
        warmup_steps=5,
    )
    code, result = run_cell(scenario="compute", device="cuda", **knobs)
    assert code == 0, result["error"]
    seconds, where = measured_compute([result], find_gpu(known[0]), batch_size=64)
    assert where == f"measured there, on {name} (1 repeat)"
    assert seconds == pytest.approx(64 / result["metrics"]["samples_per_s"])
