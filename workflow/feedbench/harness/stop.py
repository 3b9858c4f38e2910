"""How a running cell is asked to stop: SIGTERM (a cancel, a scheduler) or its own time limit.

Either sets a flag with the reason; the loop checks it at each step and ends
with Terminated, so the failed result keeps the steps measured so far. Raising
from the signal handler itself could interrupt the recording of an earlier
failure. A cell stuck inside one step (a hung loader, a collective waiting on
a dead peer) never reaches the check: the time limit then gives it a grace
period and calls `on_stuck`, which writes the result and ends the process.

The time limit exists so that a cell on a scheduler ends before the job's
limit does: a job killed by Slurm at its limit loses its output, while a cell
that stops itself a little earlier is recorded as failed, and retried.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable

SIGTERM_REASON = "terminated by SIGTERM (job cancelled, or a scheduler's time limit)"
STUCK_GRACE_S = 20.0  # at most; a quarter of the limit when that is shorter

STOP = threading.Event()
_reason = [SIGTERM_REASON]


class Terminated(Exception):
    """The cell was asked to stop (SIGTERM or its time limit); the message says which."""


def request_stop(reason: str) -> None:
    if not STOP.is_set():
        _reason[0] = reason
    STOP.set()


def clear() -> None:
    STOP.clear()
    _reason[0] = SIGTERM_REASON


def stop_reason() -> str | None:
    """Why the cell was asked to stop, or None while it was not."""
    return _reason[0] if STOP.is_set() else None


def check_stop() -> None:
    if STOP.is_set():
        raise Terminated(_reason[0])


def time_limit_reason(seconds: float) -> str:
    return (
        f"time limit of {seconds:g} s reached (the job's runtime less a margin to record "
        "the result)"
    )


def grace_s(seconds: float) -> float:
    """How long a cell past its time limit may take to reach the end of its step."""
    return min(STUCK_GRACE_S, seconds / 4)


def on_sigterm(signum, frame) -> None:
    request_stop(SIGTERM_REASON)


class TimeLimit:
    """SIGALRM after `seconds`: on_expiry(reason), then grace_s() later on_stuck(reason) unless
    cancelled first."""

    def __init__(
        self,
        seconds: float | None,
        on_expiry: Callable[[str], None] = request_stop,
        on_stuck: Callable[[str], None] | None = None,
    ):
        self.seconds, self.on_expiry, self.on_stuck = seconds, on_expiry, on_stuck
        self.grace: threading.Timer | None = None
        if seconds:
            signal.signal(signal.SIGALRM, self._expire)
            signal.setitimer(signal.ITIMER_REAL, seconds)

    def _expire(self, signum, frame) -> None:
        text = time_limit_reason(self.seconds)
        self.on_expiry(text)
        if self.on_stuck is not None:
            self.grace = threading.Timer(grace_s(self.seconds), self.on_stuck, args=(text,))
            self.grace.daemon = True
            self.grace.start()

    def cancel(self) -> None:
        """The result is written: no alarm, no grace period any more."""
        if self.seconds:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if self.grace is not None:
            self.grace.cancel()
