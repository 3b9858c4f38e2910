"""Real harness results laid out as the workflow writes them, for the analysis and report tests.

Every result here comes from the harness itself (feedbench.harness.runner.run, in this
process): small, fast cells on the CPU. The layout and the cell ids mimic the
workflow's results/cells/<experiment>/<cell>/rep<k>/result.json.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
from dataclasses import dataclass

import pytest
from feedbench.harness.images import make_images
from feedbench.harness.runner import run

# torch_threads 1 (pinned because verdicts are asserted on these timings; the harness follows the
# launch): with PyTorch's default of one thread per core, a 2-core machine busy elsewhere turned a
# ~2 ms MLP step into ~200 ms, and the train cells' stall fell under the data-bound threshold.
FAST = {
    "steps": 6,
    "warmup_steps": 2,
    "monitor_interval_s": 0.05,
    "torch_threads": 1,
    "device": "cpu",
}

# A small matrix touching every kind of cell: loader, train, transfer, and one that fails.
EXPERIMENTS = {
    "loader": {
        "title": "Do loader workers help?",
        "base": {
            "scenario": "loader",
            "model": "none",
            "image_size": 16,
            "batch_size": 16,
            "num_samples": 256,
        },
        "matrix": {"num_workers": [0, 1], "pin_memory": [False, True]},
        "plot": [
            {"x": "num_workers", "y": "samples_per_s", "hue": "pin_memory", "kind": "line"},
            {"x": "num_workers", "y": "stall_pct", "hue": "pin_memory", "kind": "heatmap"},
        ],
    },
    "train": {
        "title": "Does a deeper MLP shift the bound?",
        "base": {
            "scenario": "train",
            "model": "mlp",
            "dataset": "memory",
            "input_size": 64,
            "width": 64,
            "batch_size": 32,
            "num_samples": 256,
            # the report's stage profile and the verdict's costliest stage, from real timings
            "stage_timing": True,
        },
        "matrix": {"hidden_layers": [1, 4], "sample_delay_ms": [0.0, 0.5]},
        "plot": [
            {"x": "hidden_layers", "y": "samples_per_s", "hue": "sample_delay_ms", "kind": "bar"},
            {"x": "hidden_layers", "hue": "sample_delay_ms", "kind": "phases"},
        ],
    },
    "transfer": {
        "title": "Host-to-device bandwidth",
        "base": {"scenario": "transfer", "steps": 3, "transfer_sizes": [65536, 1048576]},
        "matrix": {"non_blocking": [False]},
        "plot": {"x": "size_bytes", "y": "gb_per_s", "hue": "pinned", "kind": "line"},
    },
}


def cell_id(point: dict) -> str:
    return "_".join(f"{k}-{str(v).lower()}" for k, v in point.items())


def cells(experiments: dict) -> list[tuple[str, str, dict]]:
    """(experiment, cell id, knobs) for every point of every matrix."""
    out = []
    for name, exp in experiments.items():
        axes = exp["matrix"]
        for levels in itertools.product(*axes.values()):
            point = dict(zip(axes, levels, strict=True))
            out.append((name, cell_id(point), {**FAST, **exp["base"], **point}))
    return out


def run_matrix(root: str, experiments: dict = EXPERIMENTS, repeats: int = 2) -> list[str]:
    """Run every cell `repeats` times under root/cells; return the result.json paths.

    Labelled as the workflow labels them: an experiment's first cell (the first level of every axis)
    is its baseline.
    """
    paths = []
    seen = set()
    for experiment, cell, knobs in cells(experiments):
        baseline = experiment not in seen
        seen.add(experiment)
        for repeat in range(repeats):
            out = os.path.join(root, "cells", experiment, cell, f"rep{repeat}")
            labels = {
                "experiment": experiment,
                "cell": cell,
                "repeat": repeat,
                "baseline": baseline,
            }
            run({**knobs, **labels, "seed": repeat}, out)
            paths.append(os.path.join(out, "result.json"))
    return paths


def run_failing_cell(root: str, experiment: str = "broken", cell: str = "dataset-truncated") -> str:
    """A real failure: a JPEG folder with one truncated file, read by a resnet18 cell."""
    images = os.path.join(root, "images")
    make_images(images, 16, 32, 2, 0)
    victim = sorted(os.path.join(d, f) for d, _, files in os.walk(images) for f in files)[0]
    with open(victim, "r+b") as f:
        f.truncate(100)
    out = os.path.join(root, "cells", experiment, cell, "rep0")
    run(
        {
            "experiment": experiment,
            "cell": cell,
            "repeat": 0,
            "baseline": True,
            "dataset": "images",
            "data_dir": images,
            "model": "resnet18",
            "image_size": 32,
            "batch_size": 4,
            "steps": 4,
            "warmup_steps": 0,
            "shuffle": False,
            "device": "cpu",
        },
        out,
    )
    return os.path.join(out, "result.json")


@dataclass(frozen=True)
class Matrix:
    root: str
    paths: list[str]  # every result.json, the failing one last
    failing: str


@pytest.fixture(scope="session")
def real_matrix(tmp_path_factory) -> Matrix:
    """EXPERIMENTS x 2 repeats plus one failing cell, run once per test run.

    Cached under the run's temp dir.

    Under pytest-xdist each worker is a session: the first to need it runs it under a lock in the
    temp dir the workers share, the others wait and read it.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's temp dir, above this worker's
    root = base / "real-matrix"
    index = root / "paths.json"
    with open(base / "real-matrix.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not index.exists():
            paths = run_matrix(str(root))
            failing = run_failing_cell(str(root))
            index.write_text(json.dumps(paths + [failing]))
    paths = json.loads(index.read_text())
    return Matrix(str(root), paths, paths[-1])
