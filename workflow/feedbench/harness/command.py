"""A command cell (knob `command`): the user's own training command, run as it is, measured from
inside its own loop.

The cell's process starts the command in its workdir, with its interpreter and the user's
environment, and feedbench's bootstrap first on its PYTHONPATH (harness/bootstrap: it installs
harness.inloop as the command imports torch). It watches the command (the monitor over the window,
the time limit, SIGTERM, a teardown that never ends) and builds the cell's result from what the
instrument wrote in the cell's folder (command/rank<k>.json): the step table of the script's own
loop, the loaders it saw, what the training loader asked for and what ran. Nothing in the command
imports feedbench, and no line of it changes.

The baseline's first repeat, with `fidelity` on, first runs the command plain (no instrument, not
even the bootstrap) and then instrumented, both to the command's own end: `command.fidelity` says
how close the two runs' times are, that is what the instrument costs the job.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ..core import threads
from ..core.cell import Cell
from ..core.children import end_with_parent
from ..core.command import argv, interpreter
from ..core.cores import cpu_load, ranks_sharing, trainer_cores
from ..core.metrics import epoch_boundaries, summarize, wait_tail
from ..core.result import step_rows, tail
from .distributed import combine_ranks
from .inloop import SPEC_VARIABLE
from .monitor import Monitor
from .profile import found as profile_found
from .stages import summarize_stages
from .stop import grace_s, stop_reason
from .window import WindowFigures

BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = "command"  # the instrument's files, in the cell's folder
# Seconds a command may take to end once its window is measured (its epoch's end, a validation, its
# own teardown) before feedbench ends it; the measurement is kept either way.
TEARDOWN_S = 120.0
# How long a command asked to stop (the time limit, SIGTERM) has to end before it is signalled.
STOP_PATIENCE_S = 10.0
POLL_S = 0.05


class CommandError(Exception):
    """The command could not be measured: one line saying what happened and what to do."""


@dataclass
class Run:
    """One run of the command: how it ended and what its instrument wrote."""

    mode: str
    argv: list[str]
    log: str
    exit_code: int | None = None
    wall_s: float | None = None
    stopped_by: str | None = None  # why feedbench ended it, if it did
    ranks: list[WindowFigures] = field(default_factory=list)  # rank<k>.json, rank 0 first
    seen: list[dict] = field(default_factory=list)  # the loaders of processes that trained none
    preflight: dict | None = None
    monitor: Monitor | None = None

    @property
    def figures(self) -> WindowFigures | None:
        return self.ranks[0] if self.ranks else None

    def last_lines(self, count: int = 3) -> str:
        """The command's last output lines, one line: what it said as it ended."""
        lines = [line.strip() for line in tail(self.log).splitlines() if line.strip()]
        shown = " | ".join(lines[-count:])
        return shown[-400:] if shown else "(no output)"


def command_line(cell: Cell) -> list[str]:
    """The process to start: the interpreter and the command's arguments; for several ranks,
    torchrun's (its ranks on this node: the script sets up DDP itself, as under torchrun)."""
    python = interpreter(cell.python) if cell.python else sys.executable
    if python is None:
        raise CommandError(f"python '{cell.python}' is no executable file nor a name on PATH")
    args = argv(cell.command)
    ranks = cell.gpus_per_node * cell.nodes
    if ranks > 1:
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        return [python, *launch, *args]
    return [python, *args]


def environment(spec: str | None, raw: dict) -> dict:
    """The command's environment: the user's (the harness's own, with the thread variables as the
    workflow was launched: core.threads.restored), its trainer's threads where the cell sets
    torch_threads (OMP_NUM_THREADS, which torch reads as it starts: the plain run gets them too);
    instrumented, the bootstrap first on its path."""
    env = dict(os.environ)
    if raw.get("torch_threads") is not None:
        env["OMP_NUM_THREADS"] = str(raw["torch_threads"])
    if spec is None:
        return env
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOTSTRAP, env.get("PYTHONPATH")) if p)
    env.update({SPEC_VARIABLE: spec, "FEEDBENCH_PACKAGE": PACKAGE})
    return env


