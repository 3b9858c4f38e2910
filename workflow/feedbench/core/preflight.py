"""The preflight of an experiment whose cells run the user's code: its user code built once, before
the matrix.

A dataset factory that raises, a collate that cannot batch, a model whose forward does not take the
batch, a `forward_keys` the batch lacks: each fails every cell of its experiment. The preflight
finds it in one light job (workflow/rules/preflight.smk) that every bench job of the experiment
waits for. Each distinct combination of user code in the experiment (combinations) is built once by
the harness's own paths (feedbench.harness.preflight): the dataset, one sample, one batch through
the collate, the model and one step, each mismatch it can find (every failure it finds, not the
first: feedbench.harness.preflight). The job writes a small record,
results/preflight/<experiment>.json, and succeeds either way; the record decides whether the
experiment's cells run. A failed one stops the experiment: no bench job of it is submitted, each of
its cells gets a failed record instead (stopped.json, which the summary and report read as they read
a result), and the run's end says so (stopped_lines), once for experiments stopped by the same
faults. Other experiments go on.

The ceiling experiments (core.ceilings) derive their cells from the user's: their preflight waits
for the preflights of the experiments whose cells they bound (waits_for), and a combination that
bounds only experiments whose preflight failed is not checked, its cells stopped with their
experiments' (orphaned): the user's fault is found, and said, once. No torch here: the Snakefile
imports this module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from .ceilings import CEILING_EXPERIMENTS, ceiling_map
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
# How a stopped record of a ceiling cell begins when the preflight that stopped it is that of the
# experiment whose cells it bounds (orphaned), not its own.
STOPPED_BY_BOUNDED = "stopped by the preflight of experiment "

# What decides what the preflight builds, besides the user's code: cells equal on these are one
# combination.
KEYS = (
    "scenario",
    "device",
    "python_path",
    *ARG_KNOBS,
    "forward_keys",
    "label_key",
    "command",
    "python",
    "workdir",
)
DATA_ONLY = ("loader", "transfer")  # scenarios with no model and no step


def needs_preflight(knobs: dict) -> bool:
    """Whether a cell runs user code that its scenario uses: a loader or transfer cell only what
    makes its batch; a command cell, its command (harness.command.preflight)."""
    if knobs.get("command"):
        return True
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


def ceiling_sources(cells) -> dict[tuple[str, str], set[str]]:
    """(ceiling experiment, cell) -> the experiments whose training cells it bounds (the planner's
    map, core.ceilings.ceiling_map), for each cell of a ceiling experiment that bounds one."""
    ceilings = set(CEILING_EXPERIMENTS.values())
    sources: dict[tuple[str, str], set[str]] = {}
    for training, bounds in ceiling_map(list(cells)).items():
        for key in filter(None, bounds.values()):
            experiment, _, cell = key.partition("/")
            if experiment in ceilings:
                sources.setdefault((experiment, cell), set()).add(training.partition("/")[0])
    return sources


def gates(cells, preflights) -> dict[str, dict[str, list[str]]]:
    """ceiling experiment -> its cell -> the experiments it bounds, for each cell whose experiments
    all have a preflight (`preflights`: their names) and are no ceiling experiment: once each of
    them failed, the cell is needed by none (orphaned). A cell that bounds any other is always
    needed, and left out."""
    found: dict[str, dict[str, list[str]]] = {}
    for (experiment, cell), served in ceiling_sources(cells).items():
        if served <= set(preflights) - set(CEILING_EXPERIMENTS.values()):
            found.setdefault(experiment, {})[cell] = sorted(served)
    return found


def waits_for(experiment: str, cells, gated: dict[str, list[str]]) -> dict[str, list[str]]:
    """The first cell of each combination of a ceiling experiment's cells (`cells`: PlannedCells,
    in the config's order) -> the experiments its cells bound, where every cell of it is gated
    (gates: `gated`, the experiment's); a combination with another cell is checked whatever they
    find, and left out. Its preflight waits for theirs, and checks a combination only where one of
    them passed."""
    found: dict[str, list] = {}
    for cell in cells:
        if cell.experiment != experiment or not needs_preflight(cell.knobs):
            continue
        first = found.setdefault(combination(cell.knobs), [cell.id, set(), True])
        served = gated.get(cell.id)
        first[1] |= set(served or ())
        first[2] = first[2] and served is not None
    return {first: sorted(served) for first, served, all_gated in found.values() if all_gated}


def orphaned(gated: dict[str, list[str]], failed: set[str]) -> dict[str, str]:
    """A ceiling experiment's cells (gated: its gates) every experiment of which its preflight
    stopped (`failed`) -> the first such experiment: its record stops the cell."""
    return {
        cell: served[0]
        for cell, served in gated.items()
        if served and all(name in failed for name in served)
    }


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


def run(
    cells_json: str, out: str, log: str, attempt: str = "first", after: str | None = None
) -> int:
    """The preflight job: the check in a process of its own (`feedbench preflight --here`, which
    imports torch), its output in `log`; when it died without a record (SIGKILL, the OOM killer, a
    crash in a C extension), a failed record saying so. `after` (a ceiling experiment's, JSON): the
    first cell of a combination -> the preflight records of the experiments it bounds (waits_for);
    a combination all of whose records failed is not checked, but listed as `skipped`. 0 whenever a
    record is there at the end."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    if os.path.exists(out):
        os.remove(out)
    cells, skipped = _unless_stopped(json.loads(cells_json), json.loads(after or "{}"))
    experiment = (json.loads(cells_json) or [{}])[0].get("experiment")
    if not cells:  # nothing left to check: no process
        with open(log, "w", encoding="utf-8") as f:
            f.write("".join(f"feedbench: not checked: {s['cell']}: {s['why']}\n" for s in skipped))
        write(out, record(experiment, log, [], [], attempt=attempt, skipped=skipped))
        return 0
    arguments = ["--cells", json.dumps(cells), "--out", out, "--log", log, "--attempt", attempt]
    command = [sys.executable, "-m", "feedbench", "preflight", "--here", *arguments]
    with open(log, "w", encoding="utf-8") as f:
        code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode
    if os.path.exists(out):
        if skipped:
            write(out, dict(read(out), skipped=skipped))
        return 0
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
    write(out, record(experiment, log, [], [error], attempt=attempt, skipped=skipped))
    return 0


def _unless_stopped(cells: list[dict], after: dict[str, list[str]]) -> tuple[list, list]:
    """(the cells to check, those not checked, each with why): a combination whose experiments'
    preflights (`after`: its first cell -> their records) all failed is needed by none of them."""
    keep, skipped = [], []
    for cell in cells:
        records = after.get(cell.get("cell")) or []
        if records and all(failed(path) for path in records):
            names = ", ".join(read(path).get("experiment") or path for path in records)
            why = f"it bounds only cells of experiments their preflight stopped: {names}"
            skipped.append({"cell": cell.get("cell"), "why": why})
        else:
            keep.append(cell)
    return keep, skipped


def record(
    experiment: str | None,
    log: str,
    checked: list[dict],
    errors: list[dict],
    device: str | None = None,
    **more,
) -> dict:
    """The preflight's record: ok, or every distinct failure it found (`errors`: stage, factory,
    cell, type, first line, traceback; the first also `error`), where its log is and ran, and
    `more` (the attempt it was, the combinations it skipped)."""
    return {
        "experiment": experiment,
        "status": "failed" if errors else "ok",
        "checked": checked,
        "error": errors[0] if errors else None,
        "errors": list(errors),
        "device": device,
        "log": log,
        "finished_at": now(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),  # where it ran: None outside a Slurm job
        **more,
    }


def write(path: str, found: dict) -> None:
    atomic_write(path, json.dumps(found, indent=1, default=str) + "\n")


def faults(found: dict) -> list[str]:
    """Each failure of a failed record, `<factory> raised <Type>: <first line>` (how the process
    ended, where it died), without where its traceback is. A record of before `errors` has its one
    `error`."""
    errors = found.get("errors") or ([found["error"]] if found.get("error") else [])
    lines = []
    for error in errors:
        if error.get("stage") == "process":  # no exception to name: how the process ended
            lines.append(str(error.get("message")))
            continue
        if error.get("stage") == "command":  # the command's own line says what happened
            lines.append(f"{error.get('factory')}: {error.get('message')}")
            continue
        what = ": ".join(part for part in (error.get("type"), error.get("message")) if part)
        lines.append(f"{error.get('factory', 'the preflight')} raised {what}")
    return lines


def reason(found: dict) -> str:
    """Every failure of a failed record in one line (faults, joined by '; '), and where its
    traceback is: `<factory> raised <Type>: <first line> (traceback: <log>)`."""
    error = found.get("error") or {}
    where = "log" if error.get("stage") in ("process", "command") else "traceback"
    return f"{'; '.join(faults(found))} ({where}: {found.get('log')})"


def stopped_line(experiment: str, path: str) -> str | None:
    """The run's end, for an experiment its preflight stopped (stopped_lines); None when its record
    is not a failure."""
    lines = stopped_lines({experiment: path})
    return "\n".join(lines) if lines else None


def stopped_lines(records: dict[str, str]) -> list[str]:
    """The run's end, for the experiments (-> their preflight records) a preflight stopped: one
    line per distinct set of faults, naming every experiment it stopped (a fault of the user's code
    shared by several experiments is said once), and the first one's log; a set of several faults
    then one indented line each."""
    found: dict[tuple, list] = {}
    for experiment, path in records.items():
        try:
            record_ = read(path)
        except (OSError, ValueError):
            continue
        if record_.get("status") != "ok":
            found.setdefault(tuple(faults(record_)), [record_, []])[1].append(experiment)
    lines = []
    for said, (first, names) in found.items():
        subject = (
            f"experiment {names[0]} stopped by its preflight, none of its cells ran"
            if len(names) == 1
            else f"experiments {', '.join(names)} stopped by their preflights (the same "
            "faults), none of their cells ran"
        )
        if len(said) == 1:
            lines.append(f"feedbench: {subject}: {reason(first)}")
            continue
        lines.append(f"feedbench: {subject}: {len(said)} faults (tracebacks: {first.get('log')}):")
        lines += [f"  {fault}" for fault in said]
    return lines


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
    whose = (
        "its experiment's preflight"
        if found.get("experiment") in (None, labelled.get("experiment"))
        else f"{STOPPED_BY_BOUNDED.removeprefix('stopped by ')}{found['experiment']}, whose cells "
        "it bounds"
    )
    stopped["error"] = {
        "type": STOPPED_TYPE,
        "message": f"stopped by {whose}, not run: {reason(found)}",
        "traceback": ((found.get("error") or {}).get("traceback") or "")[-4000:],
    }
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    write(out, stopped)
