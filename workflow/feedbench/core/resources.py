"""What a cell asks of a machine or a Slurm allocation: one home for its resources.

The bench rule's resources (threads, memory, GPUs, Slurm tasks) and the
launcher's srun line are pure functions of the cell's knobs, here. A cell is a
mapping of knobs (missing ones take the harness's defaults, as in the
workflow's planned cells) or the harness's parsed Cell. No torch: the
Snakefile imports this module on every parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .knobs import KNOBS


def knob(cell: Mapping[str, Any] | Any, name: str) -> Any:
    """A knob of the cell, or the harness's default when a mapping leaves it out."""
    if isinstance(cell, Mapping):
        return cell[name] if name in cell else KNOBS[name].default
    return getattr(cell, name)


def ranks(cell) -> int:
    """Processes of the cell: one per GPU for ddp and independent, one for dp and none."""
    if knob(cell, "parallel") in ("ddp", "independent"):
        return knob(cell, "nodes") * knob(cell, "gpus_per_node")
    return 1


def nodes(cell) -> int:
    return knob(cell, "nodes")


def cpus_per_rank(cell) -> int:
    """A rank and its loader workers."""
    return knob(cell, "num_workers") + 1


def threads(cell) -> int:
    """CPUs per node: every rank on it (gpus_per_node) plus their loader workers."""
    return cpus_per_rank(cell) * knob(cell, "gpus_per_node")


def mem_mb(cell, threads_given: int | None = None) -> int:
    """Per node: 2 GiB per rank, 1 GiB per loader worker (of the threads given, when Snakemake
    capped them)."""
    per_node = knob(cell, "gpus_per_node")
    cpus = threads(cell) if threads_given is None else threads_given
    return 2048 * per_node + 1024 * max(cpus - per_node, 0)


def cpus_per_task(cell) -> int | None:
    """Slurm's --cpus-per-task of a multi-process cell: a rank and its loader workers.

    None (unset) for a one-process cell: the Slurm plugin then asks for the job's threads, the whole
    cell. So every one-process cell has the same value, a constant of the bench rule instead of a
    function of each job.
    """
    return cpus_per_rank(cell) if ranks(cell) > 1 else None


def uses_gpus(cell) -> bool:
    """Whether the cell may run on GPUs (device cuda or auto)."""
    return knob(cell, "device") in ("cuda", "auto")


def gpus(cell) -> int:
    """GPUs of the whole job when the cell may use them, else 0: Slurm's --gpus."""
    return knob(cell, "gpus_per_node") * nodes(cell) if uses_gpus(cell) else 0


def tasks(cell) -> int:
    """Slurm tasks of the whole job when one per node (or one in all) says it; else 0 (unset).

    Several ranks per node go through tasks_per_node instead, so that Slurm
    cannot pack 3 of 4 ranks on one node: the plugin takes one or the other.
    """
    n = ranks(cell)
    return n if knob(cell, "gpus_per_node") == 1 or n == 1 else 0


def tasks_per_node(cell) -> int:
    return knob(cell, "gpus_per_node") if not tasks(cell) else 0


# Always 0 (unset), a constant of the bench rule: the ranks are placed by --ntasks or
# --ntasks-per-node and srun's --gpus-per-task. Slurm refuses --ntasks-per-gpu beside
# --ntasks-per-node (a 2-GPU x 2-node ddp cell), and the plugin turns `tasks` into --ntasks-per-gpu
# unless this is set: 0 keeps it out for every cell.
TASKS_PER_GPU = 0


def mpi(cell) -> str:
    """'srun' for multi-process cells: the job's shell runs once and the launcher starts the ranks
    with srun."""
    return "srun" if ranks(cell) > 1 else ""


def srun_options(cell, cuda: bool) -> list[str]:
    """The launcher's srun options inside the job: one task per rank, gpus_per_node tasks on each
    node."""
    options = [
        f"--nodes={nodes(cell)}",
        f"--ntasks={ranks(cell)}",
        f"--ntasks-per-node={knob(cell, 'gpus_per_node')}",
        f"--cpus-per-task={cpus_per_rank(cell)}",
        "--kill-on-bad-exit=1",
    ]
    return options + (["--gpus-per-task=1"] if cuda else [])


def node_fit_error(cell, node_cpus: int, partition: str) -> str | None:
    """Why the cell cannot run on nodes of node_cpus CPUs, or None when it fits.

    A cell is refused rather than given fewer CPUs: loader workers sharing
    fewer cores than asked would measure another input pipeline.
    """
    need = threads(cell)
    if need <= node_cpus:
        return None
    per_node = knob(cell, "gpus_per_node")
    return (
        f"asks for {need} CPUs per node ({per_node} rank(s) x (num_workers "
        f"{knob(cell, 'num_workers')} + 1)); allowed: at most {node_cpus}, the CPUs of a node in "
        f"Slurm partition '{partition}' (sinfo)"
    )
