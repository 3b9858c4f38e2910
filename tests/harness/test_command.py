"""A command cell: the user's own training script run as it is, its DataLoader given the cell's
knobs from outside, its steps timed in its own loop (harness.command, harness.inloop).

The harness runs in this process; the command is a process of its own, as in a bench job.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import ROOT
from feedbench.harness import command
from feedbench.harness.runner import run
from helpers.commands import command_cell, line_of, write_train


def measured(tmp_path, knobs: dict, time_limit: float | None = None) -> dict:
    out = tmp_path / "cell"
    run(knobs, str(out), time_limit=time_limit)
    with open(out / "result.json", encoding="utf-8") as f:
        return json.load(f)


def log_of(tmp_path, name: str = "command.log") -> str:
    return (tmp_path / "cell" / name).read_text()


def test_the_training_loader_gets_the_cells_knobs_and_its_steps_are_timed(tmp_path):
    """The script asks for no workers and iterates a validation loader first; the cell's two workers
    reach the training loader (found by the backward pass after its batches), every step's phases
    are timed in the script's own loop, and the stage profile names the script's costly
    transform."""
    workdir = write_train(tmp_path / "project", busy_ms=2.0)
    knobs = command_cell(
        workdir,
        "train.py --steps 40",
        num_workers=2,
        stage_timing=True,
        warmup_steps=3,
        steps=6,
    )
    result = measured(tmp_path, knobs)
    assert result["status"] == "ok", result["error"]
    found = result["command"]
    train_line = line_of(workdir, "train = DataLoader(")
    assert found["loader"]["built_at"].endswith(f"train.py:{train_line} in <module>")
    assert "backward" in found["loader"]["why"]
    assert found["loader"]["asked"]["num_workers"] == 0
    assert found["loader"]["ran"]["num_workers"] == 2
    assert found["workers_in_window"] == 2  # two worker processes made the window's batches
    validation = next(i for i in found["loaders"] if i["index"] != found["loader"]["index"])
    assert validation["built_at"].endswith(
        f"train.py:{line_of(workdir, 'validation =')} in <module>"
    )
    metrics = result["metrics"]
    assert metrics["steps"] == 6 and metrics["samples"] == 48
    assert set(metrics["phases"]) == {"wait", "h2d", "fwd", "bwd", "opt"}
    assert found["forward_seen"] and found["window_closed_by"] == "steps"
    stages = metrics["stages"]["stages"]
    assert max(stages, key=lambda name: stages[name]["share"]) == "Busy"
    # the window's end ended the script's loop: it never printed its last line
    assert "trained" not in log_of(tmp_path)
    assert (tmp_path / "cell" / "steps.csv").read_text().count("\n") == 7


def test_a_command_run_by_another_environments_python_records_that_environments_software(tmp_path):
    """`python:` names another environment's interpreter (here: a wrapper whose environment holds a
    torchvision 0.0.1 the harness's lacks): the result's torch, torchvision and Python are those
    that ran the steps, read by the instrument in the command's own process, and say so."""
    import importlib.metadata
    import sys

    import torch

    site = tmp_path / "other-env"
    (site / "torchvision-0.0.1.dist-info").mkdir(parents=True)
    (site / "torchvision-0.0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.0.1\n"
    )
    python = tmp_path / "other-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}:$PYTHONPATH" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    workdir = write_train(tmp_path / "project", stages=False)
    knobs = command_cell(
        workdir, "train.py --steps 20", python=str(python), warmup_steps=2, steps=3
    )
    result = measured(tmp_path, knobs)
    assert result["status"] == "ok", result["error"]
    provenance = result["provenance"]
    assert provenance["software_of"] == "command"
    assert provenance["torchvision"] == "0.0.1" != importlib.metadata.version("torchvision")
    assert provenance["torch"] == torch.__version__ and provenance["gpu"] is None


