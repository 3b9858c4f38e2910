"""Run one cell end to end: validate, fit to the machine, measure, and always write a result.

Exit codes: 0 measured, 1 the cell failed while running, 2 bad input. A failed
cell still writes result.json (status: failed, the error, and whatever steps
completed), so a matrix never loses a cell silently.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback

import torch

from .cell import cell_dict, parse_cell
from .data import short_batch_note
from .distributed import World, finish, gather, init, rank_device
from .fit import resolve
from .harness import Measurement, cuda_init, first_batches, measure, original_estimators
from .knobs import KnobError, user_batch
from .metrics import summarize
from .monitor import Monitor
from .plugins import folder_facts, plugins_of, resolve_all
from .prefetch import to_device
from .provenance import machine_facts
from .result import failed_result, now, step_rows, tail, write_refusal, write_result, write_rows
from .stop import Terminated, TimeLimit, clear, grace_s, on_sigterm
from .timing import synchronize
from .transfer import batch_probe, probe


def _error(exc: BaseException) -> dict:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {
        "type": type(exc).__name__,
        "message": str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        "traceback": "".join(lines)[-4000:],
    }


def _loop_metrics(m: Measurement, device_readable: bool = True) -> tuple[dict, list[dict]]:
    table = None
    if device_readable:
        try:
            if m.clock is not None:  # a stopped loop leaves events in flight: elapsed_time raises "device not ready"
                synchronize(m.clock.device)
            table = m.step_table(device_readable=True)
        except Exception as error:  # device clocks unreadable after a device error: keep the host-side phases
            why = _error(error)
            m.notes.append(
                f"GPU phases not recorded: the device's clocks could not be read ({why['type']}: {why['message']})"
            )
    if table is None:
        table = m.step_table(device_readable=False)
    n = len(table["step"])
    metrics: dict = {"steps": n}
    if n:
        window_s = sum(table["step"]) / 1000  # first step's start to last step's end
        tokens = sum(m.tokens[:n]) if m.tokens else None
        metrics = summarize(table, window_s, sum(m.samples[:n]), tokens, m.h2d_bytes if m.window_end is not None else 0)
    metrics["time_to_first_batch_s"] = m.time_to_first_batch_s
    metrics["cuda_init_s"] = m.cuda_init_s
    metrics["original_estimators"] = original_estimators(table, m)  # pytorch_throughput's, for the scaling study
    metrics["first_batch_profile"] = m.first_batch_profile  # the CIFAR-100 notebook's window, for the workers study
    return metrics, step_rows(table, m.samples, m.tokens)


def _combine_ranks(own: dict, ranks: list[dict]) -> dict:
    """Rank 0's metrics, plus the job-wide throughput and every rank's summary."""
    metrics = dict(own)
    per_rank = [
        {
            "rank": r["rank"],
            "node": r["node"],
            "samples": r["metrics"].get("samples", 0),
            "window_s": r["metrics"].get("window_s"),
            "samples_per_s": r["metrics"].get("samples_per_s"),
            "step_ms_median": r["metrics"].get("step_ms", {}).get("median"),
            "stall_pct": r["metrics"].get("stall_pct"),
            "phases_median_ms": {k: v["median_ms"] for k, v in r["metrics"].get("phases", {}).items()},
            "comm": r["comm"],
        }
        for r in ranks
    ]
    slowest = max(per_rank, key=lambda r: r["window_s"] or 0)
    window_s = slowest["window_s"]
    metrics.update(
        world_size=len(ranks),
        samples=sum(r["samples"] for r in per_rank),
        samples_per_s=sum(r["samples"] for r in per_rank) / window_s if window_s else None,
        tokens_per_s=sum(r["metrics"]["tokens_per_s"] * r["metrics"]["window_s"] for r in ranks) / window_s
        if window_s and own.get("tokens_per_s") is not None
        else None,
        slowest_rank=slowest["rank"],
        ranks=per_rank,
    )
    comms = [r["comm"]["comm_share"] for r in per_rank if r["comm"] and r["comm"]["comm_share"] is not None]
    if comms:
        metrics["comm_share"] = max(comms)
    return metrics


def record_failure(out_dir: str, raw: dict, exit_code: int, log: str | None) -> None:
    """A result for a harness that died without writing one (SIGKILL, the OOM killer, a crash at import)."""
    signal_name = ""
    if exit_code < 0 or exit_code > 128:
        number = -exit_code if exit_code < 0 else exit_code - 128
        signal_name = f" (signal {signal.Signals(number).name})" if number in signal.Signals._value2member_map_ else ""
    result = failed_result(raw)
    result.update(
        error={
            "type": "Killed" if signal_name else "Crashed",
            "message": f"the harness exited with code {exit_code}{signal_name} without writing a result",
            "traceback": tail(log)[-4000:],
        },
        provenance=machine_facts(torch.device("cpu")),
        started_at=now(),
        finished_at=now(),
    )
    write_result(out_dir, result)


def run(
    raw: dict, out_dir: str, world: World | None = None, time_limit: float | None = None, user: dict | None = None
) -> int:
    """Run the cell in this process (or as one rank of a multi-process cell) and write its result.

    Rank 0 writes result.json; any rank that fails also writes ranks/rank<k>.json
    with its error, for the launcher to name the rank that brought the cell down.
    With a time limit (seconds) the cell stops itself then, as on SIGTERM.
    """
    world = World() if world is None else world
    clear()
    signal.signal(signal.SIGTERM, on_sigterm)
    os.makedirs(out_dir, exist_ok=True)
    started, t0 = now(), time.perf_counter()
    result = failed_result(raw)
    m = Measurement()

    def stuck(reason: str) -> None:
        """Still inside one step grace_s() after the time limit: record what was measured and end the process."""
        try:
            result["metrics"] = _loop_metrics(m, device_readable=False)[0]  # the device may be what is stuck
        except Exception:  # the loop is mid-step: keep the skeleton's metrics
            pass
        result.update(
            status="failed",
            started_at=started,
            finished_at=now(),
            duration_s=time.perf_counter() - t0,
            error={
                "type": "Terminated",
                "message": f"{reason}; still inside one step {grace_s(time_limit):g} s later, so the process was ended",
                "traceback": "",
            },
        )
        write_result(out_dir, result)
        print(f"feedbench: cell failed: {result['error']['message']}", file=sys.stderr, flush=True)
        os._exit(1)

    limit = TimeLimit(time_limit, on_stuck=stuck)
    try:
        cell, notes = resolve(parse_cell(raw), torch.cuda.is_available())
    except KnobError as error:
        limit.cancel()
        any_device = rank_device("cuda" if torch.cuda.is_available() else "cpu", world)
        return write_refusal(out_dir, result, error, machine_facts(any_device), started)
    device = rank_device(cell.device, world)
    result.update(
        cell=cell_dict(cell), adjustments=notes, timing={"requested": cell.timing}, provenance=machine_facts(device)
    )
    if world.rank == 0:
        for note in notes:
            print(f"feedbench: note: {note}", file=sys.stderr)

    if cell.torch_threads:
        torch.set_num_threads(cell.torch_threads)
    result["torch_threads"] = torch.get_num_threads()
    monitor = None
    rows: list[dict] = []
    code = 0
    sigchld = None
    try:
        m.cuda_init_s = cuda_init(device)
        if world.distributed or cell.parallel == "ddp":
            init(world, device)
        if cell.scenario == "transfer":
            rows, summary = probe(cell, device)
            names = plugins_of(cell)
            if user_batch(names):  # the user's batch structure, copied as it is
                user = resolve_all(cell) if user is None else user
                move = user.get("to_device", to_device)
                own_rows, summary["user_batch"], copied = batch_probe(
                    cell, device, first_batches(cell, device, user, world), move, names
                )
                rows = [{"copy": "sweep", **row} for row in rows] + own_rows
                result["adjustments"] = result["adjustments"] + copied
            result["metrics"] = {"transfer": summary, "cuda_init_s": m.cuda_init_s}
            result["timing"]["effective"] = "events" if device.type == "cuda" else "wall"
        else:
            monitor = Monitor(cell.monitor_interval_s, device)
            measure(cell, device, m, out_dir if world.rank == 0 else None, monitor, world, user)
        result["status"] = "ok"
    except KnobError as error:  # found while building the cell (a dataset path, say)
        result["error"] = {"type": "KnobError", "message": str(error)}
        print(f"feedbench: error: {error}", file=sys.stderr)
        code = 2
    except (Exception, Terminated, KeyboardInterrupt) as error:
        # A dead loader worker makes PyTorch's SIGCHLD handler raise at every later
        # SIGCHLD: keep it quiet while the failure is recorded, then put it back.
        sigchld = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        result["error"] = _error(error)
        print(
            f"feedbench: {'rank %d: ' % world.rank if world.distributed else ''}cell failed: "
            f"{result['error']['type']}: {result['error']['message']}",
            file=sys.stderr,
        )
        code = 1
    finally:
        if monitor is not None and monitor.is_alive():
            monitor.stop()
        if cell.scenario != "transfer":
            result["metrics"], rows = _loop_metrics(m)
            result["timing"]["effective"] = m.clock.effective_mode if m.clock else None
            result["monitor"] = monitor.summary() if monitor is not None else None
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
        result.update(started_at=started, finished_at=now(), duration_s=time.perf_counter() - t0)
        if world.distributed:
            result["rank"] = {"rank": world.rank, "node": world.node_rank, "world_size": world.world_size}
            if code:
                write_result(os.path.join(out_dir, "ranks"), result, f"rank{world.rank}.json")
        if code == 0 and world.distributed:
            ranks = gather({"rank": world.rank, "node": world.node_rank, "metrics": result["metrics"], "comm": m.comm})
            result["metrics"] = _combine_ranks(result["metrics"], ranks)
        if world.rank == 0:
            result["files"] = {
                "steps": write_rows(out_dir, rows),
                "trace": "trace.json"
                if cell.profile and result["status"] == "ok" and cell.scenario in ("train", "compute")
                else None,
            }
            write_result(out_dir, result)
        limit.cancel()
        if code == 0:
            finish()
    if sigchld is not None:
        signal.signal(signal.SIGCHLD, sigchld)
    return code
