"""One cell run by the harness in a process of its own whose affinity mask holds the `cores` CPUs of
this process's that other work kept least busy just before (quietest; os.sched_setaffinity before
the harness starts; its loader workers inherit the mask).

The loader-scaling cells (tests/helpers/loader_scaling.py, benchmarks/loader_scaling_error.py) and
the CPU-speed reference (feedbench.harness.cpu_speed) run so: a cell on one core measures one core,
whatever else the machine has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

# The folder feedbench is imported from, so that the child finds the same package.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RUN = (
    "import json, os, sys\n"
    "os.sched_setaffinity(0, set(json.loads(sys.argv[1])))\n"
    "from feedbench.harness.runner import run\n"
    "sys.exit(run(json.loads(sys.argv[2]), sys.argv[3]))\n"
)


def quietest(cores: int, probe_s: float = 0.5) -> list[int]:
    """This process's `cores` CPUs that other work kept least busy over `probe_s` (/proc/stat,
    through psutil).

    A one-core cell on a core it shares with a CPU hog cost 2.0 to 2.6 CPU ms a sample where the
    two-core cell, whose processes the scheduler kept off the hog's core, cost 1.9
    (examples/own-pipeline): the one-core point read 15 % low on offered cores. On the quieter core
    it reads what a free core delivers."""
    import psutil

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < cores:
        raise RuntimeError(f"{cores} cores asked, this process may use {len(allowed)}")
    if len(allowed) == cores:
        return allowed
    before = psutil.cpu_times(percpu=True)
    time.sleep(probe_s)
    after = psutil.cpu_times(percpu=True)
    idle = {cpu: (after[cpu].idle - before[cpu].idle) for cpu in allowed}
    return sorted(sorted(allowed, key=lambda cpu: -idle[cpu])[:cores])


def run_masked(
    knobs: dict, out: str, cores: int, python_path: tuple[str, ...] = (), timeout: float = 600
) -> dict:
    """One cell in a process whose affinity mask is this process's `cores` quietest CPUs
    (`python_path`: folders the child imports the user's code from); its result. RuntimeError when
    the cell fails or the mask cannot be had."""
    mask = quietest(cores)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGE_PARENT, *python_path])}
    done = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(mask), json.dumps(knobs), out],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    try:
        with open(os.path.join(out, "result.json")) as f:
            result = json.load(f)
    except (OSError, ValueError):
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{out}: exit {done.returncode}, no result: {tail[0]}") from None
    if done.returncode != 0:
        raise RuntimeError(
            f"{out}: exit {done.returncode}: {result.get('error')} {done.stderr[-2000:]}"
        )
    return result
