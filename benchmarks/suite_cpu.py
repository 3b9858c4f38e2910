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


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else OUT)
