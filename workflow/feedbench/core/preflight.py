"""The preflight of an experiment whose cells run the user's code: its user code built once, before
the matrix.

A dataset factory that raises, a collate that cannot batch, a model whose forward does not take the
batch, a `forward_keys` the batch lacks: each fails every cell of its experiment. The preflight
finds it in one light job (workflow/rules/preflight.smk) that every bench job of the experiment
waits for. Each distinct combination of user code in the experiment (combinations) is built once by
the harness's own paths (feedbench.harness.preflight): the dataset, one sample, one batch through
the collate, the model and one step. The job writes a small record,
results/preflight/<experiment>.json, and succeeds either way; the record decides whether the
experiment's cells run. A failed one stops the experiment: no bench job of it is submitted, each of
its cells gets a failed record instead (stopped.json, which the summary and report read as they read
a result), and the run's end says so in one line (stopped_line). Other experiments go on. No torch
here: the Snakefile imports this module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from .knobs import user_batch, user_code_of
from .planned_cell import ARG_KNOBS
from .resources import knob
from .result import CELL_DIR, atomic_write, failed_result, now, tail

PREFLIGHT = "results/preflight/{experiment}.json"
PREFLIGHT_LOG = "logs/preflight/{experiment}.log"
# A stopped cell's record, in the cell's folder beside where its result.json would be: a failed
# result the summary reads in its place (as lost.json after a lost Slurm job).
STOPPED = f"{CELL_DIR}/stopped.json"
STOPPED_TYPE = "StoppedByPreflight"

# What decides what the preflight builds, besides the user's code: cells equal on these are one
# combination.
KEYS = ("scenario", "device", "python_path", *ARG_KNOBS, "forward_keys", "label_key")
DATA_ONLY = ("loader", "transfer")  # scenarios with no model and no step


def needs_preflight(knobs: dict) -> bool:
    """Whether a cell runs user code that its scenario uses: a loader or transfer cell only what
    makes its batch."""
    if knob(knobs, "scenario") in DATA_ONLY:
        return user_batch(knobs)
    return bool(user_code_of(knobs))


def combination(knobs: dict) -> str:
    """The cell's combination: its user code and what else decides what the preflight builds, as one
    text."""
    key = {name: knob(knobs, name) for name in KEYS}
    return json.dumps({**key, **user_code_of(knobs)}, sort_keys=True, default=str)


def combinations(cells) -> dict[str, list]:
    """experiment -> the first cell of each distinct combination of its cells that need a preflight
    (PlannedCells, in the config's order); experiments with none are left out."""
    found: dict[str, dict[str, object]] = {}
    for cell in cells:
        if needs_preflight(cell.knobs):
            found.setdefault(cell.experiment, {}).setdefault(combination(cell.knobs), cell)
    return {experiment: list(firsts.values()) for experiment, firsts in found.items()}


def resources(cells) -> dict:
    """The preflight job's resources: one process on one device, with the memory of a cell's rank
    and no workers (feedbench.core.resources), and one GPU where a cell of the experiment may use
    one."""
    from . import resources as cell_resources

    one = [dict(c.knobs, num_workers=0, gpus_per_node=1, nodes=1, parallel="none") for c in cells]
    return {
        "mem_mb": max(cell_resources.mem_mb(k) for k in one),
        "gpu": 1 if any(cell_resources.uses_gpus(k) for k in one) else 0,
    }


def read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def attempt(path: str, retry_failed: bool) -> str:
    """Which attempt the preflight makes (its job's params, kept in its record): after a failed one,
    with retry_failed, a new one, so that a volume mounted since, or data written, lets the
    experiment run; else the one its record ran as, and Snakemake leaves it be."""
    if not os.path.exists(path):
        return "first"
    try:
        found = read(path)
    except (OSError, ValueError):
        return "retry-after-damaged" if retry_failed else "first"
    if found.get("status") == "ok" or not retry_failed:
        return found.get("attempt", "first")
    return f"retry-after-{found.get('finished_at')}"


def failed(path: str) -> bool:
    """Whether the preflight record at path exists and stopped its experiment."""
    try:
        return read(path).get("status") != "ok"
    except (OSError, ValueError):
        return False


def run(cells_json: str, out: str, log: str, attempt: str = "first") -> int:
    """The preflight job: the check in a process of its own (`feedbench preflight --here`, which
    imports torch), its output in `log`; when it died without a record (SIGKILL, the OOM killer, a
    crash in a C extension), a failed record saying so. 0 whenever a record is there at the end."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    if os.path.exists(out):
        os.remove(out)
    arguments = ["--cells", cells_json, "--out", out, "--log", log, "--attempt", attempt]
    command = [sys.executable, "-m", "feedbench", "preflight", "--here", *arguments]
    with open(log, "w", encoding="utf-8") as f:
        code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode
    if os.path.exists(out):
        return 0
    experiment = (json.loads(cells_json) or [{}])[0].get("experiment")
    killed = (
        f" ({signal.Signals(-code).name})"
        if code < 0 and -code in signal.Signals._value2member_map_
        else ""
    )
    error = {
        "stage": "process",
        "factory": "the preflight's process",
        "type": "Killed" if killed else "Crashed",
        "message": f"the preflight exited with code {code}{killed} without writing its record",
        "traceback": tail(log)[-4000:],
    }
    write(out, record(experiment, log, [], error, attempt=attempt))
    return 0


def record(
    experiment: str | None,
    log: str,
    checked: list[dict],
    error: dict | None,
    device: str | None = None,
    **more,
) -> dict:
    """The preflight's record: ok, or the error of the first combination that failed (stage,
    factory, type, first line, traceback), where its log is and ran, and `more` (the attempt it
    was)."""
    return {
        "experiment": experiment,
        "status": "ok" if error is None else "failed",
        "checked": checked,
        "error": error,
        "device": device,
        "log": log,
        "finished_at": now(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),  # where it ran: None outside a Slurm job
        **more,
    }


def write(path: str, found: dict) -> None:
    atomic_write(path, json.dumps(found, indent=1, default=str) + "\n")


def reason(found: dict) -> str:
    """`<factory> raised <Type>: <first line> (traceback: <log>)`, of a failed record."""
    error = found.get("error") or {}
    if error.get("stage") == "process":  # no exception to name: how the process ended
        return f"{error.get('message')} (log: {found.get('log')})"
    if error.get("stage") == "command":  # the command's own line says what happened
        return f"{error.get('factory')}: {error.get('message')} (log: {found.get('log')})"
    what = ": ".join(part for part in (error.get("type"), error.get("message")) if part)
    return f"{error.get('factory', 'the preflight')} raised {what} (traceback: {found.get('log')})"


def stopped_line(experiment: str, path: str) -> str | None:
    """The run's end, for an experiment its preflight stopped: one line; None when its record is not
    a failure."""
    try:
        found = read(path)
    except (OSError, ValueError):
        return None
    if found.get("status") == "ok":
        return None
    return (
        f"feedbench: experiment {experiment} stopped by its preflight, none of its cells "
        f"ran: {reason(found)}"
    )


def with_stopped_cells(inputs: list[str], stopped: dict[str, list]) -> list[str]:
    """Rule aggregate's inputs as the summary reads them: each failed preflight record among them (a
    key of `stopped`: record -> [(a cell's stopped record, its labelled knobs)]) replaced by its
    cells' stopped records, written here. Written by the summary, not by a job each: a local job per
    cell costs a parse of the Snakefile."""
    paths = [path for path in inputs if path not in stopped]
    for record, cells in stopped.items():
        for out, labelled in cells:
            write_stopped(record, labelled, out)
            paths.append(out)
    return paths


def write_stopped(preflight: str, labelled: dict, out: str) -> None:
    """A stopped cell's record (STOPPED): a failed result, valid against the result schema, whose
    error is the preflight's, so the summary and the report list the cell as failed and say why."""
    found = read(preflight)
    stopped = dict(
        failed_result(labelled, labelled),
        started_at=found["finished_at"],
        finished_at=found["finished_at"],
    )
    stopped["error"] = {
        "type": STOPPED_TYPE,
        "message": f"stopped by its experiment's preflight, not run: {reason(found)}",
        "traceback": ((found.get("error") or {}).get("traceback") or "")[-4000:],
    }
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    write(out, stopped)
