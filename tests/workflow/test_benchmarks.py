"""Every script in benchmarks/ runs at its smallest size: a benchmark nobody runs rots unnoticed, as
instrument_overhead.py did (it crashed before measuring anything). Only that each runs to the end
and prints its figures is checked here: the figures themselves are for docs/performance.md, measured
side by side on a quiet machine, never asserted in a test."""

from __future__ import annotations

import glob
import json
import os
import re
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
    "command_overhead.py": ["--rounds", "1", "--steps", "6", "--workers", "0"],
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
    "gpu_check.sh": "the GPU check's rehearsal below",
    "gpu_check.py": "the GPU check's rehearsal below (gpu_check.sh runs it)",
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


# What a bare GPU machine lacks (#50): the workflow's packages, and the shards' and the plots'. Each
# made unimportable for the rehearsal's processes by a sitecustomize first on their path (None in
# sys.modules: `import x` raises ModuleNotFoundError).
HIDDEN = (
    "snakemake", "jsonschema", "yte", "snakemake_executor_plugin_slurm", "pyarrow", "webdataset",
    "matplotlib",
)  # fmt: skip


def bare_machine(tmp_path) -> dict:
    """The environment of a GPU machine's own Python: the workflow's packages hidden."""
    folder = tmp_path / "hidden"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        f"import sys\n\nfor name in {HIDDEN!r}:\n    sys.modules[name] = None\n"
    )
    return dict(os.environ, PYTHONPATH=str(folder), PYTHON=sys.executable, **ONE_THREAD)


def gpu_test_files() -> list[str]:
    """The files gpu_check.sh names as holding the GPU tests."""
    with open(os.path.join(BENCHMARKS, "gpu_check.sh")) as f:
        found = re.search(r'^GPU_TESTS="([^"]*)"', f.read(), re.M)
    return found.group(1).split()


def test_the_gpu_check_names_every_file_with_a_gpu_test():
    """pytest collects only the files gpu_check.sh names (a module needing Snakemake stops a
    collection of the whole tree on a GPU machine): a file with a test marked gpu must be one."""
    marked = sorted(
        os.path.relpath(path, ROOT)
        for path in glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"), recursive=True)
        if re.search(r"pytest\.mark\.gpu\b", open(path).read())
    )
    assert sorted(gpu_test_files()) == marked


def test_the_gpu_test_files_collect_without_snakemake_jsonschema_or_yte(tmp_path):
    """A GPU test module imports only what it needs (#50, G1): each of the files collects where the
    workflow's packages are missing, every gpu test in them (skipped here, without CUDA)."""
    command = [sys.executable, "-m", "pytest", "--co", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*command, *gpu_test_files()],
        capture_output=True,
        text=True,
        env=bare_machine(tmp_path),
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.search(r"^\d+/\d+ tests collected", done.stdout, re.M), done.stdout[-1000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rehearsal is the GPU check without CUDA")
def test_the_gpu_check_rehearsed_on_a_bare_machine_keeps_its_rows_within_its_budget(tmp_path):
    """The rehearsal (#50): gpu_check.sh as a bare GPU machine would run it, Snakemake, jsonschema
    and yte unimportable, on a budget of 60 s that cannot hold every cell: every part starts and
    says its budget, the cells the budget holds are rows of the table and lines of cells.jsonl,
    the rest are named as cut, the findings get their lines, and it exits 0, with at most 8 files.
    Here without CUDA: the GPU tests skipped, the cells on the CPU at 2 steps."""
    out = tmp_path / "check"
    env = dict(bare_machine(tmp_path), GPU_CHECK_BUDGET_S="60")
    script = os.path.join(BENCHMARKS, "gpu_check.sh")
    done = subprocess.run(
        ["bash", script, str(out)], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    for part in ("part 1, the GPU tests", "part 2, N1-N3", "part 3, the two open findings"):
        assert part in summary and "budget" in summary, summary
    assert "missing jsonschema (import jsonschema), needed by part 4" in summary
    assert "part 4, the calibration: skipped: no CUDA" in summary
    part1 = re.search(r"part 1: pytest -m gpu (exit \d+|cut at its budget)", summary).group(1)
    assert part1 in ("exit 0", "cut at its budget"), summary  # no module failed to collect
    table = (out / "gpu-check.md").read_text()
    assert "no CUDA: dry run on the CPU" in table
    assert (
        "| N1 N2 decode | torchvision-cuda, pageable |" in table and "skipped: needs CUDA" in table
    )
    with open(out / "cells.jsonl") as f:
        cells = [json.loads(line) for line in f]
    measured = [c for c in cells if c.get("status") == "ok"]
    assert measured, cells  # the budget held some cells, each a row
    assert all(f"| {c['arm']} |" in table for c in measured)
    assert table.count("dry (CPU)") == len(measured)
    assert "**events 7 % slower than sync" in table and "**stream prefetch 4-6 %" in table
    assert len(os.listdir(out)) <= 8, os.listdir(out)


def test_the_gpu_checks_lines_say_which_explanation_the_figures_support(tmp_path):
    """Each open finding's line (gpu_check.py --conclude, from its cells' one-line summaries), on
    figures written by hand, two rounds of each arm: events 7 % slower than sync, as fast as naive,
    and pinned non-blocking within 1 % of sync: the pageable blocking copy; stream 5 % slower than
    none at 0 workers and 1 % at 2: the host-bound loader."""
    rates = {
        ("events", "naive (no instrument)"): 6700,
        ("events", "events"): 6690,
        ("events", "sync"): 7200,
        ("events", "events, pinned non-blocking"): 7150,
        ("events", "events, 2 workers"): 6700,
        ("prefetch", "none, 0 workers"): 43000,
        ("prefetch", "stream, 0 workers"): 40800,
        ("prefetch", "none, 2 workers"): 45000,
        ("prefetch", "stream, 2 workers"): 44600,
    }
    cells = [
        {"part": 3, "finding": finding, "arm": arm, "round": k, "status": "ok",
         "samples_per_s": rate * (1 + 0.002 * k), "phases_ms": {}}
        for (finding, arm), rate in rates.items()
        for k in (1, 2)
    ]  # fmt: skip
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(cell) + "\n" for cell in cells))
    done = run("gpu_check.py", "--conclude", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the pageable blocking copy: pinned and non-blocking, events is -0.7 %" in done.stdout
    assert "the host-bound loader at 0 workers: stream against none -5.1 % at 0" in done.stdout
    assert "not resolved" not in done.stdout
