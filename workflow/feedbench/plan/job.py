"""One bench job: `python -m feedbench job --cell JSON --runtime MINUTES [DIR] [--log LOG]` (the
bench rule's command).

DIR and LOG default to the cell's folder and log as rule bench names them (CELL_DIR and CELL_LOG,
from the labels `experiment`, `cell` and `repeat` of the cell's JSON).

Writes the cell's knobs to DIR/cell.yaml, runs the harness on it in a
subprocess (so that a harness killed by SIGKILL or the OOM killer still gets a
result) and, when the harness left no result.json, writes a failed one
(record-failure). Either way the job succeeds, so the matrix goes on and the
report lists the failure.

The cell stops itself before the job's end (docs/reliability-slurm.md): a job
killed by Slurm at its limit loses its result. Inside a Slurm job the end is
the job's own (squeue's time left, so the seconds Slurm and Snakemake spent
starting the job are counted); elsewhere it is the rule's runtime from now.
No torch here: the harness imports it in its own process.

A cancelled job (scancel, preemption, the time limit) leaves no process behind
(docs/reliability-slurm.md, "No orphans"): SIGTERM is passed on to the harness, which records what
it measured, and this process ends once the harness has, within MIN_MARGIN_S, else after killing it.
The harness ends with this process too (PR_SET_PDEATHSIG), and PyTorch's loader workers with the
harness (they watch their parent). On clusters that track a job's processes by their parents
(ProctrackType=proctrack/linuxproc) a process whose parent has died escapes Slurm's SIGKILL, so each
one waits for its children rather than leaving them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from ..core.attempts import ATTEMPTS, keep_earlier, numbers
from ..core.children import end_with_parent
from ..core.result import CELL_DIR, CELL_LOG
from .twins import TWIN_LABEL, took_twins_result

# The variable the shell rules' commands run Python from ("$FEEDBENCH_PYTHON" -m feedbench ...): the
# Snakefile sets it to job_python(), and every job inherits it, on a Slurm node too, where the job
# runs the Snakefile again. An environment variable, not a param: a param would rerun every cell
# when the venv moves, and `snakemake --lint` refuses a global in a shell command.
PYTHON_VARIABLE = "FEEDBENCH_PYTHON"


def job_python(deployment_methods) -> str:
    """The Python that the shell rules' jobs run `-m feedbench` with: the one running this Snakefile
    (sys.executable: the venv `make setup` made, or, in a Slurm job, the one the executor plugin
    starts Snakemake with there), never the first `python` on PATH, which may be another that lacks
    torch. Under `--software-deployment-method conda` (or apptainer), the rule's environment's own
    `python`: the host's path means nothing there. `deployment_methods`: Snakemake's
    workflow.deployment_settings.deployment_method (a set of enum members)."""
    if any(method.name in ("CONDA", "APPTAINER") for method in deployment_methods):
        return "python"
    return sys.executable


def result_path(experiment: str, cell: str, repeat: int) -> str:
    """A bench job's result.json, in its folder (CELL_DIR)."""
    return f"{CELL_DIR.format(experiment=experiment, cell=cell, repeat=repeat)}/result.json"


def attempt(result_path: str, retry_failed: bool) -> str:
    """Which attempt at a cell and repeat a run makes (rule bench's params carry it): the retry of
    failed cells.

    A measured result keeps the attempt it ran as, so its params are unchanged and Snakemake leaves
    it alone; a failed one asks for a new attempt, named after the failure, so the params trigger
    reruns of exactly the failed cells. A damaged result (unreadable, not a mapping, or refused by
    the result schema: core.result.read_result) counts as failed, its retry named after its bytes. A
    dry run sees the same: nothing is moved or deleted.

    Once the run's start has moved the failed result to the cell's attempts/ (core.attempts), the
    newest kept attempt's result stands for it: Snakemake evaluates the params again as the job
    starts, and the job must carry the attempt the run planned.
    """
    # jsonschema: loaded when a result exists
    from ..core.result import UnusableResult, knobs_of, read_result

    if not os.path.exists(result_path):
        folder = os.path.dirname(result_path)
        kept = numbers(folder)
        result_path = (
            os.path.join(folder, ATTEMPTS, str(kept[-1]), "result.json") if kept else result_path
        )
    if not os.path.exists(result_path):
        return "first"
    try:
        result = read_result(result_path)
    except UnusableResult as damage:
        return f"retry-after-damaged-{damage.tag}" if retry_failed else "first"
    if result["status"] == "ok" or not retry_failed:
        return knobs_of(result).get("attempt", "first")
    return f"retry-after-{result['finished_at']}"


def cell_paths(cell_json: str) -> tuple[str, str]:
    """The folder and log of the job of a cell (its knobs as JSON, with the workflow's labels);
    ValueError in one line when the JSON is not a mapping with them."""
    try:
        labels = json.loads(cell_json)
        return CELL_DIR.format(**labels), CELL_LOG.format(**labels)
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(
            f"--cell names no folder ({type(error).__name__}: {error}); allowed: a JSON mapping "
            "with the labels experiment, cell and repeat, or DIR and --log given"
        ) from None


