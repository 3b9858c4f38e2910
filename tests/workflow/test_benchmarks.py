"""Every script in benchmarks/ runs at its smallest size: a benchmark nobody runs rots unnoticed, as
instrument_overhead.py did (it crashed before measuring anything). Only that each runs to the end
and prints its figures is checked here: the figures themselves are for docs/performance.md, measured
side by side on a quiet machine, never asserted in a test."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

pytestmark = pytest.mark.slow  # each a few seconds of CPU, the loader-scaling check about 15

BENCHMARKS = os.path.join(ROOT, "benchmarks")

# script -> its smallest run's arguments
SMALLEST = {
    "calibration_error.py": ["--repeats", "1", "--cases", "balanced", "--workers", "0"],
    "dag_dry_run.py": ["50"],
    "gc_window.py": ["--rounds", "1", "--steps", "3"],
    "instrument_overhead.py": ["--rounds", "1", "--steps", "3"],
    "loader_scaling_error.py": ["--check", "--repeats", "1", "--pipelines", "images"],
    "own_pipeline_overhead.py": ["--rounds", "1", "--steps", "3"],
    "own_pipeline_split.py": ["--rounds", "1", "--steps", "3"],
    "report_1000_cells.py": ["--cells", "20"],
    "stage_timing_overhead.py": ["--rounds", "1", "--steps", "3"],
    "threads_default.py": ["--rounds", "1", "--steps", "3"],
}
# script -> the test that runs it at its smallest size, where the script is that test's own subject
ELSEWHERE = {
    "prediction_error.py": "tests/core/test_estimate.py (its page against "
    "docs/results/prediction-error.md)",
    "stage_profile.py": "tests/harness/test_stage_profile.py (the benchmark at its smallest size)",
    "suite_cpu.py": "test_suite_cpu_records_a_small_suite and the process log test below",
    "gpu_check.sh": "test_the_gpu_check_runs_dry_without_cuda below",
    "gpu_check.py": "test_the_gpu_check_runs_dry_without_cuda below (gpu_check.sh runs it)",
}


# One intra-op thread each: the figures of a smallest run are never read, and PyTorch's default
# (every core) beside two other pytest workers on two cores spins its threads against theirs
# (instrument_overhead took 4x as long).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def run(script: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    paths = os.pathsep.join(os.path.join(ROOT, p) for p in ("workflow", "tests", "benchmarks"))
    env = dict(os.environ, PYTHONPATH=paths, **ONE_THREAD)
    command = [sys.executable, os.path.join(BENCHMARKS, script), *args]
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT, **kwargs
    )


def test_every_benchmark_has_its_smallest_run_in_the_suite():
    # _checkout.py is no benchmark: the scripts import it to put this checkout's package first on
    # the path
    scripts = {
        name
        for name in os.listdir(BENCHMARKS)
        if name.endswith((".py", ".sh")) and not name.startswith("_")
    }
    missing = scripts - set(SMALLEST) - set(ELSEWHERE)
    assert not missing, (
        f"benchmarks without a smallest run in tests/workflow/test_benchmarks.py: {sorted(missing)}"
    )
    assert not (set(SMALLEST) | set(ELSEWHERE)) - scripts, "a benchmark named here no longer exists"


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_the_benchmark_runs_at_its_smallest_size(script):
    result = run(script, *SMALLEST[script])
    assert result.returncode == 0, (
        f"{script} {' '.join(SMALLEST[script])}:\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
    )
    assert result.stdout.strip(), f"{script} printed no figure"


def test_suite_cpu_records_a_small_suite(tmp_path):
    """The plugin records each test's CPU; its main sums them by module."""
    env = dict(os.environ, PYTHONPATH=BENCHMARKS, SUITE_CPU_OUT=str(tmp_path))
    tests = os.path.join(ROOT, "tests", "analysis", "test_knee.py")
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "suite_cpu",
        "-q",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
        tests,
    ]
    pytest_run = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )
    assert pytest_run.returncode == 0, pytest_run.stdout[-2000:]
    summary = run("suite_cpu.py", str(tmp_path))
    assert summary.returncode == 0, summary.stderr[-2000:]
    assert "tests/analysis/test_knee.py" in summary.stdout and " tests, " in summary.stdout


def test_suite_cpu_sums_the_logged_processes_by_kind_and_their_start_up(tmp_path):
    """benchmarks/process_log logs a Snakemake command line and a harness cell; --processes names
    each kind and, with --starts, the CPU each kind takes to start and the floor they sum to."""
    log = tmp_path / "log"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [os.path.join(BENCHMARKS, "process_log"), os.path.join(ROOT, "workflow")]
        ),
        SUITE_PROCESS_LOG=str(log),
        **ONE_THREAD,
    )
    cell = ["-s", "scenario=loader", "-s", "dataset=memory", "-s", "steps=1", "-s", "device=cpu"]
    for command in (
        ["-m", "snakemake", "--version"],
        ["-m", "feedbench", "run", *cell, "--out", str(tmp_path / "cell")],
    ):
        done = subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    summary = run("suite_cpu.py", "--processes", str(log), "--starts", "--rounds", "1")
    assert summary.returncode == 0, summary.stderr[-2000:]
    lines = summary.stdout.splitlines()
    assert lines[0].startswith("2 processes, ")
    assert any("Snakemake command line  (start-up " in line for line in lines), lines
    assert any("harness cell  (start-up " in line for line in lines), lines
    assert lines[-1].startswith("start-up floor of those kinds: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the GPU check without CUDA")
def test_the_gpu_check_runs_dry_without_cuda(tmp_path):
    """benchmarks/gpu_check.sh without CUDA: the GPU tests skipped, a CPU-able group's cells run on
    the CPU, a CUDA-only group and the calibration skipped, each saying so, in the table it
    writes."""
    env = dict(
        os.environ, PYTHON=sys.executable, GPU_CHECK_GROUPS="pinned gpu-decode", **ONE_THREAD
    )
    script = os.path.join(BENCHMARKS, "gpu_check.sh")
    done = subprocess.run(
        ["bash", script, str(tmp_path)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    table = (tmp_path / "gpu-check.md").read_text()
    assert "no CUDA: dry run on the CPU" in table
    assert "| pinned | 0 workers | " in table and "| dry (CPU) |" in table
    assert "| gpu-decode | torchvision-cuda, pageable | skipped: needs CUDA |" in table
    assert "pytest -m gpu exit 0" in table and "calibration skipped: no CUDA" in table