def run_once(
    cell: Cell, raw: dict, out_dir: str, mode: str, log: str, patience: float = STOP_PATIENCE_S
) -> Run:
    """The command run once in `mode` (inloop.MODES, or plain: no instrument), watched to its
    end."""
    folder = os.path.abspath(os.path.join(out_dir, FOLDER, mode))  # the command runs elsewhere
    os.makedirs(folder, exist_ok=True)
    for stale in glob.glob(os.path.join(folder, "*")):
        os.remove(stale)
    spec = None
    if mode != "plain":
        spec = os.path.join(folder, "spec.json")
        with open(spec, "w", encoding="utf-8") as f:
            json.dump({"cell": raw, "mode": mode, "out": folder, "stop": folder + "/stop"}, f)
    run = Run(mode, command_line(cell), log)
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(
            run.argv,
            cwd=cell.workdir or None,
            env=environment(spec, raw),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its loader workers and ranks: one group to end
            preexec_fn=end_with_parent,
        )
        try:
            _watch(process, run, cell, folder, patience)
        finally:
            _end_group(process)
    run.wall_s = time.perf_counter() - start
    run.exit_code = process.returncode
    _read(run, folder)
    return run


def _watch(process: subprocess.Popen, run: Run, cell: Cell, folder: str, patience: float) -> None:
    """Until the command ends: the monitor over rank 0's window, a stop asked for (the cell's time
    limit, SIGTERM: the instrument closes its window, then the group is signalled), and a teardown
    longer than TEARDOWN_S after the window."""
    opened, closed = os.path.join(folder, "open-rank0.json"), os.path.join(folder, "rank0.json")
    asked = closed_at = None
    while process.poll() is None:
        now = time.perf_counter()
        if run.monitor is None and os.path.exists(opened):
            run.monitor = _monitor(cell, opened)
        if os.path.exists(closed):
            if run.monitor is not None and run.monitor.is_alive():
                run.monitor.stop()
            closed_at = closed_at or now
            if run.mode in ("train", "replay") and asked is None and now - closed_at > TEARDOWN_S:
                run.stopped_by = f"it did not end within {TEARDOWN_S:g} s of its window"
                asked = now - patience
        if asked is None and stop_reason() is not None:
            run.stopped_by, asked = stop_reason(), now
            open(os.path.join(folder, "stop"), "w").close()
        if asked is not None and now - asked > patience:
            late = now - asked > patience + 3
            _signal(process, signal.SIGKILL if late else signal.SIGTERM)
        time.sleep(POLL_S)
    if run.monitor is not None and run.monitor.is_alive():
        run.monitor.stop()


def _monitor(cell: Cell, opened: str) -> Monitor:
    with open(opened, encoding="utf-8") as f:
        pid = json.load(f)["pid"]
    start = (cell.multiprocessing_context or "fork") if cell.num_workers else None
    monitor = Monitor(cell.monitor_interval_s, None, start_method=start, pid=pid, low_priority=True)
    monitor.start()
    return monitor


