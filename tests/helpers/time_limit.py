"""A time limit for each test, as a pytest plugin: `pytest -p helpers.time_limit --each-test-s 60`.

The GPU check (benchmarks/gpu_check.sh) runs the GPU tests with it, so a test that hangs costs its
limit and the next one runs, instead of eating the check's few minutes. pytest-timeout would do it
where installed; a bare GPU machine has only pytest. The limit is SIGALRM on the main thread: it
stops Python code, and a call into CUDA when it returns; the check's limit on the whole part stops
the rest. The test fails with one line saying so.
"""

from __future__ import annotations

import signal

import pytest


class OverTimeLimit(Exception):
    pass


def pytest_addoption(parser):
    parser.addoption(
        "--each-test-s",
        type=float,
        default=None,
        help="fail a test whose setup or call runs longer than this many seconds (SIGALRM)",
    )


def _limited(item):
    limit = item.config.getoption("each_test_s")
    if not limit:
        yield
        return

    def expire(signum, frame):
        raise OverTimeLimit(f"{item.nodeid} ran over its {limit:g} s limit (--each-test-s)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    yield from _limited(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    yield from _limited(item)
