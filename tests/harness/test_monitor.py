"""The monitor's reading of the cell's own CPU (harness.monitor): other load is read against it."""

from __future__ import annotations

import subprocess
import sys

import psutil
from feedbench.harness.monitor import _cell_cpu_s


def test_a_child_that_ended_and_was_reaped_stays_the_cells_cpu():
    """A loader worker that ends inside the window (an epoch boundary without persistent_workers)
    leaves the live processes; its CPU must stay the cell's, else the verdict would call it other
    load."""
    process = psutil.Process()
    before = _cell_cpu_s(process)
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)  # waited for: reaped
    assert _cell_cpu_s(process) - before >= 0.3
