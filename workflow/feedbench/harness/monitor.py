"""A sampling thread: GPU utilisation and memory (NVML), host CPU, trainer RSS, USS and PSS, each
worker's USS and PSS (harness.memory) and CPU time.

Sampling runs beside the measured loop at a low rate so it does not compete
with it; a missing GPU or NVML is a note in the result, not an error.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Callable

import psutil
import torch

from .memory import MemorySeries


class NVML:
    """The GPU of this process through nvidia-ml-py, or a note saying why not.

    The GPU is found by UUID: CUDA's index differs from NVML's wherever
    CUDA_VISIBLE_DEVICES is set, as it is in every Slurm job.
    """

    def __init__(self, device: torch.device | None):
        self.handle, self.note = None, None
        if device is None or device.type != "cuda":
            self.note = "no GPU in use: GPU utilisation and memory not sampled"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(
                uuid if uuid.startswith("GPU-") else "GPU-" + uuid
            )
        except Exception as error:  # library missing, driver missing, no permission
            self.note = (
                f"NVML unavailable ({type(error).__name__}: {error}): GPU utilisation not sampled"
            )

    def sample(self) -> dict[str, float]:
        """The GPU's sample; {} once NVML has failed, so the host's sampling goes on without it."""
        if self.handle is None:
            return {}
        try:
            util = self.pynvml.nvmlDeviceGetUtilizationRates(self.handle)
            memory = self.pynvml.nvmlDeviceGetMemoryInfo(self.handle)
        except Exception as error:  # a MIG instance (no utilisation), a driver reset, a lost GPU
            self.handle = None
            self.note = (
                f"NVML failed while sampling ({type(error).__name__}: {error}): GPU "
                "sampling stopped there"
            )
            return {}
        return {"gpu_util_pct": float(util.gpu), "gpu_mem_used_mb": memory.used / 2**20}


# multiprocessing's own helper processes, started beside spawn and forkserver workers: not loader
# workers.
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _workers(process: psutil.Process) -> list[psutil.Process]:
    """The process's descendants less multiprocessing's helpers (a resource tracker outlives the
    loader that started it, so a later cell in the same process would count it as a worker). A
    helper is one of the process's own children: forkserver's workers are the server's children and
    carry its command line."""
    workers = []
    for child in process.children(recursive=True):
        try:
            command, parent = " ".join(child.cmdline()), child.ppid()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if parent != process.pid or not any(helper in command for helper in HELPERS):
            workers.append(child)
    return workers


def _workers_cpu(process: psutil.Process, seen: dict[tuple[int, float], dict]) -> None:
    """Each worker's CPU time so far beside its wall time since it started, by (pid, start), and how
    many of the samples found it runnable (on a core or in the run queue, state R): a worker that
    ends keeps its last sample. A starved worker shows a CPU share far below one while it is
    runnable; one waiting on I/O is neither. Its first sample is kept too, so that what it did
    between its first and last sample (`window_cpu_s`, `window_wall_s`) leaves out its start-up and
    the warm-up: its steady state, per sample of its work (analysis.loader_scaling)."""
    now = time.time()
    for child in _workers(process):
        try:
            with child.oneshot():
                times, started, status = child.cpu_times(), child.create_time(), child.status()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        before = seen.get((child.pid, started), {})
        cpu, wall = times.user + times.system, max(now - started, 0.0)
        first = before.get("first", (cpu, wall))
        seen[(child.pid, started)] = {
            "pid": child.pid,
            "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3),
            "window_cpu_s": round(cpu - first[0], 3),
            "window_wall_s": round(wall - first[1], 3),
            "first": first,
            "samples": before.get("samples", 0) + 1,
            "runnable": before.get("runnable", 0) + (status == psutil.STATUS_RUNNING),
        }


def _busy_s(cpus: list[int]) -> float:
    """The CPU seconds the given CPUs have spent on any work since boot (all but idle and iowait;
    steal, the hypervisor's, counts as busy: it is not this cell's to use). Linux counts a guest's
    time inside user and nice already: taken out once."""
    per_cpu = psutil.cpu_times(percpu=True)
    return sum(
        sum(per_cpu[i])
        - per_cpu[i].idle
        - sum(getattr(per_cpu[i], field, 0.0) for field in ("iowait", "guest", "guest_nice"))
        for i in cpus
        if i < len(per_cpu)
    )


def _cell_cpu_s(process: psutil.Process) -> float:
    """The CPU seconds of this process (all its threads) and of every process it started, so far:
    each live one's own and what it has reaped of its children. A worker that ends inside the window
    (an epoch boundary without persistent_workers) moves from the live to its reaper's, this process
    or, with forkserver, the server: never read as other load. The helpers (resource tracker,
    forkserver) are the cell's machinery, counted too."""
    total = 0.0
    for proc in (process, *process.children(recursive=True)):
        try:
            times = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


