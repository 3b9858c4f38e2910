"""The CPU-speed reference measured on this machine (feedbench.core.cpu_speed says what and why),
and a target's speed factor from it: given in the config, or measured there and here.

`measure()` makes the reference's JPEG folder in a scratch folder, then runs the reference cell
`repeats` times under an affinity mask of one core (feedbench.harness.masked), each in a process of
its own: about 20 s here.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from datetime import datetime, timezone
from typing import Any

from ..core.cpu_speed import (
    KIND,
    REFERENCE_CORES,
    REPEATS,
    SHARED_BELOW_PCT,
    read_speed_file,
    reference,
    speed_ratio,
)
from ..core.result import atomic_write
from ..core.target import Target
from ..version import __version__
from .images import make_images
from .masked import run_masked


def measure(repeats: int = REPEATS, scratch: str | None = None) -> dict[str, Any]:
    """The reference cell's samples/s on one core here, `repeats` times: the cpu-speed record
    (core.cpu_speed)."""
    if repeats < 1:
        raise ValueError(f"repeats {repeats}: allowed: at least 1")
    with tempfile.TemporaryDirectory(prefix="cpu-speed-", dir=scratch) as root:
        ref = reference()
        images = os.path.join(root, "images")
        make_images(images, **ref["images"])
        # the new files written back before any repeat measures (as tests/helpers/loader_scaling.py
        # does)
        os.sync()
        results = []
        for repeat in range(1, repeats + 1):
            knobs = {
                **ref["knobs"],
                "data_dir": images,
                "experiment": "cpu-speed",
                "cell": "reference",
            }
            out = os.path.join(root, f"rep{repeat}")
            results.append(run_masked({**knobs, "repeat": repeat}, out, REFERENCE_CORES))
    rates = [float(result["metrics"]["samples_per_s"]) for result in results]
    median = statistics.median(rates)
    shares = [
        ((result.get("monitor") or {}).get("stats") or {}).get("trainer_cpu_pct") or {}
        for result in results
    ]
    provenance = results[-1].get("provenance") or {}
    return {
        "kind": KIND,
        "reference": ref,
        "samples_per_s_per_core": median,
        "repeats": rates,
        "spread_pct": 100 * (max(rates) - min(rates)) / median,
        # the share of its core each repeat had: 100 alone
        "cpu_pct": [share.get("mean") for share in shares],
        "host": provenance.get("host"),
        "cpu": provenance.get("cpu"),
        "feedbench": __version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def write_measurement(path: str, repeats: int = REPEATS) -> dict[str, Any]:
    """measure(), written to `path` as JSON (atomically); the record."""
    record = measure(repeats)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def summary(path: str, record: dict) -> str:
    """The command's line: the figure, its spread, and a warning where another process shared the
    reference's core."""
    shares = [share for share in record["cpu_pct"] if share is not None]
    shared = (
        f"; the core was shared: the reference had {min(shares):.0f} % of it, measure again with "
        "the node to itself"
        if shares and min(shares) < SHARED_BELOW_PCT
        else ""
    )
    return (
        f"wrote {path}: {record['samples_per_s_per_core']:.1f} samples/s on one core of "
        f"{record['cpu']} (median of {len(record['repeats'])}, spread {record['spread_pct']:.0f} "
        f"%){shared}; name it as the target's cpu_speed"
    )


def target_speed(target: Target, here: dict | None = None) -> dict[str, Any]:
    """The target's CPU speed factor and where it came from: `given` (the config's number), or
    `measured` (its file's reference there over the same reference measured here: `here`, else
    measure() now), with both records."""
    if target.cpu_speed_file is None:
        return {"cpu_speed": target.cpu_speed, "cpu_speed_from": "given"}
    there = read_speed_file(target.cpu_speed_file)
    here = measure() if here is None else here
    return {
        "cpu_speed": speed_ratio(there, here),
        "cpu_speed_from": "measured",
        "cpu_speed_file": target.cpu_speed_file,
        "cpu_speed_there": there,
        "cpu_speed_here": here,
    }
