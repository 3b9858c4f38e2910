"""Start the ranks of a multi-process cell and make sure one result says what happened.

Inside a Slurm job, one srun starts a task per GPU on every node of the
allocation (the bench rule asks for them with mpi="srun"). Elsewhere one
torchrun per node (several nodes are emulated on localhost with a static
rendezvous at 127.0.0.1), so every path of a multi-node cell runs on one
machine. Whatever the ranks do, rank 0 dying with SIGKILL included, the
launcher leaves a result.json that names the rank that brought the cell down.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import torch
import yaml

from ..core import resources, threads
from ..core.cell import Cell, cell_dict
from ..core.knobs import KnobError
from ..core.result import failed_result, now, tail, write_refusal, write_result
from .distributed import free_port, node_gpus, visible_gpus
from .provenance import machine_facts
from .stop import SIGTERM_REASON, TimeLimit


def torchrun_commands(cell: Cell, cell_path: str, out_dir: str, port: int) -> list[list[str]]:
    """One torchrun per (emulated) node, all meeting at 127.0.0.1:port."""
    return [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={cell.nodes}",
            f"--nproc-per-node={cell.gpus_per_node}",
            f"--node-rank={node}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "-m",
            "feedbench",
            "run",
            cell_path,
            "--out",
            out_dir,
            "--as-rank",
        ]
        for node in range(cell.nodes)
    ]


def in_slurm_job() -> bool:
    return "SLURM_JOB_ID" in os.environ and shutil.which("srun") is not None


def srun_command(cell: Cell, cell_path: str, out_dir: str) -> list[str]:
    """One task per GPU (or per gloo "GPU") on each node; a task that dies stops the step."""
    cuda = cell.device != "cpu" and torch.cuda.is_available()
    feedbench = [sys.executable, "-m", "feedbench", "run", cell_path, "--out", out_dir, "--as-rank"]
    return ["srun", *resources.srun_options(cell, cuda), *feedbench]


def _rank_reports(out_dir: str) -> list[dict]:
    reports = []
    for path in glob.glob(os.path.join(out_dir, "ranks", "rank*.json")):
        with open(path) as f:
            reports.append(json.load(f))
    return sorted(reports, key=lambda r: r["rank"]["rank"])


def torchrun_root_cause(logs: list[str]) -> str | None:
    """torchrun's own "Root Cause (first observed failure)" of a node's log, as one phrase."""
    for log in logs:
        text = tail(log, 400)
        found = re.search(
            r"Root Cause \(first observed "
            r"failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)[^\n]*?(\((SIG\w+)\))?\n",
            text,
            re.S,
        )
        if found:
            rank, code, _, sig = found.groups()
            return f"rank {rank} exited with code {code}" + (f" ({sig})" if sig else "") + " first"
    return None


def describe_failure(
    out_dir: str,
    world: int,
    codes: list[int],
    first: int | None,
    names: list[str],
    terminated: str | None,
    logs: list[str],
) -> dict:
    """One error naming the cause: the rank that raised, the rank or node that vanished, or the time
    limit."""
    reports = _rank_reports(out_dir)
    silent = sorted(set(range(world)) - {r["rank"]["rank"] for r in reports})
    raised = [r for r in reports if r["error"]["type"] != "Terminated"]
    vanished = (
        f"rank(s) {', '.join(map(str, silent))} exited without a report (killed?); "
        if silent and not terminated
        else ""
    )
    if terminated:
        return {"type": "Terminated", "message": terminated, "traceback": ""}
    if raised:
        first = raised[0]
        return dict(
            first["error"],
            message=f"{vanished}rank {first['rank']['rank']} failed: {first['error']['message']}",
        )
    cause = torchrun_root_cause(logs)
    if cause is None:
        cause = (
            f"{names[first]} exited with code {codes[first]}"
            if first is not None
            else f"ranks exited with codes {codes}"
        )
    return {
        "type": "RankExited",
        "message": f"{vanished}{cause}; the other ranks were stopped",
        "traceback": "".join(tail(log) for log in logs)[-4000:],
    }


def launch(
    raw: dict, cell: Cell, notes: list[str], out_dir: str, time_limit: float | None = None
) -> int:
    """Start the ranks, wait for them, and write the cell's result if rank 0 could not (or the cell
    failed)."""
    started = now()
    cell_path = _fresh_ranks_dir(raw, out_dir)
    print(
        f"feedbench: launching {resources.ranks(cell)} ranks on {cell.nodes} node(s) x "
        f"{cell.gpus_per_node}",
        file=sys.stderr,
    )
    # the rendezvous listens here, on this (the first) node
    env = dict(os.environ, MASTER_PORT=str(free_port()))
    # Each rank's threads as torchrun gives them (1 with several ranks a node and no
    # OMP_NUM_THREADS), under srun too.
    env = threads.torchrun_env(env, ranks_per_node=cell.gpus_per_node)
    if in_slurm_job():
        names, commands, envs = ["srun"], [srun_command(cell, cell_path, out_dir)], [env]
    else:
        commands = torchrun_commands(cell, cell_path, out_dir, int(env["MASTER_PORT"]))
        names = [f"node {node}" for node in range(len(commands))]
        try:
            envs = _node_envs(cell, env, len(commands))
        except KnobError as error:
            result = failed_result(raw, cell_dict(cell), notes)
            return write_refusal(
                out_dir, result, error, machine_facts(torch.device("cpu")), started
            )
    ranks = Ranks(*_start(names, commands, envs, out_dir))
    ranks.wait(time_limit)
    return _conclude(raw, cell, notes, out_dir, started, ranks, names)


def _fresh_ranks_dir(raw: dict, out_dir: str) -> str:
    """An empty ranks/ folder holding the cell the ranks read (its path returned); no result.json
    left from before."""
    result_path, ranks_dir = os.path.join(out_dir, "result.json"), os.path.join(out_dir, "ranks")
    if os.path.exists(result_path):  # a stale result must not pass for this run's
        os.remove(result_path)
    shutil.rmtree(ranks_dir, ignore_errors=True)
    os.makedirs(ranks_dir)
    cell_path = os.path.join(ranks_dir, "cell.yaml")
    with open(cell_path, "w") as f:
        yaml.safe_dump(raw, f)
    return cell_path


def _node_envs(cell: Cell, env: dict, nodes: int) -> list[dict]:
    """Each torchrun's environment: on GPUs, every emulated node its own GPUs (KnobError when too
    few are visible)."""
    if cell.device != "cuda":
        return [env] * nodes
    gpus = node_gpus(cell.nodes, cell.gpus_per_node, visible_gpus())
    return [dict(env, CUDA_VISIBLE_DEVICES=node) for node in gpus]


def _start(names: list[str], commands: list[list[str]], envs: list[dict], out_dir: str):
    """One process per command, in a session of its own, its output in ranks/<name>.log; the
    processes and logs."""
    procs, logs = [], []
    for name, command, node_env in zip(names, commands, envs, strict=True):
        log = os.path.join(out_dir, "ranks", name.replace(" ", "") + ".log")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                command,
                stdout=open(log, "w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=node_env,
            )
        )
    return procs, logs


class Ranks:
    """The launched processes (srun, or one torchrun per node), and every rank ever seen under them.

    torchrun starts ranks in sessions of their own, so a rank whose torchrun died must still be
    found and stopped.
    """

    def __init__(self, procs: list[subprocess.Popen], logs: list[str]):
        self.procs, self.logs = procs, logs
        self.seen: dict[int, psutil.Process] = {}
        self.terminated: str | None = None  # why the ranks were told to stop, if they were
        self.first_node: int | None = None  # the first process to exit with an error

    def note_ranks(self) -> None:
        for p in self.procs:
            try:
                for child in psutil.Process(p.pid).children(recursive=True):
                    self.seen.setdefault(child.pid, child)
            except psutil.NoSuchProcess:
                pass

    def stop_all(self) -> None:
        self.note_ranks()
        for proc in [
            *self.seen.values(),
            *(psutil.Process(p.pid) for p in self.procs if p.poll() is None),
        ]:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass

    def stop(self, reason: str) -> None:  # every rank gets SIGTERM, then the result is written
        self.terminated = self.terminated or reason
        self.stop_all()

    def wait(self, time_limit: float | None) -> None:
        """Until every process has exited; the first to fail, SIGTERM or the time limit stops the
        others."""
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: self.stop(SIGTERM_REASON))
        limit = TimeLimit(time_limit, on_expiry=self.stop)
        try:
            while any(p.poll() is None for p in self.procs):
                self.note_ranks()
                for node, p in enumerate(self.procs):
                    # like srun --kill-on-bad-exit
                    if p.poll() not in (None, 0) and self.first_node is None:
                        self.first_node = node
                        self.stop_all()
                time.sleep(0.2)
        finally:
            limit.cancel()
            signal.signal(signal.SIGTERM, previous)
            _, orphans = psutil.wait_procs(
                [r for r in self.seen.values() if r.is_running()], timeout=30
            )
            for orphan in orphans:  # still there after SIGTERM and a grace period
                orphan.kill()

    @property
    def codes(self) -> list[int]:
        return [p.returncode for p in self.procs]


def _conclude(
    raw: dict,
    cell: Cell,
    notes: list[str],
    out_dir: str,
    started: str,
    ranks: Ranks,
    names: list[str],
) -> int:
    """0 when rank 0 wrote an ok result and every process exited cleanly; else one failed result
    naming the cause."""
    codes = ranks.codes
    result_path = os.path.join(out_dir, "result.json")
    result = None
    if os.path.exists(result_path):
        with open(result_path) as f:
            result = json.load(f)
    if result is not None and result["status"] == "ok" and not any(codes):
        return 0

    if result is None:  # rank 0 died before it could write
        reports = _rank_reports(out_dir)
        result = failed_result(raw, cell_dict(cell), notes)
        result.update(
            provenance=reports[0]["provenance"] if reports else machine_facts(torch.device("cpu")),
            started_at=started,
            finished_at=now(),
        )
    result["status"] = "failed"
    result["error"] = describe_failure(
        out_dir, resources.ranks(cell), codes, ranks.first_node, names, ranks.terminated, ranks.logs
    )
    write_result(out_dir, result)
    print(f"feedbench: cell failed: {result['error']['message']}", file=sys.stderr)
    return 2 if result["error"]["type"] == "KnobError" else 1