class Offered:
    """The cores the cell's CPUs offered its work over the window: its affinity mask's cores, less
    the CPU time other processes took on them (their busy time less the cell's own) and less this
    monitor's own (its sampling is not the cell's work: at 0.1 s, with the workers' USS and PSS read
    from smaps, it took a fifth of a core). Other load (another session's tests, a CPU hog) shows as
    fewer offered cores; an idle core counts as offered, used or not (analysis.loader_scaling)."""

    def __init__(self, process: psutil.Process):
        self.process = process
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.start = self._snapshot()

    def _snapshot(self) -> tuple[float, float, float | None]:
        """Now, the CPUs' busy time, the cell's CPU time (None once its process is gone: a command
        that ended as its window closed, harness.command)."""
        try:
            cell = _cell_cpu_s(self.process)
        except psutil.NoSuchProcess:
            cell = None
        return time.perf_counter(), _busy_s(self.cpus), cell

    def summary(self, monitor_cpu_s: float) -> dict | None:
        """`cores` (the mask's), `wall_s`, `busy_s` (the mask's CPUs, all work), `cell_cpu_s` (this
        process and all it started, live or reaped, the monitor included), `monitor_cpu_s` (the
        monitor's thread), `offered_cores`, and `other_cores` (other work on those CPUs, in cores:
        what the verdict warns of); None where the mask or the CPU times cannot be read."""
        if not self.cpus:
            return None
        (t0, busy0, cell0), (t1, busy1, cell1) = self.start, self._snapshot()
        if cell0 is None or cell1 is None:
            return None
        wall, busy, cell = t1 - t0, busy1 - busy0, cell1 - cell0
        if wall <= 0:
            return None
        other = max(busy - cell, 0.0)  # the cell's own, its monitor included, taken out
        others = min(other + monitor_cpu_s, len(self.cpus) * wall)
        return {
            "cores": len(self.cpus),
            "wall_s": round(wall, 3),
            "busy_s": round(busy, 3),
            "cell_cpu_s": round(cell, 3),
            "monitor_cpu_s": round(monitor_cpu_s, 3),
            "offered_cores": round(len(self.cpus) - others / wall, 3),
            "other_cores": round(other / wall, 3),
        }


def _worker_record(worker: dict) -> dict:
    """A worker as the result holds it: its CPU share (CPU time / wall time) and runnable share (of
    its samples)."""
    record = {k: v for k, v in worker.items() if k not in ("runnable", "first")}
    record["cpu_share"] = (
        round(worker["cpu_s"] / worker["wall_s"], 3) if worker["wall_s"] > 0 else None
    )
    record["runnable_share"] = round(worker["runnable"] / worker["samples"], 3)
    return record


class Monitor(threading.Thread):
    """Samples until stop(); summary() gives mean and max of each series, and each process's memory
    against the samples delivered (`delivered`: the loader's samples so far; `start_method`: how its
    workers started). The trainer is this process, or the process `pid` (a command's:
    harness.command)."""

    def __init__(
        self,
        interval_s: float,
        device: torch.device | None,
        delivered: Callable[[], int] | None = None,
        start_method: str | None = None,
        pid: int | None = None,
        low_priority: bool = False,
    ):
        super().__init__(daemon=True, name="feedbench-monitor")
        self.interval_s, self.low_priority = interval_s, low_priority
        self.nvml = NVML(device)
        self.process = psutil.Process(pid)
        self.samples: list[dict[str, float]] = []
        self.workers: dict[tuple[int, float], dict] = {}
        self.delivered = delivered or (lambda: 0)
        self.start_method = start_method
        self.memory = MemorySeries()
        self._halt = threading.Event()
        self.offered: Offered | None = None
        self.cpu_offered: dict | None = None
        self.own_cpu_s = 0.0  # the sampling thread's CPU time over the window

    def run(self) -> None:
        if self.low_priority and hasattr(os, "setpriority"):
            # this thread alone (Linux: a thread is a task of its own), below the cell's processes
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        psutil.cpu_percent(None)
        self.offered = Offered(self.process)
        start = time.thread_time()
        try:
            self.process.cpu_percent(None)
            while not self._halt.wait(self.interval_s):
                self._sample()
                self.own_cpu_s = time.thread_time() - start
        except psutil.NoSuchProcess:  # a command's process that ended as its window closed
            pass

    def _sample(self) -> None:
        """One sample of the host, the trainer and its workers, and the GPU."""
        sample = {
            "host_cpu_pct": psutil.cpu_percent(None),
            "trainer_cpu_pct": self.process.cpu_percent(None),
            "trainer_rss_mb": self.process.memory_info().rss / 2**20,
        }
        sample.update(self.memory.record(self.delivered(), self.process, _workers(self.process)))
        _workers_cpu(self.process, self.workers)
        sample.update(self.nvml.sample())
        self.samples.append(sample)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        # here, as the window closes, not in the thread's last interval
        if self.offered is not None:
            self.cpu_offered = self.offered.summary(self.own_cpu_s)

    def summary(self) -> dict:
        series: dict[str, list[float]] = {}
        for sample in self.samples:
            for key, value in sample.items():
                series.setdefault(key, []).append(value)
        stats = {key: {"mean": statistics.fmean(v), "max": max(v)} for key, v in series.items()}
        return {
            "interval_s": self.interval_s,
            "samples": len(self.samples),
            "stats": stats,
            "workers": [_worker_record(w) for w in self.workers.values()],
            "memory": self.memory.summary(self.start_method),
            "cpu_offered": self.cpu_offered,
            "notes": [self.nvml.note] if self.nvml.note else [],
        }
