"""Run one cell end to end: validate, fit to the machine, measure, and always write a result.

Exit codes: 0 measured, 1 the cell failed while running, 2 bad input. A failed
cell still writes result.json (status: failed, the error, and whatever steps
completed), so a matrix never loses a cell silently.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
import traceback

import torch

from .cell import cell_dict, parse_cell, resolve
from .harness import Measurement, cuda_init, measure
from .knobs import KnobError
from .metrics import summarize
from .monitor import Monitor
from .provenance import provenance
from .result import SCHEMA_VERSION, step_rows, write_result, write_rows
from .transfer import probe


class Terminated(Exception):
    """SIGTERM arrived (a scheduler's time limit or cancel)."""


def _on_sigterm(signum, frame):
    raise Terminated("terminated by SIGTERM (time limit reached or job cancelled)")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _error(exc: BaseException) -> dict:
    tail = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {"type": type(exc).__name__, "message": str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, "traceback": "".join(tail)[-4000:]}


def _loop_metrics(cell, m: Measurement) -> tuple[dict, list[dict]]:
    try:
        table = m.step_table(device_readable=True)
    except Exception:  # device clocks unreadable after a device error: keep the host-side phases
        table = m.step_table(device_readable=False)
    n = len(table["step"])
    metrics: dict = {"steps": n}
    if n:
        window_s = sum(table["step"]) / 1000  # first step's start to last step's end
        tokens = sum(m.tokens[:n]) if m.tokens else None
        metrics = summarize(table, window_s, sum(m.samples[:n]), tokens, m.h2d_bytes if m.window_end is not None else 0)
    metrics["time_to_first_batch_s"] = m.time_to_first_batch_s
    metrics["cuda_init_s"] = m.cuda_init_s
    return metrics, step_rows(table, m.samples, m.tokens)


def run(raw: dict, out_dir: str) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    os.makedirs(out_dir, exist_ok=True)
    started, t0 = _now(), time.perf_counter()
    result: dict = {"schema_version": SCHEMA_VERSION, "status": "failed", "requested": raw, "cell": None, "adjustments": [], "error": None}
    try:
        cell, notes = resolve(parse_cell(raw), torch.cuda.is_available())
    except KnobError as error:
        any_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        result.update(error={"type": "KnobError", "message": str(error)}, provenance=provenance(any_device), started_at=started, finished_at=_now())
        write_result(out_dir, result)
        print(f"feedbench: error: {error}", file=sys.stderr)
        return 2
    device = torch.device(cell.device)
    result.update(cell=cell_dict(cell), adjustments=notes, timing={"requested": cell.timing}, provenance=provenance(device))
    for note in notes:
        print(f"feedbench: note: {note}", file=sys.stderr)

    m = Measurement()
    monitor = None
    rows: list[dict] = []
    code = 0
    try:
        m.cuda_init_s = cuda_init(device)
        if cell.scenario == "transfer":
            rows, summary = probe(cell, device)
            result["metrics"] = {"transfer": summary, "cuda_init_s": m.cuda_init_s}
            result["timing"]["effective"] = "events" if device.type == "cuda" else "wall"
        else:
            monitor = Monitor(cell.monitor_interval_s, device)
            measure(cell, device, m, out_dir, monitor)
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
        print(f"feedbench: cell failed: {result['error']['type']}: {result['error']['message']}", file=sys.stderr)
        code = 1
    finally:
        if monitor is not None and monitor.is_alive():
            monitor.stop()
        if cell.scenario != "transfer":
            result["metrics"], rows = _loop_metrics(cell, m)
            result["timing"]["effective"] = m.clock.effective_mode if m.clock else None
            result["monitor"] = monitor.summary() if monitor is not None else None
        result["files"] = {"steps": write_rows(out_dir, rows), "trace": "trace.json" if cell.profile and result["status"] == "ok" and cell.scenario in ("train", "compute") else None}
        result.update(started_at=started, finished_at=_now(), duration_s=time.perf_counter() - t0)
        write_result(out_dir, result)
    if code == 1:
        signal.signal(signal.SIGCHLD, sigchld)
    return code