# writing the result and ending the job, after a stuck step's grace period (at most 20 s)
MIN_MARGIN_S = 30


def margin_s(runtime_s: float, left_s: float) -> float:
    """Seconds kept between the cell's stop and the job's end: a tenth of the job's runtime, at
    least MIN_MARGIN_S, at most a quarter of the time left (a 1-minute Slurm job that took 20 s to
    start still measures for a while)."""
    return min(max(runtime_s / 10, MIN_MARGIN_S), left_s / 4)


def parse_time_left(text: str) -> float | None:
    """Seconds in squeue's %L ([days-][hours:]minutes:seconds), or None (UNLIMITED, NOT_SET,
    anything else)."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def slurm_time_left(job_id: str) -> float | None:
    """Seconds left to Slurm job job_id, or None when squeue cannot say."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%L"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_time_left(out.stdout) if out.returncode == 0 else None


def stop_at(runtime_min: float, now: float, environ=os.environ) -> float:
    """Unix time at which the cell stops itself: the job's end less margin_s()."""
    runtime_s = runtime_min * 60
    left = slurm_time_left(environ["SLURM_JOB_ID"]) if environ.get("SLURM_JOB_ID") else None
    left = runtime_s if left is None else left
    return now + left - margin_s(runtime_s, left)


class _Terminated(Exception):
    """This job process got SIGTERM."""


def _raise_terminated(signum, frame):
    raise _Terminated


def _end(harness: subprocess.Popen) -> None:
    """Once the harness has been told to stop, it has MIN_MARGIN_S to record what it measured and
    end, then it is killed: a stuck step never keeps the job's processes alive."""
    try:
        harness.wait(timeout=MIN_MARGIN_S)
    except subprocess.TimeoutExpired:
        harness.kill()
        harness.wait()


def run_job(
    out_dir: str, cell_json: str, runtime_min: float, log: str, env: dict | None = None
) -> int:
    """The job's steps; 0 whenever a result.json is there at the end (the cell's own, or
    record-failure's). `env`: the harness's environment (core.threads.restored: the user's thread
    variables, not Snakemake's), else this one."""
    now = time.time()
    # An earlier attempt still here (a lost cell's record, steps of a failed one) moves to attempts/
    # before this one writes; the run's onstart moved what Snakemake deletes before the job starts
    # (core.attempts).
    keep_earlier(out_dir, log)
    os.makedirs(out_dir, exist_ok=True)
    try:
        raw = json.loads(cell_json)
    except ValueError:
        raw = None
    twin = raw.pop(TWIN_LABEL, None) if isinstance(raw, dict) else None
    cell = os.path.join(out_dir, "cell.yaml")
    # JSON is YAML too; the harness reads it back as JSON
    with open(cell, "w", encoding="utf-8") as f:
        f.write((json.dumps(raw, sort_keys=True, ensure_ascii=False) if twin else cell_json) + "\n")
    if twin and took_twins_result(out_dir, raw, twin):
        os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
        with open(log, "w", encoding="utf-8") as out:
            out.write(f"not run: cell {twin} runs alike here, on the CPU; its result taken\n")
        _finished(out_dir)
        return 0
    command = [
        sys.executable,
        "-m",
        "feedbench",
        "run",
        cell,
        "--out",
        out_dir,
        "--stop-at",
        f"{stop_at(runtime_min, now):.0f}",
    ]
    # Snakemake makes it; a job run by hand may not
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    with open(log, "w", encoding="utf-8") as out:
        harness = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=end_with_parent
        )
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            code = harness.wait()
        # the job is being ended: what the harness records is the cell's (the run reads it as lost)
        except _Terminated:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            harness.terminate()
            _end(harness)
            return 128 + signal.SIGTERM
        # Ctrl-C reached the harness too: let it record what it measured, then end
        except KeyboardInterrupt:
            _end(harness)
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)
    result = os.path.join(out_dir, "result.json")
    status = 0
    if not os.path.exists(result) or os.path.getsize(result) == 0:
        # In its own process, as the harness: it imports torch, which this job never does.
        record = [
            sys.executable,
            "-m",
            "feedbench",
            "record-failure",
            out_dir,
            "--exit-code",
            str(code),
        ]
        status = subprocess.run([*record, "--cell", cell, "--log", log]).returncode
    if os.path.exists(result):
        _finished(out_dir)
    return status


def _finished(out_dir: str) -> None:
    """A record that this cell was stopped by its experiment's preflight (core.preflight) says
    nothing once it ran: it measured nothing, so it goes (an earlier attempt's measured files moved
    to attempts/ before the run)."""
    stopped = os.path.join(out_dir, "stopped.json")
    if os.path.exists(stopped):
        os.remove(stopped)
