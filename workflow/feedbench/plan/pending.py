"""A Slurm job that waits in the queue: its reason in plain words, when to say it, when to give up.

squeue's reason (%r) is Slurm's reason code ("Priority", "PartitionTimeLimit") or the scheduler's
own text for it ("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority
partitions", "ReqNodeNotAvail, UnavailableNodes:n1"), as Slurm 22.05 gave them on the test cluster.
Some reasons clear by themselves (other jobs end, a reservation starts); others wait for a person (a
node down or drained, a partition that can never give what the job asks): only those count towards
the user's `slurm.pending_timeout`. docs/slurm.md, "Pending jobs".

Plain Python: feedbench.plan.slurm runs it inside Snakemake's status checks.
"""

from __future__ import annotations

from dataclasses import dataclass

# An unchanged reason is said again at most this often (the first check after it: checks are up to
# 180 s apart).
NOTICE_EVERY_S = 300
# How many jobs one notice names; the rest are counted.
NAMED = 5

# (text in the reason, plain words, whether it clears by itself), the first match wins: the
# maintenance reservation comes as "ReqNodeNotAvail, Reserved for maintenance", before
# ReqNodeNotAvail's own words.
KINDS = (
    ("Reserved for maintenance", "reservation: the nodes are reserved for maintenance", True),
    ("DOWN, DRAINED", "node down or drained (or held for a higher-priority partition)", False),
    ("ReqNodeNotAvail", "node down or drained: a node it needs is not available", False),
    ("NodeDown", "node down", False),
    ("ReservationDeleted", "reservation: the job's reservation was deleted", False),
    ("Reservation", "reservation: waiting for its reservation to start", True),
    ("PartitionConfig", "the partition can never give what it asks (its configuration)", False),
    (
        "PartitionNodeLimit",
        "the partition can never give it: more nodes than the partition allows",
        False,
    ),
    (
        "PartitionTimeLimit",
        "the partition can never give it: more time than the partition allows",
        False,
    ),
    ("PartitionDown", "the partition is down", False),
    ("PartitionInactive", "the partition is inactive", False),
    ("BadConstraints", "no node meets its constraints", False),
    ("InvalidAccount", "its account is not valid", False),
    ("InvalidQOS", "its QOS is not valid", False),
    ("JobHeld", "held (scontrol release starts it)", False),
    ("DependencyNeverSatisfied", "a dependency that can never be satisfied", False),
    ("PerJob", "over a per-job limit of its QOS or account", False),
    ("Resources", "waiting for free resources", True),
    ("Priority", "waiting behind jobs of higher priority", True),
)


def describe(reason: str) -> tuple[str, bool]:
    """Slurm's reason in plain words, and whether it clears without a person (unknown reasons are
    assumed to)."""
    for text, words, clears in KINDS:
        if text in reason:
            return words, clears
    return "waiting", True


def said(reason: str) -> str:
    """'pending: node down or drained (Slurm: ReqNodeNotAvail, UnavailableNodes:n1)': one clause, no
    ';' (the lost record's message is cut at its first ';')."""
    return f"pending: {describe(reason)[0]} (Slurm: {reason.replace(';', ',')})"


@dataclass
class Seen:
    reason: str
    told: float  # when it was last said
    # since when its reasons have been ones that do not clear by themselves
    stuck_since: float | None


class Watch:
    """The run's pending jobs across status checks: which to name now, which to give up on.
    `timeout_s`: the user's pending_timeout, in seconds (None: wait, only say why)."""

    def __init__(self, timeout_s: float | None = None):
        self.timeout_s = timeout_s
        self.seen: dict[str, Seen] = {}

    def update(self, pending: dict[str, str], now: float) -> tuple[list[str], dict[str, str]]:
        """`pending`: job id -> Slurm's reason of every job of the run pending now. Returns the jobs
        to name now (a reason first seen or changed, or said NOTICE_EVERY_S ago), and job id -> why,
        for the jobs pending past timeout_s for reasons that do not clear by themselves ("pending:
        node down ... for 62 s, past ...")."""
        # started, or gone
        self.seen = {job: seen for job, seen in self.seen.items() if job in pending}
        tell, give_up = [], {}
        for job, reason in pending.items():
            if reason in ("", "None"):  # not looked at by the scheduler yet
                continue
            clears = describe(reason)[1]
            seen = self.seen.get(job)
            if seen is None or seen.reason != reason or now - seen.told >= NOTICE_EVERY_S:
                tell.append(job)
                stuck_since = (
                    None
                    if clears
                    else (seen.stuck_since if seen and seen.stuck_since is not None else now)
                )
                self.seen[job] = Seen(reason, now, stuck_since)
            elif clears:
                seen.stuck_since = None
            stuck = self.seen[job].stuck_since
            if self.timeout_s is not None and stuck is not None and now - stuck >= self.timeout_s:
                minutes = f"{self.timeout_s / 60:g}"
                give_up[job] = (
                    f"{said(reason)} for {now - stuck:.0f} s, past "
                    f"slurm.pending_timeout ({minutes} min)"
                )
        return tell, give_up


def notices(
    tell: list[str], reasons: dict[str, str], names: dict[str, str], timeout_s: float | None
) -> list[str]:
    """One line per reason for the jobs to name: 'feedbench: pending: node down or drained (Slurm:
    ...): lost/c/rep1 (Slurm job 12), ...', and what the run does about it."""
    by_reason: dict[str, list[str]] = {}
    for job in tell:
        by_reason.setdefault(reasons[job], []).append(
            f"{names.get(job, 'a job')} (Slurm job {job})"
        )
    lines = []
    for reason, jobs in by_reason.items():
        listed = ", ".join(jobs[:NAMED]) + (
            f" and {len(jobs) - NAMED} more" if len(jobs) > NAMED else ""
        )
        if describe(reason)[1]:
            then = "Slurm starts it when this clears"
        elif timeout_s is None:
            then = (
                "it will not start until an administrator acts; slurm.pending_timeout "
                "would cancel it"
            )
        else:
            then = (
                "it will not start until an administrator acts; cancelled after "
                f"{timeout_s / 60:g} min of this"
            )
        lines.append(f"feedbench: {said(reason)}: {listed}; {then}")
    return lines
