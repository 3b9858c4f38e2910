"""A CPU's speed, measured: one fixed reference loader cell run on one core, here and on the target.

`python -m feedbench cpu-speed --out FILE` (feedbench.harness.cpu_speed) runs REFERENCE a few times
and writes FILE:

    kind                    KIND, so that another JSON file is not taken for one
    reference               the reference cell: its knobs, the JPEG folder it reads (make-images'
                            arguments), its cores
    samples_per_s_per_core  the median of the repeats' samples/s (one core: per core)
    repeats                 every repeat's samples/s; spread_pct: (max - min) / median, in %
    cpu_pct                 every repeat's share of its core (the monitor's mean CPU %): below
                            SHARED_BELOW_PCT, another process shared the core, and the figure reads
                            low
    host, cpu               the host name and the CPU's model; feedbench: the version; date: UTC,
                            ISO 8601

A target names such a file, measured on its node, in place of a number: `target: {cpu_speed:
there.json}`. The plan checks it before any job (read_speed_file: the file exists and is a cpu-speed
file of this REFERENCE, else one ConfigError line); rule target then runs the same reference here,
and the speed is there / here (speed_ratio).

The reference is the loader of the built-in JPEG folder (`dataset: images`: PIL decode,
RandomResizedCrop, flip, Normalize, collate): the CPU work of a real image loader, in the main
process (no workers), with one torch thread, under an affinity mask of one core, as the
loader-scaling cells run (feedbench.harness.masked).
"""

from __future__ import annotations

import json
import os
from typing import Any

from .knobs import ConfigError, shown

KIND = "feedbench cpu-speed"
REFERENCE_KNOBS = {
    "scenario": "loader",
    "dataset": "images",
    "image_size": 224,
    "batch_size": 16,
    "num_workers": 0,
    "torch_threads": 1,
    "device": "cpu",
    "warmup_steps": 5,
    "steps": 60,
    "monitor_interval_s": 0.1,
}
# make-images' arguments of the folder the reference reads (deterministic: the same JPEG bytes on
# every machine).
REFERENCE_IMAGES = {"count": 256, "size": 256, "classes": 4, "seed": 0}
REFERENCE_CORES = 1
REPEATS = 3
# Below this share of its core (the monitor's mean CPU % of the reference's process), another
# process shared it.
SHARED_BELOW_PCT = 90


def reference() -> dict[str, Any]:
    """The reference cell as a cpu-speed file records it: two files measure the same thing when
    theirs are equal."""
    return {
        "knobs": dict(REFERENCE_KNOBS),
        "images": dict(REFERENCE_IMAGES),
        "cores": REFERENCE_CORES,
    }


def is_speed_file(value: Any) -> bool:
    """Whether a target's `cpu_speed` names a file (a measurement) rather than giving the factor."""
    return isinstance(value, str)


def _flat(reference_: Any) -> dict[str, Any]:
    """A reference as `part.key` -> value (`cores` alone), whatever its shape."""
    reference_ = reference_ if isinstance(reference_, dict) else {}
    flat = {"cores": reference_.get("cores")}
    for part in ("knobs", "images"):
        values = reference_.get(part)
        flat.update(
            {f"{part}.{k}": v for k, v in (values if isinstance(values, dict) else {}).items()}
        )
    return flat


def _differences(got: Any) -> str:
    """What of a file's reference differs from REFERENCE, as `key theirs (here: ours)` items."""
    theirs, ours = _flat(got), _flat(reference())
    return ", ".join(
        f"{k} {shown(theirs.get(k))} (here: {shown(ours.get(k))})"
        for k in sorted(set(theirs) | set(ours))
        if theirs.get(k) != ours.get(k)
    )


def read_speed_file(path: str, where: str = "target.cpu_speed") -> dict[str, Any]:
    """A cpu-speed file, checked: it exists, is JSON of KIND, measured this REFERENCE and gives a
    positive samples_per_s_per_core; else one ConfigError line naming what is wrong and what is
    allowed."""
    allowed = (
        "allowed: a number > 0, or a file written by `python -m feedbench cpu-speed "
        "--out FILE` on the target"
    )
    if not os.path.isfile(path):
        raise ConfigError(f"{where}: no file {path}; {allowed}")
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(
            f"{where}: {path} is not JSON ({str(error).splitlines()[0]}); {allowed}"
        ) from None
    if not isinstance(record, dict) or record.get("kind") != KIND:
        raise ConfigError(
            f"{where}: {path} is not a cpu-speed file (no kind {shown(KIND)}); {allowed}"
        )
    if record.get("reference") != reference():
        raise ConfigError(
            f"{where}: {path} measured another reference cell ("
            f"{_differences(record.get('reference'))}); allowed: a file of this feedbench's "
            "reference cell (run `python -m feedbench cpu-speed` there again)"
        )
    rate = record.get("samples_per_s_per_core")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ConfigError(
            f"{where}: {path} gives samples_per_s_per_core {shown(rate)}; allowed: a number > 0"
        )
    return record


def speed_ratio(there: dict, here: dict) -> float:
    """One core of the target against one core here: the reference's samples/s per core there over
    here."""
    return float(there["samples_per_s_per_core"]) / float(here["samples_per_s_per_core"])


def with_speed_file(target: dict | None, folder: str) -> None:
    """A target's cpu_speed file, in place, made absolute relative to `folder` (that of the config
    file that sets it), so that every job finds it."""
    if target and is_speed_file(target.get("cpu_speed")):
        target["cpu_speed"] = os.path.normpath(
            os.path.join(folder, os.path.expanduser(target["cpu_speed"]))
        )
