"""Where the test suite's CPU goes: a pytest plugin that records each test's CPU seconds, and their
sum by module.

CPU (user + system) rather than wall time, because on a shared 2-core machine wall time says more
about the neighbours than about the test. A test's figure is its pytest process's own CPU plus that
of the subprocesses it waited for (Snakemake, the harness, torchrun's ranks, Chromium): getrusage of
the process and its reaped children, before and after. Slurm jobs run under slurmd, not the test, so
they are not counted.

    rm -rf /tmp/suite-cpu; PYTHONPATH=benchmarks SUITE_CPU_OUT=/tmp/suite-cpu \\
        .venv/bin/python -m pytest -p suite_cpu -m "not timing and not slurm" -n 3 --dist loadgroup -q
    .venv/bin/python benchmarks/suite_cpu.py /tmp/suite-cpu      # CPU seconds by module, most first

What those seconds are: with benchmarks/process_log on PYTHONPATH and SUITE_PROCESS_LOG set, every
Python process the tests start logs its CPU at exit; `--processes` sums them by kind, and `--starts`
measures what each kind costs to start and do nothing (the interpreter, `import torch`, a one-step
harness cell...), so that the sum says how much of the suite is start-up:

    PYTHONPATH=benchmarks:benchmarks/process_log SUITE_PROCESS_LOG=/tmp/suite-procs \
        .venv/bin/python -m pytest -p suite_cpu -m "not timing and not slurm" -n 3 --dist loadgroup -q
    .venv/bin/python benchmarks/suite_cpu.py --processes /tmp/suite-procs --starts
"""  # noqa: E501

from __future__ import annotations

import collections
import glob
import json
import os
import resource
import sys
import time

import pytest

OUT = os.environ.get("SUITE_CPU_OUT", "/tmp/suite-cpu")


def _cpu_s() -> float:
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """One JSON line per test (setup, call and teardown together) in OUT/<pid>.jsonl: every xdist
    worker its file."""
    cpu, wall = _cpu_s(), time.perf_counter()
    yield
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"{os.getpid()}.jsonl"), "a") as f:
        record = {
            "test": item.nodeid,
            "cpu_s": _cpu_s() - cpu,
            "wall_s": time.perf_counter() - wall,
        }
        f.write(json.dumps(record) + "\n")


def main(folder: str) -> None:
    rows = [
        json.loads(line)
        for path in glob.glob(os.path.join(folder, "*.jsonl"))
        for line in open(path)
    ]
    by_module = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for row in rows:
        module = by_module[row["test"].split("::")[0]]
        module[0] += 1
        module[1] += row["cpu_s"]
        module[2] += row["wall_s"]
    print(f"{len(rows)} tests, {sum(r['cpu_s'] for r in rows):.0f} CPU seconds")
    for name, (tests, cpu, wall) in sorted(by_module.items(), key=lambda item: -item[1][1]):
        print(f"{cpu:7.0f} s CPU {wall:7.0f} s wall {tests:4d} tests  {name}")


# Each kind of process the suite starts, and a command that starts one and does nothing more: its
# CPU is that kind's start-up.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONE_STEP = ["-s", "steps=1", "-s", "warmup_steps=0", "-s", "torch_threads=1", "-s", "device=cpu"]
TINY = ["-s", "model=mlp", "-s", "input_size=16", "-s", "dataset=memory", *ONE_STEP]
STARTS = {
    "interpreter": ["-c", "pass"],
    "import torch": ["-c", "import torch"],
    "import torch._dynamo": ["-c", "import torch._dynamo"],
    "import snakemake.cli": ["-c", "import snakemake.cli"],
    "import snakemake.script": ["-c", "import snakemake.script"],
    "harness cell, loader": ["-m", "feedbench", "run", "-s", "scenario=loader", *TINY],
    "harness cell, train": ["-m", "feedbench", "run", "-s", "scenario=train", *TINY],
}


def start_cpu_s(kind: str, rounds: int) -> float:
    """The median CPU seconds (user + system) of `rounds` processes of STARTS[kind], run one at a
    time."""
    import statistics
    import subprocess
    import tempfile

    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "workflow"), OMP_NUM_THREADS="1")
    env.pop("SUITE_PROCESS_LOG", None)
    figures = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, *STARTS[kind]]
            if "run" in command:
                command += ["--out", out]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(command, check=True, env=env, cwd=out, capture_output=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        figures.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(figures)


def process_kind(argv: list[str]) -> str:
    """What a logged process was, from its command line."""
    command = " ".join(argv)
    first = argv[0] if argv else ""
    if ".snakemake/scripts/" in first:
        return "Snakemake script job"
    if first.endswith(os.path.join("snakemake", "__main__.py")):
        return "Slurm job step" if "--target-jobs" in command else "Snakemake command line"
    if first.endswith(os.path.join("feedbench", "__main__.py")) and len(argv) > 1:
        return {"run": "harness cell"}.get(argv[1], f"feedbench {argv[1]}")
    if first.endswith(os.path.join("pytest", "__main__.py")) or argv == ["-c"]:
        # pytest-xdist starts its workers as `python -c` with the code on stdin
        return "pytest, its xdist workers"
    return "python -c, a benchmark, a user's script" if first else "other"


def processes(folder: str, rounds: int = 0) -> None:
    """The logged processes (benchmarks/process_log) by kind, most CPU first; with `rounds`, each
    kind's start-up measured beside it, and the suite's start-up floor: the start-ups summed."""
    rows = [
        json.loads(line)
        for path in glob.glob(os.path.join(folder, "*.jsonl"))
        for line in open(path)
    ]
    by_kind = collections.defaultdict(lambda: [0, 0.0])
    for row in rows:
        kind = by_kind[process_kind(row["argv"])]
        kind[0] += 1
        kind[1] += row["cpu_s"]
    starts = {
        # a loader cell builds no optimizer, which imports torch._dynamo: the cheaper start
        "harness cell": "harness cell, loader",
        "Snakemake command line": "import snakemake.cli",
        "Snakemake script job": "import snakemake.script",
        "Slurm job step": "import snakemake.cli",
    }
    floor = 0.0
    print(f"{len(rows)} processes, {sum(r['cpu_s'] for r in rows):.0f} CPU seconds")
    for name, (count, cpu) in sorted(by_kind.items(), key=lambda item: -item[1][1]):
        line = f"{cpu:7.0f} s CPU {count:5d} processes {cpu / count:5.2f} s each  {name}"
        if rounds and name in starts:
            least = start_cpu_s(starts[name], rounds)
            floor += count * least
            line += f"  (start-up {least:.2f} s)"
        print(line)
    if rounds:
        print(f"start-up floor of those kinds: {floor:.0f} CPU seconds (each its cheapest start)")


def starts(rounds: int) -> None:
    for kind in STARTS:
        print(f"{start_cpu_s(kind, rounds):5.2f} s CPU  {kind}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=OUT, help="the plugin's records")
    parser.add_argument("--processes", metavar="DIR", help="the process log (SUITE_PROCESS_LOG)")
    parser.add_argument("--starts", action="store_true", help="measure each kind's start-up")
    parser.add_argument("--rounds", type=int, default=3, help="processes per start-up (median)")
    args = parser.parse_args()
    if args.processes:
        processes(args.processes, args.rounds if args.starts else 0)
    elif args.starts:
        starts(args.rounds)
    else:
        main(args.folder)
