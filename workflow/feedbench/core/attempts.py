"""Every attempt at a cell kept (issue #36; docs/reliability-slurm.md, "Every attempt kept").

Before a rerun writes, the earlier attempt's files (result.json or lost.json, steps.csv, trace.json,
cell.yaml, ...) and its bench log move to `attempts/<n>/` in the cell's folder, with `attempt.json`:
how it ended (ok, failed, lost and its Slurm state), its Slurm job id and the steps it measured.
Nothing measured is deleted; the summary reads only the cell's own result.json (or lost.json), the
report names the earlier attempts (`earlier_text`).

Two callers, because Snakemake deletes a job's output and log before the job starts: the run's
onstart, for the cell jobs it is about to run (so the failed result.json and the log are still
there), and the bench job itself (plan.job), for what is left when onstart did not run
(`--no-hooks`, a job run by hand). No torch, no pandas.
"""

from __future__ import annotations

import json
import os
import shutil

from .result import now

ATTEMPTS = "attempts"
RECORD = "attempt.json"
# Files that make a folder hold an attempt: a result, a lost cell's record, or measured steps.
MEASURED = ("result.json", "lost.json", "steps.csv")
LOG = "bench.log"


def _load(path: str) -> dict | None:
    """A JSON mapping, or None (missing, damaged)."""
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _record(folder: str) -> tuple[str | None, dict | None]:
    """The attempt's record, lost.json before result.json, as (its name, the record or None when the
    result schema refuses it: core.result.read_result); (None, None) without one. A damaged record
    still moves, as it is."""
    from .result import UnusableResult, read_result  # jsonschema: only when an attempt moves

    for name in ("lost.json", "result.json"):
        if os.path.exists(os.path.join(folder, name)):
            try:
                return name, read_result(os.path.join(folder, name))
            except UnusableResult:
                return name, None
    return None, None


def _steps(folder: str, record: dict | None) -> int:
    """Steps the attempt measured and kept: the rows of its steps.csv, else its result's count."""
    try:
        with open(os.path.join(folder, "steps.csv"), encoding="utf-8") as f:
            return max(sum(1 for _ in f) - 1, 0)
    except OSError:
        steps = ((record or {}).get("metrics") or {}).get("steps")
        return steps if isinstance(steps, int) else 0


def describe(folder: str) -> dict:
    """How the attempt in `folder` ended: status (ok, failed, lost; damaged for a record that cannot
    be read, unrecorded when the job left none), error type, Slurm job id and state (a lost
    record's; a harness result's job id from its provenance), steps."""
    name, record = _record(folder)
    slurm = (record or {}).get("slurm") or {}
    if record is None:
        status = "damaged" if name else "unrecorded"
    else:
        status = "lost" if name == "lost.json" else record["status"]
    return {
        "status": status,
        "error": ((record or {}).get("error") or {}).get("type"),
        "slurm_job_id": slurm.get("job_id")
        or ((record or {}).get("provenance") or {}).get("slurm_job_id"),
        "slurm_state": slurm.get("state"),
        "steps": _steps(folder, record),
    }


def numbers(folder: str) -> list[int]:
    """The numbers of the earlier attempts kept in `folder`, in order."""
    try:
        names = os.listdir(os.path.join(folder, ATTEMPTS))
    except OSError:
        return []
    return sorted(int(name) for name in names if name.isdigit())


def keep_earlier(folder: str, log: str | None = None) -> str | None:
    """Move the attempt in `folder`, and its bench log `log`, to `folder/attempts/<n>/` (n: one past
    the last kept) with its attempt.json; the new folder, or None when `folder` holds no attempt
    (nothing in MEASURED)."""
    try:
        names = [name for name in os.listdir(folder) if name != ATTEMPTS]
    except OSError:
        return None
    if not any(name in MEASURED for name in names):
        return None
    kept = numbers(folder)
    target = os.path.join(folder, ATTEMPTS, str((kept[-1] if kept else 0) + 1))
    os.makedirs(target)
    facts = describe(folder)
    for name in names:
        os.replace(os.path.join(folder, name), os.path.join(target, name))
    if log and os.path.exists(log):
        shutil.move(log, os.path.join(target, LOG))
    with open(os.path.join(target, RECORD), "w", encoding="utf-8") as f:
        json.dump(dict(facts, attempt=int(os.path.basename(target)), moved_at=now()), f, indent=1)
    return target


def _ended(facts: dict) -> str:
    """How one earlier attempt ended, in words: "lost to NODE_FAIL after 51 steps"."""
    status = facts.get("status")
    if status == "lost":
        how = f"lost to {facts.get('slurm_state') or 'Slurm'}"
    elif status == "failed":
        how = f"failed ({facts['error']})" if facts.get("error") else "failed"
    elif status == "ok":
        how = "completed, replaced by a rerun"
    elif status == "damaged":
        how = "left a damaged result"
    else:
        how = "ended with no record"
    steps = facts.get("steps") or 0
    return f"{how} after {steps} step{'' if steps == 1 else 's'}"


def earlier_text(folder: str) -> str | None:
    """The attempts at the cell of `folder` in words, "attempt 2; attempt 1 lost to NODE_FAIL after
    51 steps", or None when its result is its first attempt."""
    kept = numbers(folder)
    if not kept:
        return None
    ended = []
    for n in kept:
        facts = _load(os.path.join(folder, ATTEMPTS, str(n), RECORD)) or {}
        ended.append(f"attempt {n} {_ended(facts)}")
    return "; ".join([f"attempt {kept[-1] + 1}", *ended])
