"""A cell past its time limit stops itself and is recorded as failed, with the steps it measured.

The bench rule gives every cell a limit a little under its job's runtime, so a
cell that runs too long is recorded (and retried) instead of being killed by
the scheduler with its output lost. These tests run the real harness in
subprocesses with short limits.
"""

from __future__ import annotations

import json
import time

import jsonschema
import psutil
from feedbench.core.result import schema
from helpers.cells import ENDLESS_SLEEP, run_cell_process

# Not timing tests: their bounds (a limit of seconds, a start-up of up to 30 s) hold beside the
# other tests on a busy 2-core machine, where the Slurm tests run them too.


def _run(out, limit: float, **knobs) -> tuple[int, dict, float]:
    t0 = time.perf_counter()
    proc = run_cell_process(
        out, {**ENDLESS_SLEEP, **knobs}, "--time-limit", str(limit), timeout=180
    )
    elapsed = time.perf_counter() - t0
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, schema())
    return proc.returncode, result, elapsed


def test_a_cell_stops_at_its_time_limit_with_its_steps(tmp_path):
    # The limit counts from the harness's start: building the loader and the model, then the
    # warm-up, come out of it. 12 s leaves room for more than 5 steps of 50 ms even when a busy
    # 2-core machine makes that start-up slow.
    code, result, elapsed = _run(tmp_path, 12, compute_ms=50)
    assert code == 1 and result["status"] == "failed"
    assert result["error"]["type"] == "Terminated"
    assert result["error"]["message"].startswith("time limit of 12 s reached")
    assert result["metrics"]["steps"] > 5 and result["metrics"]["samples_per_s"] > 0
    assert elapsed < 12 + 30  # start-up (importing torch) + the limit + writing


def test_a_cell_stuck_inside_one_step_is_ended_after_a_grace_period(tmp_path):
    """A loader that does not return in time (one sample takes a minute, the most allowed) never
    reaches the per-step check."""
    code, result, elapsed = _run(tmp_path, 4, compute_ms=1, sample_delay_ms=60000, warmup_steps=0)
    assert code == 1 and result["status"] == "failed"
    assert (
        result["error"]["message"]
        == "time limit of 4 s reached (the job's runtime less a margin to record the "
        "result); still inside one step 1 s later, so the process was ended"
    )
    assert elapsed < 60


def test_bad_time_limit_is_one_line(tmp_path):
    proc = run_cell_process(tmp_path, ENDLESS_SLEEP, "--time-limit", "0", timeout=120)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == "feedbench: error: --time-limit: value 0 is not allowed; "
        "allowed: seconds > 0"
    )


def test_a_multi_rank_cell_stops_every_rank_at_its_time_limit(tmp_path):
    code, result, elapsed = _run(tmp_path, 25, compute_ms=20, parallel="ddp", gpus_per_node=2)
    assert code == 1 and result["status"] == "failed" and result["error"]["type"] == "Terminated"
    assert result["error"]["message"].startswith("time limit of 25 s reached")
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]
