"""A sampling thread: GPU utilisation and memory (NVML), host CPU, trainer RSS, USS and PSS, each worker's USS and
PSS (harness.memory) and CPU time.

Sampling runs beside the measured loop at a low rate so it does not compete
with it; a missing GPU or NVML is a note in the result, not an error.
"""

from __future__ import annotations

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
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
        except Exception as error:  # library missing, driver missing, no permission
            self.note = f"NVML unavailable ({type(error).__name__}: {error}): GPU utilisation not sampled"

    def sample(self) -> dict[str, float]:
        """The GPU's sample; {} once NVML has failed, so the host's sampling goes on without it."""
        if self.handle is None:
            return {}
        try:
            util = self.pynvml.nvmlDeviceGetUtilizationRates(self.handle)
            memory = self.pynvml.nvmlDeviceGetMemoryInfo(self.handle)
        except Exception as error:  # a MIG instance (no utilisation), a driver reset, a lost GPU
            self.handle = None
            self.note = f"NVML failed while sampling ({type(error).__name__}: {error}): GPU sampling stopped there"
            return {}
        return {"gpu_util_pct": float(util.gpu), "gpu_mem_used_mb": memory.used / 2**20}


# multiprocessing's own helper processes, started beside spawn and forkserver workers: not loader workers.
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _workers(process: psutil.Process) -> list[psutil.Process]:
    """The process's descendants less multiprocessing's helpers (a resource tracker outlives the loader that
    started it, so a later cell in the same process would count it as a worker). A helper is one of the process's
    own children: forkserver's workers are the server's children and carry its command line."""
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
    """Each worker's CPU time so far beside its wall time since it started, by (pid, start), and how many of the
    samples found it runnable (on a core or in the run queue, state R): a worker that ends keeps its last sample. A
    starved worker shows a CPU share far below one while it is runnable; one waiting on I/O is neither. Its first
    sample is kept too, so that what it did between its first and last sample (`window_cpu_s`, `window_wall_s`)
    leaves out its start-up and the warm-up: its steady state, per sample of its work (analysis.loader_scaling)."""
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


def _worker_record(worker: dict) -> dict:
    """A worker as the result holds it: its CPU share (CPU time / wall time) and runnable share (of its samples)."""
    record = {k: v for k, v in worker.items() if k not in ("runnable", "first")}
    record["cpu_share"] = round(worker["cpu_s"] / worker["wall_s"], 3) if worker["wall_s"] > 0 else None
    record["runnable_share"] = round(worker["runnable"] / worker["samples"], 3)
    return record


class Monitor(threading.Thread):
    """Samples until stop(); summary() gives mean and max of each series, and each process's memory against the
    samples delivered (`delivered`: the loader's samples so far; `start_method`: how its workers started)."""

    def __init__(
        self,
        interval_s: float,
        device: torch.device | None,
        delivered: Callable[[], int] | None = None,
        start_method: str | None = None,
    ):
        super().__init__(daemon=True, name="feedbench-monitor")
        self.interval_s = interval_s
        self.nvml = NVML(device)
        self.process = psutil.Process()
        self.samples: list[dict[str, float]] = []
        self.workers: dict[tuple[int, float], dict] = {}
        self.delivered = delivered or (lambda: 0)
        self.start_method = start_method
        self.memory = MemorySeries()
        self._halt = threading.Event()

    def run(self) -> None:
        psutil.cpu_percent(None)
        self.process.cpu_percent(None)
        while not self._halt.wait(self.interval_s):
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
            "notes": [self.nvml.note] if self.nvml.note else [],
        }