def test_a_baseline_runs_the_command_plain_then_whole_for_fidelity(tmp_path):
    """The baseline's first repeat: the command alone with no instrument, then instrumented, both to
    its own end (a command shorter than warm-up and steps is measured whole)."""
    workdir = write_train(tmp_path / "project", busy_ms=0.2, stages=False)
    knobs = command_cell(workdir, "train.py --steps 8", baseline=True, warmup_steps=3, steps=20)
    result = measured(tmp_path, knobs)
    assert result["status"] == "ok", result["error"]
    found = result["command"]
    assert found["mode"] == "whole" and found["window_closed_by"] == "exit"
    # the last step never reached the next request: 8 batches, 3 of warm-up, 4 measured
    assert result["metrics"]["steps"] == 4
    assert found["whole"] == {"batches": 8, "samples": 64}
    fidelity = found["fidelity"]
    assert fidelity["plain_exit_code"] == 0 and fidelity["samples"] == 64
    assert fidelity["ratio"] == pytest.approx(
        fidelity["instrumented_wall_s"] / fidelity["plain_wall_s"], rel=1e-3
    )
    assert "trained 8 steps" in log_of(tmp_path, "command-plain.log")
    assert "trained 8 steps" in log_of(tmp_path)
    # nothing of feedbench ran in the plain run
    assert os.listdir(tmp_path / "cell" / "command" / "plain") == []


def test_the_compute_ceiling_replays_the_warm_ups_batches(tmp_path):
    """scenario compute: after the warm-up's batches, the training loader serves them again from
    memory: the dataset makes no sample in the window, and the script's loop goes on as it is."""
    workdir = write_train(tmp_path / "project", stages=False)
    knobs = command_cell(
        workdir, "train.py --steps 9", scenario="compute", warmup_steps=3, steps=20
    )
    result = measured(tmp_path, knobs)
    assert result["status"] == "ok", result["error"]
    assert result["command"]["mode"] == "replay"
    assert result["metrics"]["steps"] == 5  # 9 batches: 3 warm-up, 5 measured, the last open
    # only the warm-up's 3 batches of 8 were made; the script ran to its end
    assert "trained 9 steps; made 24 training samples here" in log_of(tmp_path)


def test_the_loader_ceiling_drains_the_training_loader_alone(tmp_path):
    """scenario loader: at the first backward pass the training loader is drained with the cell's
    knobs, no step between its batches, and the command ends there."""
    workdir = write_train(tmp_path / "project", stages=False)
    knobs = command_cell(
        workdir, "train.py --steps 100", scenario="loader", warmup_steps=2, steps=5
    )
    result = measured(tmp_path, knobs)
    assert result["status"] == "ok", result["error"]
    assert result["command"]["mode"] == "drain"
    assert result["metrics"]["steps"] == 5
    assert set(result["metrics"]["phases"]) == {"wait"}
    assert "trained" not in log_of(tmp_path)
    assert "the loader ceiling was measured" in log_of(tmp_path)


@pytest.mark.parametrize(
    "script, expected",
    [
        (
            "import argparse\nimport torch\nargparse.ArgumentParser().parse_args()\n",
            "exited with code 2 before its first training step; its last lines: "
            "usage: train.py [-h] | train.py: error: unrecognized arguments: --max-stpes 40",
        ),
        (
            "import torch\nprint(torch.ones(2).sum())\n",
            "no torch DataLoader was iterated: feedbench measures loaders built on "
            "torch.utils.data",
        ),
        (
            "import torch\nfrom torch.utils.data import DataLoader\n"
            "for batch in DataLoader(torch.arange(8.0), batch_size=4):\n    batch.sum()\n",
            "no backward pass followed a batch of the 1 loaders the command iterated (built at ",
        ),
    ],
    ids=["typo-in-its-arguments", "no-loader", "no-backward"],
)
def test_a_command_the_preflight_cannot_measure_is_one_line(tmp_path, script, expected):
    (tmp_path / "train.py").write_text(script)
    knobs = command_cell(str(tmp_path), "train.py --max-stpes 40")
    with pytest.raises(command.CommandError) as error:
        command.preflight(knobs, str(tmp_path / "out"))
    assert expected in str(error.value)
    assert "\n" not in str(error.value)


