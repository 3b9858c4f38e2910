"""A process feedbench starts that must not outlive the one that started it.

Passed as `preexec_fn` to subprocess: the job's harness (plan.job) and a command cell's command
(harness.command). A cluster that tracks a job's processes by their parents
(ProctrackType=proctrack/linuxproc) never kills one whose parent died: it would run on, unseen.
"""

from __future__ import annotations

import signal


def end_with_parent() -> None:
    """In the child, before it starts: SIGTERM when its parent dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so that it records what it measured and ends."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    # not Linux: the child still gets the SIGTERM its parent passes on
    except (OSError, AttributeError):
        pass
