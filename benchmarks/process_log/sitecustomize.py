"""Log every Python process of a test run: its command line, CPU and wall seconds, and the test that
started it, one JSON line at exit in $SUITE_PROCESS_LOG/<pid>.jsonl (benchmarks/suite_cpu.py
--processes sums them by kind).

Python imports `sitecustomize` at start-up from the path, so this folder on PYTHONPATH reaches every
Python process that inherits the environment: the pytest workers, Snakemake, its jobs and scripts,
the harness, torchrun's ranks. Not logged: a process whose PYTHONPATH a test replaces, one that ends
by a signal or os._exit (a DataLoader worker: its CPU is its parent's reaped children), and anything
not Python (Chromium, slurmd).
"""

import atexit
import json
import os
import resource
import sys
import time

_START = time.monotonic()


def _write() -> None:
    folder = os.environ.get("SUITE_PROCESS_LOG")
    if not folder:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {
        "argv": sys.argv[:12],
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": time.monotonic() - _START,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
    }
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


if os.environ.get("SUITE_PROCESS_LOG"):
    atexit.register(_write)