def test_the_preflight_finds_the_training_loader_in_one_step(tmp_path):
    workdir = write_train(tmp_path / "project", busy_ms=0.1, stages=False)
    found = command.preflight(command_cell(workdir, "train.py --steps 50"), str(tmp_path / "out"))
    assert found["status"] == "ok"
    assert found["loader"]["built_at"].endswith(
        f"{line_of(workdir, 'train = DataLoader(')} in <module>"
    )


def test_a_command_stopped_before_its_warm_up_ends_says_so(tmp_path):
    """The cell's time limit comes while the script is still in its warm-up (1.6 s a batch): the
    command ends, and the error says how far it came."""
    workdir = write_train(tmp_path / "project", busy_ms=0.1, stages=False)
    knobs = command_cell(workdir, "train.py --steps 100 --sleep 0.2", warmup_steps=50, steps=5)
    result = measured(tmp_path, knobs, time_limit=8)
    assert result["status"] == "failed"
    message = result["error"]["message"]
    assert message.startswith(
        "did not finish its warm-up (50 training steps) before it was stopped"
    )
    assert "time limit of 8 s reached" in message


def test_a_stage_what_if_reaches_the_training_loader_alone(tmp_path):
    """skip_stages names the script's costly transform: the training loader's dataset runs without
    it from the first backward pass on, the window's stage profile has no time in it, and the
    validation loader's own transforms are left as they are."""
    workdir = write_train(tmp_path / "project", busy_ms=2.0)
    knobs = command_cell(
        workdir,
        "train.py --steps 40",
        stage_timing=True,
        skip_stages=["Busy"],
        warmup_steps=3,
        steps=5,
    )
    result = measured(tmp_path, knobs)
    assert result["status"] == "ok", result["error"]
    whatif = result["metrics"]["whatif"]
    assert whatif["skipped"] == ["Busy"]
    stages = result["metrics"]["stages"]
    assert stages["order"] == ["RandomHorizontalFlip", "Busy", "ToDtype"]
    assert "Busy" not in stages["stages"]


@pytest.mark.gpu
def test_a_command_on_the_gpu_is_timed_by_cuda_events_on_its_stream(tmp_path):
    """The script trains on CUDA with pinned batches: the instrument reads the device's phases and
    its idle time at the loader boundary from CUDA events on the script's current stream, and
    counts the bytes each batch copies."""
    workdir = write_train(tmp_path / "project", busy_ms=1.0, stages=False)
    knobs = command_cell(
        workdir,
        "train.py --steps 40 --device cuda",
        device="cuda",
        pin_memory=True,
        num_workers=1,
        warmup_steps=3,
        steps=10,
    )
    result = measured(tmp_path, knobs)
    assert result["status"] == "ok", result["error"]
    assert result["timing"]["effective"] == "events"
    metrics = result["metrics"]
    assert "gpu_idle" in metrics["phases"]
    # a batch of 8 images of 3 x 16 x 16 float32 and 8 int64 labels, copied every step
    assert metrics["h2d_bytes"] == 10 * (8 * 3 * 16 * 16 * 4 + 8 * 8)
    assert result["command"]["loader"]["ran"]["pin_memory"] is True


