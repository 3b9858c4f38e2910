"""A sampling thread: GPU utilisation and memory (NVML), host CPU, trainer RSS, workers' PSS/USS and CPU time.

Sampling runs beside the measured loop at a low rate so it does not compete
with it; a missing GPU or NVML is a note in the result, not an error.
"""

from __future__ import annotations

import statistics
import threading
import time

import psutil
import torch


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
    started it, so a later cell in the same process would count it as a worker)."""
    workers = []
    for child in process.children(recursive=True):
        try:
            command = " ".join(child.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if not any(helper in command for helper in HELPERS):
            workers.append(child)
    return workers


def _workers_memory(process: psutil.Process) -> dict[str, float]:
    pss = uss = 0.0
    for child in _workers(process):
        try:
            info = child.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss += getattr(info, "pss", info.rss)
        uss += info.uss
    return {"workers_pss_mb": pss / 2**20, "workers_uss_mb": uss / 2**20}


def _workers_cpu(process: psutil.Process, seen: dict[tuple[int, float], dict]) -> None:
    """Each worker's CPU time so far beside its wall time since it started, by (pid, start): a worker that ends
    keeps its last sample. A starved worker shows a CPU share far below one while it is busy. Its first sample is
    kept too, so that what it did between its first and last sample (`window_cpu_s`, `window_wall_s`) leaves out
    its start-up and the warm-up: its steady state, per sample of its work (analysis.loader_scaling)."""
    now = time.time()
    for child in _workers(process):
        try:
            with child.oneshot():
                times, started = child.cpu_times(), child.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        cpu, wall = times.user + times.system, max(now - started, 0.0)
        first = seen.get((child.pid, started), {}).get("first", (cpu, wall))
        seen[(child.pid, started)] = {
            "pid": child.pid,
            "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3),
            "window_cpu_s": round(cpu - first[0], 3),
            "window_wall_s": round(wall - first[1], 3),
            "first": first,
        }


class Monitor(threading.Thread):
    """Samples until stop(); summary() gives mean and max of each series."""

    def __init__(self, interval_s: float, device: torch.device | None):
        super().__init__(daemon=True, name="feedbench-monitor")
        self.interval_s = interval_s
        self.nvml = NVML(device)
        self.process = psutil.Process()
        self.samples: list[dict[str, float]] = []
        self.workers: dict[tuple[int, float], dict] = {}
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
            sample.update(_workers_memory(self.process))
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
            "workers": [
                {
                    **{k: v for k, v in w.items() if k != "first"},
                    "cpu_share": round(w["cpu_s"] / w["wall_s"], 3) if w["wall_s"] > 0 else None,
                }
                for w in self.workers.values()
            ],
            "notes": [self.nvml.note] if self.nvml.note else [],
        }
