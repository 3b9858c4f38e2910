"""Run one cell end to end: validate, fit to the machine, measure, and always write a result.

Exit codes: 0 measured, 1 the cell failed while running, 2 bad input. A failed
cell still writes result.json (status: failed, the error, and whatever steps
completed), so a matrix never loses a cell silently.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch

from ..core import shm, threads
from ..core.cell import Cell, cell_dict, parse_cell
from ..core.cores import cpu_load, ranks_sharing, trainer_cores
from ..core.knobs import KnobError, user_batch
from ..core.metrics import epoch_boundaries, summarize, wait_tail
from ..core.plugins import folder_facts, plugins_of, resolve_all
from ..core.result import (
    failed_result,
    now,
    step_rows,
    tail,
    write_refusal,
    write_result,
    write_rows,
)
from . import command
from .data import decoder_facts, short_batch_note
from .distributed import World, combine_ranks, finish, gather, init, rank_device
from .fit import resolve
from .launch import in_slurm_job
from .loop import Measurement, cuda_init, first_batches, measure, original_estimators
from .monitor import Monitor
from .prefetch import to_device
from .provenance import machine_facts
from .stop import Terminated, TimeLimit, clear, grace_s, on_sigterm, stop_reason
from .timing import synchronize
from .transfer import batch_probe, probe

# How PyTorch raises a loader worker's exception again in the main process: the type, the worker,
# then the worker's traceback as text (torch._utils.ExceptionWrapper).
WORKER_ERROR = re.compile(r"Caught (\w+) (in DataLoader worker process \d+)\.\nOriginal Traceback")


# Where the main process receives a batch's shared memory from a loader worker (its file descriptor,
# over a connection to the worker's resource sharer): a worker that dies there closes that
# connection mid-hand-over, and the main process sees a bare EOFError or ConnectionResetError before
# the DataLoader notices the death.
HAND_OVER = ("multiprocessing/resource_sharer.py", "torch/multiprocessing/reductions.py")

# The intra-op threads PyTorch chose for this process from its environment (its default, or
# OMP_NUM_THREADS), read before any cell sets its own: a cell without the knob `torch_threads` gets
# these back, whatever ran before it here.
LAUNCH_THREADS = torch.get_num_threads()


def error_record(exc: BaseException) -> dict:
    """The result's `error` of an exception: its type, one line of message (a loader worker's own:
    worker_message) and the end of its traceback; the preflight records a failure the same way."""
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    text = str(exc).strip()
    message = worker_message(text) or (text.splitlines()[0] if text else type(exc).__name__)
    if isinstance(exc, (EOFError, ConnectionError)) and any(path in trace for path in HAND_OVER):
        detail = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
        message = f"a loader worker died while handing over a batch ({detail})"
    return {"type": type(exc).__name__, "message": message, "traceback": trace[-4000:]}


def worker_message(text: str) -> str | None:
    """A loader worker's error in one line, as the worker raised it: its message (a transform names
    itself there, feedbench.harness.stages.transform_error), then which worker; None for an error
    that did not come from one.

    The worker's traceback ends with the last exception raised: after the last `Traceback` line come
    its frames (indented), then `Type: message`."""
    found = WORKER_ERROR.match(text)
    if not found:
        return None
    lines = text.splitlines()
    start = max(
        i for i, line in enumerate(lines) if line.endswith("Traceback (most recent call last):")
    )
    last = next((line for line in lines[start + 1 :] if line and not line[0].isspace()), "")
    kind, _, message = last.partition(": ")
    if not message or kind.rsplit(".", 1)[-1] != found.group(1):
        message = last or found.group(1)
    return f"{message} ({found.group(2)})"


def _device_reads(m: Measurement) -> tuple[dict, dict | None] | None:
    """The guarded read of every device clock of a cell: the step table's CUDA events (phases, idle,
    side-stream copies) and the device stages' (whatif). None, and one note, when the device cannot
    be read (a CUDA error): the caller then keeps the host-side figures, and result.json is still
    written."""
    try:
        # a stopped loop leaves events in flight: elapsed_time raises "device not ready"
        if m.clock is not None:
            synchronize(m.clock.device)
        return m.step_table(device_readable=True), m.whatif_facts()
    # device clocks unreadable after a device error: keep the host-side phases
    except Exception as error:
        why = error_record(error)
        m.notes.append(
            f"GPU phases not recorded: the device's clocks could not be read ({why['type']}: "
            f"{why['message']})"
        )
        return None


def _loop_metrics(m: Measurement, device_readable: bool = True) -> tuple[dict, list[dict]]:
    read = _device_reads(m) if device_readable else None
    table, whatif = (
        read if read is not None else (m.step_table(device_readable=False), m.whatif_facts(False))
    )
    n = len(table["step"])
    metrics: dict = {"steps": n}
    if n:
        window_s = sum(table["step"]) / 1000  # first step's start to last step's end
        tokens = sum(m.tokens[:n]) if m.tokens else None
        metrics = summarize(
            table,
            window_s,
            sum(m.samples[:n]),
            tokens,
            *(m.copies() if m.window_end is not None else (0, 0)),
        )
    metrics["time_to_first_batch_s"] = m.time_to_first_batch_s
    # the data wait's tail over the measured steps
    metrics["wait_ms"] = wait_tail(table["wait"][:n])
    metrics["epoch_boundaries"] = epoch_boundaries(table["wait"][:n], m.boundary_steps)
    metrics["cuda_init_s"] = m.cuda_init_s
    # in the window
    metrics["gc"] = (
        m.collector.summary() if m.collector is not None and m.collector.opened else None
    )
    # pytorch_throughput's, for the scaling study
    metrics["original_estimators"] = original_estimators(table, m)
    # the CIFAR-100 notebook's window, for the workers study
    metrics["first_batch_profile"] = m.first_batch_profile
    # what each sample's stages cost inside the loader (harness.stages)
    metrics["stages"] = m.stages()
    metrics["whatif"] = whatif  # what the cell's stage what-if did and traded (harness.whatif)
    rows = step_rows(table, m.samples, m.tokens)
    # how long a worker took to make the step's batch
    for row, timings in zip(rows, m.stage_batches(), strict=False):
        row["worker_ms"] = round((sum(timings["sample_s"]) + timings["collate_s"]) * 1000, 6)
    return metrics, rows


def record_failure(out_dir: str, raw: dict, exit_code: int, log: str | None) -> None:
    """A result for a harness that died without writing one (SIGKILL, the OOM killer, a crash at
    import)."""
    signal_name = ""
    if exit_code < 0 or exit_code > 128:
        number = -exit_code if exit_code < 0 else exit_code - 128
        signal_name = (
            f" (signal {signal.Signals(number).name})"
            if number in signal.Signals._value2member_map_
            else ""
        )
    result = failed_result(raw)
    result.update(
        error={
            "type": "Killed" if signal_name else "Crashed",
            "message": f"the harness exited with code {exit_code}{signal_name} without "
            "writing a result",
            "traceback": tail(log)[-4000:],
        },
        provenance=machine_facts(torch.device("cpu")),
        started_at=now(),
        finished_at=now(),
    )
    write_result(out_dir, result)


@dataclass
class CellRun:
    """One cell's run in this process: what its steps have found so far, for the result written
    whatever happens."""

    out_dir: str
    world: World
    time_limit: float | None
    started: str
    t0: float
    result: dict
    m: Measurement = field(default_factory=Measurement)
    monitor: Monitor | None = None
    rows: list[dict] = field(default_factory=list)

    def stamp(self) -> None:
        self.result.update(
            started_at=self.started, finished_at=now(), duration_s=time.perf_counter() - self.t0
        )

    def stuck(self, reason: str) -> None:
        """Still inside one step grace_s() after the time limit: record what was measured and end
        the process."""
        try:
            # the device may be what is stuck
            self.result["metrics"] = _loop_metrics(self.m, device_readable=False)[0]
        except Exception:  # the loop is mid-step: keep the skeleton's metrics
            pass
        message = (
            f"{reason}; still inside one step {grace_s(self.time_limit):g} s later, so "
            "the process was ended"
        )
        self.result["status"] = "failed"
        self.stamp()
        self.result["error"] = {"type": "Terminated", "message": message, "traceback": ""}
        write_result(self.out_dir, self.result)
        print(
            f"feedbench: cell failed: {self.result['error']['message']}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)


def run(
    raw: dict,
    out_dir: str,
    world: World | None = None,
    time_limit: float | None = None,
    user: dict | None = None,
    fitted: tuple[Cell, list[str]] | None = None,
) -> int:
    """Run the cell in this process (or as one rank of a multi-process cell) and write its result.

    Rank 0 writes result.json; any rank that fails also writes ranks/rank<k>.json
    with its error, for the launcher to name the rank that brought the cell down.
    With a time limit (seconds) the cell stops itself then, as on SIGTERM. `fitted`: the cell
    already parsed and fitted to this machine (harness.fit.resolve), as the CLI has it.
    """
    world = World() if world is None else world
    clear()
    signal.signal(signal.SIGTERM, on_sigterm)
    os.makedirs(out_dir, exist_ok=True)
    r = CellRun(
        out_dir, world, time_limit, started=now(), t0=time.perf_counter(), result=failed_result(raw)
    )
    limit = TimeLimit(time_limit, on_stuck=r.stuck)
    try:
        cell, notes = fitted or resolve(parse_cell(raw), torch.cuda.is_available())
    except KnobError as error:
        limit.cancel()
        return _refuse(r, error)
    device = rank_device(cell.device, world)
    _describe(r, cell, notes, device)
    _set_threads(r, cell)
    code, sigchld = 0, None
    try:
        if cell.command:
            _run_command(r, cell, raw)
        else:
            _run_scenario(r, cell, device, user)
        r.result["status"] = "ok"
    except KnobError as error:  # found while building the cell (a dataset path, say)
        code = _bad_input(r, error)
    except (Exception, Terminated, KeyboardInterrupt) as error:
        # A dead loader worker makes PyTorch's SIGCHLD handler raise at every later
        # SIGCHLD: keep it quiet while the failure is recorded, then put it back.
        sigchld = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        code = _failed(r, error)
    finally:
        _stop_monitor(r)
        if cell.scenario != "transfer" and not cell.command:
            _record_loop(r, cell)
        r.stamp()
        _share_with_ranks(r, code)
        if world.rank == 0:
            _write(r, cell)
        limit.cancel()
        if code == 0:
            finish()
    if sigchld is not None:
        signal.signal(signal.SIGCHLD, sigchld)
    return code


def _refuse(r: CellRun, error: KnobError) -> int:
    """A cell this machine cannot run as asked (bad knobs, a GPU it lacks): the refusal, exit code
    2."""
    any_device = rank_device("cuda" if torch.cuda.is_available() else "cpu", r.world)
    return write_refusal(r.out_dir, r.result, error, machine_facts(any_device), r.started)


def _describe(r: CellRun, cell: Cell, notes: list[str], device: torch.device) -> None:
    """What the result says before anything runs: the fitted cell, its adjustments, the machine."""
    r.result.update(
        cell=cell_dict(cell),
        adjustments=notes,
        timing={"requested": cell.timing},
        provenance=machine_facts(device),
    )
    # what the loader will keep in shared memory, and the room there as it starts
    if cell.scenario != "transfer":
        # the pin thread's copies: page-locked, not in /dev/shm
        pinned = cell.pin_memory and device.type == "cuda"
        r.result["shm"] = shm.facts(cell_dict(cell), local=not in_slurm_job(), pinned=pinned)
    decoder = decoder_facts(cell)
    if decoder:
        r.result["decoder"] = decoder
    if r.world.rank == 0:
        for note in notes:
            print(f"feedbench: note: {note}", file=sys.stderr)


def _set_threads(r: CellRun, cell: Cell) -> None:
    """The trainer's threads as the user's launch gives them, or the knob's (core.threads), and
    why."""
    torch.set_num_threads(cell.torch_threads or LAUNCH_THREADS)
    r.result["torch_threads"] = torch.get_num_threads()
    r.result["torch_threads_source"] = threads.source(cell.torch_threads, os.environ)
    # what the same launch of an unmodified script gets: the report's note
    r.result["launch_threads"] = LAUNCH_THREADS
    # Process-wide, and inherited by forked workers: set for every cell, so one cell's strategy
    # never leaks into the next one run by the same process.
    torch.multiprocessing.set_sharing_strategy(cell.sharing_strategy)


def _run_scenario(r: CellRun, cell: Cell, device: torch.device, user: dict | None) -> None:
    """The CUDA context and the process group first (timed apart), then the probe or the measured
    loop."""
    r.m.cuda_init_s = cuda_init(device)
    if r.world.distributed or cell.parallel == "ddp":
        init(r.world, device)
    if cell.scenario == "transfer":
        _probe_transfer(r, cell, device, user)
    else:
        started = (
            (cell.multiprocessing_context or multiprocessing.get_start_method())
            if cell.num_workers
            else None
        )
        # The monitor reads the measurement, not the run: a closure over `r` made a cycle (r ->
        # monitor -> r) that kept the run's CUDA events for the cyclic collector, which could then
        # run in a later cell's forked loader worker and abort it (CUDA cannot be used after fork:
        # seen on an H200).
        r.monitor = Monitor(cell.monitor_interval_s, device, lambda m=r.m: m.delivered, started)
        measure(
            cell, device, r.m, r.out_dir if r.world.rank == 0 else None, r.monitor, r.world, user
        )


def _run_command(r: CellRun, cell: Cell, raw: dict) -> None:
    """The user's own command, measured in its own loop (harness.command); the steps it measured
    kept when a stop (the time limit, SIGTERM) ended it."""
    run, fidelity = command.measure(cell, raw, r.out_dir, r.time_limit)
    r.rows = command.record(r.result, cell, run, fidelity)
    if stop_reason() is not None:
        raise Terminated(stop_reason())


def _probe_transfer(r: CellRun, cell: Cell, device: torch.device, user: dict | None) -> None:
    """The copy sweep, then the user's own batch structure copied as it is, if the cell names user
    code for it."""
    r.rows, summary = probe(cell, device)
    names = plugins_of(cell)
    if user_batch(names):
        user = resolve_all(cell) if user is None else user
        move = user.get("to_device", to_device)
        own_rows, summary["user_batch"], copied = batch_probe(
            cell, device, first_batches(cell, device, user, r.world), move, names
        )
        r.rows = [{"copy": "sweep", **row} for row in r.rows] + own_rows
        r.result["adjustments"] = r.result["adjustments"] + copied
    r.result["metrics"] = {"transfer": summary, "cuda_init_s": r.m.cuda_init_s}
    r.result["timing"]["effective"] = "events" if device.type == "cuda" else "wall"


def _bad_input(r: CellRun, error: KnobError) -> int:
    r.result["error"] = {"type": "KnobError", "message": str(error)}
    print(f"feedbench: error: {error}", file=sys.stderr)
    return 2


def _failed(r: CellRun, error: BaseException) -> int:
    r.result["error"] = error_record(error)
    # a bus error in a worker: name the cause, not the first line of a traceback
    out_of_shm = shm.failure(str(error))
    if out_of_shm:
        r.result["error"]["message"] = out_of_shm
    print(
        f"feedbench: {'rank %d: ' % r.world.rank if r.world.distributed else ''}cell failed: "
        f"{r.result['error']['type']}: {r.result['error']['message']}",
        file=sys.stderr,
    )
    return 1


def _stop_monitor(r: CellRun) -> None:
    if r.monitor is not None and r.monitor.is_alive():
        r.monitor.stop()


def _record_loop(r: CellRun, cell: Cell) -> None:
    """What the loop measured, complete or cut short: metrics, step rows, the monitor's samples and
    the loop's notes."""
    result, m = r.result, r.m
    result["metrics"], r.rows = _loop_metrics(m)
    result["timing"]["effective"] = m.clock.effective_mode if m.clock else None
    result["monitor"] = r.monitor.summary() if r.monitor is not None else None
    if result["monitor"] is not None:
        usable = (result["provenance"].get("cores") or {}).get("usable")
        trainer = trainer_cores(cell.scenario, cell.device, result["torch_threads"])
        result["cpu"] = cpu_load(
            result["monitor"]["workers"], usable, ranks_sharing(cell), cell.num_workers, trainer
        )
    if m.pinned_held is not None and "shm" in result:  # the pool measured beside the count
        result["shm"]["pinned_held_bytes"] = m.pinned_held
    result["page_cache"] = m.page_cache
    if m.page_cache and m.page_cache["note"]:
        result["adjustments"] = result["adjustments"] + [m.page_cache["note"]]
    short = short_batch_note(cell, m.samples)
    if short:
        result["adjustments"] = result["adjustments"] + [short]
    if m.comm:
        result["metrics"]["comm"] = m.comm
    result["adjustments"] = result["adjustments"] + m.notes
    if cell.python_path:
        result["provenance"]["user_code"] = [folder_facts(path) for path in cell.python_path]


def _share_with_ranks(r: CellRun, code: int) -> None:
    """A failed rank leaves its own report; after a clean run rank 0 gathers every rank's
    metrics."""
    world, result = r.world, r.result
    if world.distributed:
        result["rank"] = {
            "rank": world.rank,
            "node": world.node_rank,
            "world_size": world.world_size,
        }
        if code:
            write_result(os.path.join(r.out_dir, "ranks"), result, f"rank{world.rank}.json")
    if code == 0 and world.distributed:
        mine = {
            "rank": world.rank,
            "node": world.node_rank,
            "metrics": result["metrics"],
            "comm": r.m.comm,
        }
        ranks = gather({**mine, "torch_threads": result.get("torch_threads")})
        result["metrics"] = combine_ranks(result["metrics"], ranks)


def _write(r: CellRun, cell: Cell) -> None:
    """Rank 0's files: the step rows, the trace's name if one was written, and result.json last."""
    r.result["files"] = {
        "steps": write_rows(r.out_dir, r.rows),
        "trace": "trace.json"
        if cell.profile and r.result["status"] == "ok" and cell.scenario in ("train", "compute")
        else None,
    }
    write_result(r.out_dir, r.result)