def test_a_ddp_command_runs_its_ranks_under_torchrun(tmp_path):
    """parallel ddp, 2 ranks on the CPU: examples/plain-loop under torchrun, which sets up gloo and
    DDP itself as its users run it; each rank's loop is measured and the job's throughput is both
    ranks' samples over the slowest window."""
    knobs = command_cell(
        os.path.join(ROOT, "examples", "plain-loop"),
        "train.py --max-steps 12 --workers 0",
        parallel="ddp",
        gpus_per_node=2,
        warmup_steps=3,
        steps=4,
    )
    result = measured(tmp_path, knobs)
    assert result["status"] == "ok", result["error"]
    assert result["command"]["argv"][1:5] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
    ]
    metrics = result["metrics"]
    assert metrics["world_size"] == 2 and result["command"]["ranks"] == 2
    assert [(r["rank"], r["samples"]) for r in metrics["ranks"]] == [(0, 128), (1, 128)]
    assert metrics["samples"] == 256


STREAM = """
import sys
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Stream(IterableDataset):
    def __iter__(self):
        if "--sharded" in sys.argv:
            info = get_worker_info()
            start, step = (info.id, info.num_workers) if info else (0, 1)
            return iter(torch.arange(start, 4096, step, dtype=torch.float32))
        return iter(torch.arange(4096, dtype=torch.float32))


model = torch.nn.Linear(1, 1)
for batch in DataLoader(Stream(), batch_size=16):
    model(batch[:, None]).sum().backward()
"""


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_workers_on_a_stream_that_does_not_shard_say_what_became_of_its_samples(tmp_path, sharded):
    (tmp_path / "train.py").write_text(STREAM)
    command_line = "train.py --sharded" if sharded else "train.py"
    knobs = command_cell(str(tmp_path), command_line, num_workers=2, warmup_steps=2, steps=4)
    result = measured(tmp_path, knobs)
    assert result["status"] == "ok", result["error"]
    said = [note for note in result["adjustments"] if "yielded the whole stream" in note]
    assert bool(said) is not sharded
    if said:
        assert "its samples came 2 times each" in said[0]


@pytest.mark.timing
def test_a_commands_samples_per_s_is_its_own_at_its_own_settings(tmp_path):
    """The truth a user checks feedbench against: the script's own throughput printout at the same
    settings (0 workers, one thread), run alone just before, and just after (a shared machine's
    rate drifts 5 to 10 % from one run to the next: the cell is held to the two).
    examples/plain-loop prints its samples/s over its steps after its first 5; the cell measures the
    same steps in its loop, within 15 %, and within 5 % of the printout of its own run."""
    import subprocess
    import sys

    example = os.path.join(ROOT, "examples", "plain-loop")

    def alone() -> float:
        own = subprocess.run(
            [sys.executable, "train.py", "--max-steps", "45", "--workers", "0"],
            cwd=example,
            capture_output=True,
            text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            timeout=300,
        )
        return printed(own.stdout)

    def printed(text: str) -> float:
        return float(text.split("train: ")[1].split(" samples/s")[0])

    before = alone()
    knobs = command_cell(example, "train.py --max-steps 45 --workers 0", warmup_steps=5, steps=40)
    result = measured(tmp_path, knobs)
    after = alone()
    assert result["status"] == "ok", result["error"]
    rate = result["metrics"]["samples_per_s"]
    assert 0.85 * min(before, after) <= rate <= 1.15 * max(before, after), (before, rate, after)
    assert rate == pytest.approx(printed(log_of(tmp_path)), rel=0.05)


def test_a_step_across_the_epochs_end_holds_it_in_its_wait(tmp_path):
    """The training loader's epoch (64 batches) ends inside the window: the step whose request met
    the end goes on to the next epoch's first batch, and its wait is counted as an epoch
    boundary, as a cell of feedbench's own loop counts it."""
    workdir = write_train(tmp_path / "project", busy_ms=0.1, stages=False)
    knobs = command_cell(workdir, "train.py --steps 80", num_workers=1, warmup_steps=60, steps=8)
    result = measured(tmp_path, knobs)
    assert result["status"] == "ok", result["error"]
    metrics = result["metrics"]
    assert metrics["steps"] == 8 and metrics["samples"] == 64
    assert metrics["epoch_boundaries"]["count"] == 1
