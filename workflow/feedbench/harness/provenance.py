"""Where a result came from: an allow-list of host, hardware and software facts.

Never the whole environment: it can hold secrets and makes results unshareable.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from typing import Callable

import torch

from ..core.cores import usable_cores
from ..version import __version__


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(path: str) -> str | None:
    """The commit of the workflow checkout, with '-dirty' when it has local changes."""
    try:
        commit = subprocess.run(
            ["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode:
            return None
        dirty = subprocess.run(
            ["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def _cuda_read(read: Callable, default=None):
    """One CUDA read for the facts, guarded: on a machine without a usable CUDA (no driver, a broken
    one) each says what it cannot read as `default`, rather than raise before the cell has written
    anything. What CUDA raises there is not one type (RuntimeError, AssertionError,
    torch.AcceleratorError)."""
    try:
        return read()
    except Exception:
        return default


def _gpu(device: torch.device) -> dict:
    available = _cuda_read(torch.cuda.is_available, False)
    info = {
        "gpu": _cuda_read(lambda: torch.cuda.get_device_name(device))
        if available and device.type == "cuda"
        else None,
        "gpu_count": _cuda_read(torch.cuda.device_count, 0) if available else 0,
        "driver": None,
    }
    if info["gpu"] is None:
        return info
    try:
        import pynvml

        pynvml.nvmlInit()
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception:
        pass
    return info


def software_facts(device: torch.device) -> dict:
    """The GPU and the software that ran the cell's steps: this interpreter's torch, CUDA, cuDNN,
    torchvision and Python. A command cell's instrument reads them in the user's own interpreter
    (harness.inloop: `python:` may name another environment), which may lack psutil and
    torchvision: so this needs neither."""
    try:
        # From the installed distribution's metadata: importing torchvision for its __version__
        # pulls in torch._dynamo, about 1.1 s of CPU in every cell that does not need torchvision
        # otherwise.
        torchvision = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        torchvision = None
    return {
        **_gpu(device),
        "cuda": torch.version.cuda,
        "cudnn": _cuda_read(torch.backends.cudnn.version)
        if torch.backends.cudnn.is_available()
        else None,
        "torch": torch.__version__,
        "torchvision": torchvision,
        "python": sys.version.split()[0],
    }


def machine_facts(device: torch.device) -> dict:
    """This machine and its software for one result's `provenance` (the allow-list above; the report
    reads it back)."""
    import psutil

    return {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        **software_facts(device),
        "software_of": "harness",
        "feedbench": __version__,
        "git_commit": git_commit(os.path.dirname(os.path.abspath(__file__))),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cores": usable_cores(),
    }
