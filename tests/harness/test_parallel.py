"""Multi-process cells on this machine: the "GPUs" are processes on gloo, nodes are emulated on
localhost."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import jsonschema
import psutil
import pytest
from feedbench.core.result import schema
from helpers.cells import ENDLESS_SLEEP, run_cell_process, start_cell, tiny_mlp

MLP = tiny_mlp(input_size=64, width=64, batch_size=16, warmup_steps=2)


def run(out, *options: str, steps: int = 10, **knobs) -> tuple[int, dict, str]:
    proc = run_cell_process(out, {**MLP, "steps": steps, **knobs}, *options)
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, schema())
    return proc.returncode, result, proc.stderr


def test_ddp_two_ranks_gathers_every_rank(tmp_path):
    code, result, _ = run(tmp_path, parallel="ddp", gpus_per_node=2)
    assert code == 0, result["error"]
    metrics = result["metrics"]
    assert metrics["world_size"] == 2 and [r["rank"] for r in metrics["ranks"]] == [0, 1]
    assert metrics["samples"] == 2 * 10 * 16
    assert metrics["samples_per_s"] == pytest.approx(
        metrics["samples"] / max(r["window_s"] for r in metrics["ranks"])
    )
    assert 0 <= metrics["comm_share"] <= 1
    assert all(r["comm"]["step_ms_sync"] > 0 for r in metrics["ranks"])


def test_profile_with_two_ddp_ranks_completes_and_rank_0_writes_the_trace(tmp_path):
    """Every rank runs the profiled steps (each all-reduces): with rank 0 alone, the other waited in
    its gather and the cell hung until killed. The time limit turns a hang into a failed cell."""
    code, result, _ = run(
        tmp_path, "--time-limit", "60", parallel="ddp", gpus_per_node=2, profile=True, steps=6
    )
    assert code == 0, result["error"]
    assert result["files"]["trace"] == "trace.json"
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert trace["distributedInfo"]["rank"] == 0 and trace["distributedInfo"]["world_size"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if "trace" in p.name) == ["trace.json"]


def test_independent_replicas_on_two_emulated_nodes(tmp_path):
    """torchrun with two nodes on localhost: a static rendezvous, GROUP_RANK 0 and 1."""
    code, result, _ = run(tmp_path, parallel="independent", gpus_per_node=2, nodes=2)
    assert code == 0, result["error"]
    ranks = result["metrics"]["ranks"]
    assert [(r["rank"], r["node"]) for r in ranks] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert all(r["comm"] is None for r in ranks)


def test_ddp_across_two_emulated_nodes(tmp_path):
    code, result, _ = run(tmp_path, parallel="ddp", gpus_per_node=1, nodes=2, steps=5)
    assert code == 0, result["error"]
    assert {r["node"] for r in result["metrics"]["ranks"]} == {0, 1}


def test_ddp_of_one_rank_runs_without_a_launcher(run_cell):
    code, result = run_cell(**tiny_mlp(parallel="ddp", comm_probe_steps=3))
    assert code == 0, result["error"]
    assert result["metrics"]["comm"]["steps"] == 3
    assert "world_size" not in result["metrics"]


def test_dp_on_cpu_runs_one_replica_on_the_whole_batch(run_cell):
    code, result = run_cell(**tiny_mlp(parallel="dp", gpus_per_node=2))
    assert code == 0
    assert result["metrics"]["samples"] == 4 * 16
    assert (
        "parallel=dp on CPU runs one replica on batch_size x 2: DataParallel needs GPUs"
        in result["adjustments"]
    )


def _start(out, **knobs):
    """The endless sleep cell (one thread, pinned), to signal once its ranks measure (_ranks)."""
    cell = dict(ENDLESS_SLEEP, compute_ms=20, **knobs)
    return start_cell(out, cell, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _cmdline(process: psutil.Process) -> list[str]:
    """Its command line, or [] for a process that exited since it was listed (torchrun starts
    short-lived helpers)."""
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:
        return []


def _handles_sigterm(process: psutil.Process) -> bool:
    """Whether the process has its own SIGTERM handler (the SigCgt mask of /proc/<pid>/status): a
    rank installs the harness's once torch is imported, the start-up a busy machine slows most."""
    try:
        with open(f"/proc/{process.pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return False
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def _ranks(launcher: psutil.Process, count: int) -> list[psutil.Process]:
    """The rank processes (feedbench run --as-rank) under the launcher, once they are all up and
    measuring: each handles SIGTERM (the harness has started), then 3 s for the process group, the
    model and the warm-up. Waiting on the ranks' own state, not a fixed time from their start, holds
    on a loaded machine, so these tests run beside the others."""
    deadline = time.time() + 120
    while time.time() < deadline:
        ranks = [
            p
            for p in launcher.children(recursive=True)
            if "--as-rank" in (line := _cmdline(p)) and "torch.distributed.run" not in line
        ]
        if len(ranks) == count and all(_handles_sigterm(p) for p in ranks):
            time.sleep(3)
            return sorted(ranks, key=lambda p: int(p.environ().get("RANK", -1)))
        time.sleep(0.3)
    raise AssertionError("ranks did not start")


def test_a_rank_that_dies_fails_the_cell_naming_it(tmp_path):
    launcher = _start(tmp_path, parallel="ddp", gpus_per_node=2)
    ranks = _ranks(psutil.Process(launcher.pid), 2)
    ranks[1].kill()
    assert launcher.wait(timeout=120) == 1
    result = json.loads((tmp_path / "result.json").read_text())
    jsonschema.validate(result, schema())
    assert result["status"] == "failed"
    # Rank 1 died by SIGKILL and wrote nothing. Rank 0 either saw the broken group and said so, or
    # hung in a collective until torchrun killed it; then torchrun's root cause names rank 1.
    message = result["error"]["message"]
    assert message.startswith("rank(s) 1 exited without a report (killed?); rank 0 failed: ") or (
        message.startswith(
            "rank(s) 0, 1 exited without a report (killed?); rank 1 exited "
            "with code -9 (SIGKILL) first"
        )
    ), message


def test_a_node_that_fails_fails_the_cell(tmp_path):
    launcher = _start(tmp_path, parallel="independent", gpus_per_node=1, nodes=2)
    parent = psutil.Process(launcher.pid)
    _ranks(parent, 2)
    node1 = [p for p in parent.children() if "--node-rank=1" in p.cmdline()][0]
    # the node's agent and its rank vanish at once
    for proc in [node1, *node1.children(recursive=True)]:
        proc.kill()
    assert launcher.wait(timeout=120) == 1
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "failed"
    assert (
        "node 1 exited with code -9" in result["error"]["message"]
        or "rank 1 exited" in result["error"]["message"]
    ), result["error"]
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or []) and p.pid != launcher.pid
    ]


def test_no_rank_outlives_its_launcher(tmp_path):
    launcher = _start(tmp_path, parallel="ddp", gpus_per_node=2)
    _ranks(psutil.Process(launcher.pid), 2)
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=120)
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]


def test_time_limit_sigterm_fails_the_cell(tmp_path):
    launcher = _start(tmp_path, parallel="ddp", gpus_per_node=2)
    _ranks(psutil.Process(launcher.pid), 2)
    launcher.send_signal(signal.SIGTERM)  # what Slurm sends at the time limit
    assert launcher.wait(timeout=120) == 1
    result = json.loads((tmp_path / "result.json").read_text())
    jsonschema.validate(result, schema())
    assert result["status"] == "failed"
    assert result["error"] == {
        "type": "Terminated",
        "message": "terminated by SIGTERM (job cancelled, or a scheduler's time limit)",
        "traceback": "",
    }
