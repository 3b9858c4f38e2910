"""One cell run by the harness in a process of its own whose affinity mask holds the first `cores` CPUs of this
process's (os.sched_setaffinity before the harness starts; its loader workers inherit the mask).

The loader-scaling cells (tests/loader_scaling.py, benchmarks/loader_scaling_error.py) and the CPU-speed reference
(feedbench.harness.cpu_speed) run so: a cell on one core measures one core, whatever else the machine has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# The folder feedbench is imported from, so that the child finds the same package.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RUN = (
    "import json, os, sys\n"
    "os.sched_setaffinity(0, set(json.loads(sys.argv[1])))\n"
    "from feedbench.harness.runner import run\n"
    "sys.exit(run(json.loads(sys.argv[2]), sys.argv[3]))\n"
)


def run_masked(knobs: dict, out: str, cores: int, python_path: tuple[str, ...] = (), timeout: float = 600) -> dict:
    """One cell in a process whose affinity mask is this process's first `cores` CPUs (`python_path`: folders the
    child imports the user's code from); its result. RuntimeError when the cell fails or the mask cannot be had."""
    mask = sorted(os.sched_getaffinity(0))[:cores]
    if len(mask) < cores:
        raise RuntimeError(f"{cores} cores asked, this process may use {len(mask)}")
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
        raise RuntimeError(f"{out}: exit {done.returncode}: {result.get('error')} {done.stderr[-2000:]}")
    return result
