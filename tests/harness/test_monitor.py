"""The monitor's reading of the cell's own CPU (harness.monitor): other load is read against it."""

from __future__ import annotations

import subprocess
import sys

import psutil
from feedbench.harness.monitor import _cell_cpu_s

BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"


def test_a_child_that_ended_and_was_reaped_stays_the_cells_cpu():
    """A loader worker that ends inside the window (an epoch boundary without persistent_workers)
    leaves the live processes; its CPU must stay the cell's, else the verdict would call it other
    load."""
    process = psutil.Process()
    before = _cell_cpu_s(process)
    subprocess.run([sys.executable, "-c", BURN], check=True)  # waited for: reaped
    assert _cell_cpu_s(process) - before >= 0.3


def test_a_worker_reaped_by_a_server_the_cell_started_stays_the_cells_cpu():
    """With forkserver a worker is the server's child, and the server reaps it: the live server's
    reaped children count too."""
    process = psutil.Process()
    before = _cell_cpu_s(process)
    server = f"import subprocess, sys, time\nsubprocess.run([sys.executable, '-c', {BURN!r}])\n"
    server += "print('reaped', flush=True)\ntime.sleep(60)"
    with subprocess.Popen([sys.executable, "-c", server], stdout=subprocess.PIPE, text=True) as it:
        try:
            assert it.stdout.readline().strip() == "reaped"
            assert _cell_cpu_s(process) - before >= 0.3
        finally:
            it.kill()


def test_a_monitored_process_that_ends_leaves_a_summary_not_a_crash():
    """A command's process may end as its window closes, before its monitor stops
    (harness.command): the monitor stops sampling, and stop() still gives a summary."""
    import subprocess
    import sys
    import time

    from feedbench.harness.monitor import Monitor

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    monitor = Monitor(0.05, None, pid=child.pid)
    monitor.start()
    child.wait()
    time.sleep(0.2)
    monitor.stop()
    assert monitor.cpu_offered is None  # its CPU time could not be read at the end
    assert monitor.summary()["interval_s"] == 0.05
