"""Cells a machine without CUDA runs alike, measured once.

On such a machine PyTorch's DataLoader ignores pin_memory, so a `pin_memory: true` cell runs the
very loader its `false` twin runs (core.fit resets it, as it resets knobs that need workers at 0
workers). Measuring both doubles the time and reports noise as an effect of pinning. Each such
cell's job waits for its twin's and takes its result as its own, with a note; the job checks that
the twin really ran on the CPU, and measures the cell itself where it did not (a cluster's GPU node,
say). Where the machine that parses the workflow may have CUDA (a device file a CUDA runtime needs:
core.fit.cuda_possible), only cells kept on the CPU by `device: cpu` are twins.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from collections.abc import Iterable, Mapping

from ..core.cell import parse_cell
from ..core.fit import TWIN_NOTE, cuda_possible, runs_as
from ..core.knobs import LABELS, KnobError
from ..core.planned_cell import PlannedCell

# Set by the run's own parse and inherited by every job, so that the Snakemake a cluster job starts
# on its node, which parses the workflow again there, plans the same twins as the run did.
CUDA_VARIABLE = "FEEDBENCH_CUDA_POSSIBLE"


def cuda_here(environ=os.environ) -> bool:
    """Whether the run's machine may have CUDA: the run's answer where a job inherits it, else this
    machine's, kept for the jobs."""
    if environ.get(CUDA_VARIABLE) not in ("0", "1"):
        environ[CUDA_VARIABLE] = "1" if cuda_possible() else "0"
    return environ[CUDA_VARIABLE] == "1"


def twins(
    cells: Mapping[tuple[str, str], PlannedCell],
    cuda_available: bool = False,
    skip: Iterable[str] = (),
) -> dict[tuple[str, str], str]:
    """(experiment, cell) -> the id of the cell of the same experiment measured for it, for every
    cell that runs as another on such a machine (with CUDA, only cells kept on the CPU by `device:
    cpu` can be). The one measured is the first of its group whose fit notes least (the cell as
    planned: `pin_memory: false` rather than `true`). Experiments in `skip` (a search's, the
    target's measured cells) are left alone."""
    groups: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    skip = set(skip)
    for (experiment, cell_id), planned in cells.items():
        if experiment in skip:
            continue
        try:  # checked cells carry their parse (plan.matrix.check_cell)
            ran = runs_as(planned.parsed or parse_cell(planned.labelled(1)), cuda_available)
        except KnobError:  # a cell that cannot run has no twin: its job says why
            continue
        if ran is not None:
            key, notes = ran
            groups[(experiment, key)].append((len(notes), cell_id))
    found = {}
    for (experiment, _), members in groups.items():
        measured = min(members, key=lambda member: member[0])[1] if len(members) > 1 else None
        for _, cell_id in members:
            if measured is not None and cell_id != measured:
                found[(experiment, cell_id)] = measured
    return found


# The label of a cell's JSON (rule bench's params.cell) naming its twin: the job's, never the
# harness's.
TWIN_LABEL = "measured_as"


def took_twins_result(out_dir: str, raw: dict, twin_id: str) -> bool:
    """Write the twin's result as this cell's, in out_dir: its figures and files, this cell's knobs
    and labels, and the notes of this cell's own fit with one that names the twin. Only where the
    twin measured on a machine without CUDA and runs as this cell there; else False (the job then
    measures the cell itself)."""
    from ..core.result import CELL_DIR, UnusableResult, read_result, write_result

    twin_dir = CELL_DIR.format(**{**raw, "cell": twin_id})
    try:
        twin = read_result(os.path.join(twin_dir, "result.json"))
        ran, own = (
            runs_as(parse_cell(knobs), cuda_available=False)
            for knobs in (twin.get("cell") or {}, raw)
        )
    except (OSError, UnusableResult, ValueError):
        return False
    if twin["status"] != "ok" or twin["cell"].get("device") != "cpu" or not ran or ran[0] != own[0]:
        return False
    try:
        for name in filter(None, (twin.get("files") or {}).values()):
            shutil.copyfile(os.path.join(twin_dir, name), os.path.join(out_dir, name))
    except OSError:
        return False
    labels = {k: raw[k] for k in LABELS if k in raw}
    note = TWIN_NOTE.format(twin=twin_id)
    write_result(
        out_dir,
        {
            **twin,
            "requested": raw,
            "cell": {**twin["cell"], **labels},
            "adjustments": [*own[1], note],
        },
    )
    return True