def _signal(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _end_group(process: subprocess.Popen) -> None:
    """The command's group ended: a loader worker it left behind never outlives the cell."""
    if process.poll() is None:
        _signal(process, signal.SIGKILL)
        process.wait()
    _signal(process, signal.SIGKILL)


def _read(run: Run, folder: str) -> None:
    def load(path: str) -> dict:
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    ranks = [WindowFigures.read(p) for p in glob.glob(os.path.join(folder, "rank*.json"))]
    run.ranks = sorted(ranks, key=lambda r: r.rank)
    run.seen = [load(p) for p in sorted(glob.glob(os.path.join(folder, "seen-*.json")))]
    path = os.path.join(folder, "preflight.json")
    run.preflight = load(path) if os.path.exists(path) else None


def failure(run: Run, cell: Cell) -> str | None:
    """Why a run measured nothing, in one line; None when it measured its window."""
    figures = run.figures
    code = f"code {run.exit_code}"
    if run.stopped_by and (figures is None or not figures.steps):
        steps = figures.whole.batches if figures else 0
        return (
            f"did not finish its warm-up ({cell.warmup_steps} training steps) before "
            f"it was stopped ({run.stopped_by}): {steps} training batches came; its last lines: "
            f"{run.last_lines()}"
        )
    if figures is None:
        seen = [loader for found in run.seen for loader in found["loaders"]]
        if run.exit_code != 0:
            return (
                f"exited with {code} before its first training step; its last "
                f"lines: {run.last_lines()}"
            )
        if not seen:
            return (
                "no torch DataLoader was iterated: feedbench measures loaders built on "
                "torch.utils.data (the command ran to its end, exit code 0)"
            )
        built = ", ".join(sorted({loader["built_at"] for loader in seen}))
        return (
            f"no backward pass followed a batch of the {len(seen)} loaders the command iterated "
            f"(built at {built}): the training loader is the one whose batches a backward pass "
            "follows"
        )
    if not figures.steps and run.mode != "preflight":
        return (
            f"ended (exit {code}) after {figures.whole.batches} training "
            f"batches, before its warm-up of {cell.warmup_steps} steps and a measured step: give "
            "it more steps (its own arguments) or lower warmup_steps"
        )
    if figures.steps and not sum(figures.samples):
        return (
            "the training batches held no tensor to count samples in: a batch is counted by the "
            "first dimension of its first tensor"
        )
    return None


def fidelity_wanted(cell: Cell) -> bool:
    """The plain run and the instrumented one side by side: the baseline's first repeat of a
    training cell, unless the cell says no."""
    return bool(cell.fidelity and cell.baseline and cell.repeat in (1, None))


def measure(
    cell: Cell, raw: dict, out_dir: str, time_limit: float | None = None
) -> tuple[Run, dict | None]:
    """The cell's run of its command (and, for fidelity, the plain run before it): the instrumented
    run and the fidelity figures; CommandError when it measured nothing. A stop (`time_limit`,
    SIGTERM) gives the command half the time the runner allows a stuck step (stop.grace_s)."""
    patience = min(STOP_PATIENCE_S, grace_s(time_limit) / 2) if time_limit else STOP_PATIENCE_S
    mode = {"train": "train", "loader": "drain", "compute": "replay"}[cell.scenario]
    plain = None
    if mode == "train" and fidelity_wanted(cell):
        log = os.path.join(out_dir, "command-plain.log")
        plain = run_once(cell, raw, out_dir, "plain", log, patience)
        mode = "whole"
    run = run_once(cell, raw, out_dir, mode, os.path.join(out_dir, "command.log"), patience)
    why = failure(run, cell)
    if why is not None:
        raise CommandError(why)
    return run, fidelity(plain, run) if plain is not None else None


def fidelity(plain: Run, instrumented: Run) -> dict:
    """How close the instrumented command stays to the plain one: both run to their own end, so
    their times hold the same work (the training samples the instrumented run counted)."""
    samples = sum(r.whole.samples for r in instrumented.ranks)
    ended = plain.exit_code == 0 and instrumented.stopped_by is None
    return {
        "plain_wall_s": round(plain.wall_s, 3),
        "plain_exit_code": plain.exit_code,
        "instrumented_wall_s": round(instrumented.wall_s, 3),
        "samples": samples,
        "plain_samples_per_s": samples / plain.wall_s if ended and plain.wall_s else None,
        "instrumented_samples_per_s": samples / instrumented.wall_s if ended else None,
        # the instrumented run's time over the plain one's: 1.02 is 2 % slower
        "ratio": instrumented.wall_s / plain.wall_s if ended and plain.wall_s else None,
        "note": None
        if ended
        else f"not compared: the plain run exited with code {plain.exit_code}"
        if plain.exit_code
        else f"not compared: feedbench stopped the instrumented run ({instrumented.stopped_by})",
    }


def metrics_of(figures: WindowFigures) -> tuple[dict, list[dict]]:
    """A rank's metrics and step rows from its instrument's figures, as harness.runner gives a
    cell's."""
    table, samples = figures.table, figures.samples
    n = len(table["step"])
    metrics: dict = {"steps": n}
    if n:
        metrics = summarize(table, figures.window_s, sum(samples), None, figures.h2d_bytes)
    log, skip = figures.stage_log, figures.stage_skip
    stages = summarize_stages(log[skip : skip + n])
    if stages is not None:  # as harness.loop.Measurement.stages gives a cell's
        if figures.stage_order:
            stages["order"] = figures.stage_order
        stages["profile"] = profile_found(log)
        stages.update({key: names for key, names in figures.stage_probe.items() if names})
    metrics.update(
        time_to_first_batch_s=figures.time_to_first_batch_s,
        wait_ms=wait_tail(table["wait"]),
        epoch_boundaries=epoch_boundaries(table["wait"], figures.boundary_steps),
        cuda_init_s=None,
        gc=figures.gc,
        original_estimators=None,
        first_batch_profile=None,
        stages=stages,
        whatif=figures.whatif,
    )
    rows = step_rows(table, samples, [])
    for row, timings in zip(rows, log[skip : skip + n], strict=False):
        row["worker_ms"] = round((sum(timings["sample_s"]) + timings["collate_s"]) * 1000, 6)
    return metrics, rows


def facts(cell: Cell, run: Run, fidelity_figures: dict | None) -> dict:
    """The result's `command`: what ran, how it ended, the loaders it saw and the training one's
    knobs as asked and as run, and the fidelity figures of a baseline's first repeat."""
    figures = run.figures
    optimizer = [ms for ms in figures.optimizer_ms if ms > 0]
    return {
        "argv": run.argv,
        "workdir": cell.workdir,
        "mode": run.mode,
        "exit_code": run.exit_code,
        "wall_s": round(run.wall_s, 3),
        "stopped_by": run.stopped_by,
        "window_closed_by": figures.window.get("closed_by"),
        "loader": figures.loader,
        "loaders": figures.loaders,
        "forward_seen": figures.forward_seen,
        "instrument_ms_per_step": figures.instrument_ms_per_step,
        "optimizer_step_ms": statistics.median(optimizer) if optimizer else None,
        "whole": {
            "batches": sum(r.whole.batches for r in run.ranks),
            "samples": sum(r.whole.samples for r in run.ranks),
        },
        "ranks": len(run.ranks),
        "workers_in_window": figures.window.get("workers"),
        "fidelity": fidelity_figures,
    }


def notes(cell: Cell, run: Run) -> list[str]:
    """What the result's adjustments say of the command's run."""
    figures, found = run.figures, []
    if run.mode == "drain":  # the loader alone: no step to see inside
        return found + figures.notes
    if not figures.forward_seen:
        found.append(
            "no module's forward was seen after a training batch: phase h2d holds the forward, "
            "fwd reads zero (the step is measured whole)"
        )
    if figures.window.get("global_hook"):
        found.append(
            "the window opened before the forward's module was found (warm-up under 2 steps): "
            "its first steps carry a hook on every module"
        )
    if run.stopped_by and figures.steps:
        found.append(f"feedbench ended the command after its window: {run.stopped_by}")
    elif run.exit_code not in (0, None):
        found.append(f"the command exited with code {run.exit_code} after its window was measured")
    if figures.window.get("closed_by") == "exit":
        found.append(
            f"the command ended by itself after {figures.steps} measured steps "
            f"(of {cell.steps} asked): its whole run is measured"
        )
    return found + figures.notes


def record(result: dict, cell: Cell, run: Run, fidelity_figures: dict | None) -> list[dict]:
    """Fill a cell's result (harness.runner's) from the command's run; the step rows for
    steps.csv."""
    figures = run.figures
    metrics, rows = metrics_of(figures)
    if len(run.ranks) > 1:
        ranks = [
            {"rank": f.rank, "node": 0, "metrics": metrics_of(f)[0], "comm": None}
            for f in run.ranks
        ]
        metrics = combine_ranks(metrics, ranks)
    result["metrics"] = metrics
    if figures.software:  # the software that ran the steps: the command's interpreter's
        result["provenance"].update(figures.software, software_of="command")
    result["timing"]["effective"] = figures.timing
    result["torch_threads"] = figures.torch_threads
    result["launch_threads"] = figures.launch_threads
    result["torch_threads_source"] = threads.source(cell.torch_threads, os.environ)
    monitor = run.monitor.summary() if run.monitor is not None else None
    result["monitor"] = monitor
    ran = (figures.loader or {}).get("ran") or {}
    if monitor is not None:
        usable = (result["provenance"].get("cores") or {}).get("usable")
        trainer = trainer_cores(cell.scenario, figures.device.split(":")[0], cell.torch_threads)
        workers = ran.get("num_workers", cell.num_workers)
        result["cpu"] = cpu_load(monitor["workers"], usable, ranks_sharing(cell), workers, trainer)
    result["command"] = facts(cell, run, fidelity_figures)
    result["adjustments"] = result["adjustments"] + notes(cell, run)
    return rows


# The most a command's preflight may take to reach the end of its first training step.
PREFLIGHT_LIMIT_S = 600.0


def preflight(raw: dict, out_dir: str, limit_s: float = PREFLIGHT_LIMIT_S) -> dict:
    """The preflight of a command (harness.preflight): run it to the end of its first training
    step, with the cell's knobs; the training loader it found. CommandError, in one line, for a
    command that fails before (a typo in its own arguments), iterates no DataLoader, trains on none,
    or takes longer than `limit_s`."""
    import torch

    from ..core.cell import parse_cell
    from .fit import resolve
    from .stop import TimeLimit, clear

    cell, _ = resolve(parse_cell({**raw, "scenario": "train"}), torch.cuda.is_available())
    clear()
    limit = TimeLimit(limit_s)
    try:
        run = run_once(cell, raw, out_dir, "preflight", os.path.join(out_dir, "command.log"))
    finally:
        limit.cancel()
    if run.preflight is not None:
        return run.preflight
    print(tail(run.log), file=sys.stderr)  # the command's own output, in the preflight's log
    why = failure(run, cell)
    if why is None or run.stopped_by:
        why = (
            f"did not reach the end of its first training step within {limit_s:g} s "
            f"({run.stopped_by}); its last lines: {run.last_lines()}"
        )
    raise CommandError(why)
