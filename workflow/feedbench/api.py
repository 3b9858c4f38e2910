"""feedbench.measure: one cell from a notebook or a script, on objects instead of import paths.

The same harness as a workflow job (feedbench.harness.runner.run), without Snakemake. It
runs in a temporary folder, removed afterwards, and returns the result dict;
with `out_dir` it keeps result.json and steps.csv there.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

# What a result's cell says of an object passed here: it has no import path.
OBJECT = "feedbench.api:{}_object"


def _constant(obj):
    return lambda ctx, **args: obj


def measure(
    dataset=None,
    model=None,
    collate=None,
    to_device=None,
    step=None,
    out_dir: str | None = None,
    **knobs: Any,
) -> dict:
    """Measure one cell; dataset and model are objects (or built-in names), collate, to_device and
    step callables.

    The other knobs are those of `python -m feedbench knobs`. Returns the result
    (docs/result-schema.md); a bad knob gives status failed and a one-line error, as in the
    workflow.
    """
    from .harness.runner import run  # imports torch

    user: dict = {}
    for name, value in (("dataset", dataset), ("model", model)):
        if isinstance(value, str):
            knobs[name] = value
        elif value is not None:
            knobs[name], user[name] = OBJECT.format(name), _constant(value)
    for name, value in (("collate", collate), ("to_device", to_device), ("step", step)):
        if value is not None:
            knobs[name], user[name] = OBJECT.format(name), value
    with tempfile.TemporaryDirectory(prefix="feedbench-") as tmp:
        run(knobs, tmp, user=user)
        with open(os.path.join(tmp, "result.json"), encoding="utf-8") as f:
            result = json.load(f)
        if out_dir is not None:
            shutil.copytree(tmp, out_dir, dirs_exist_ok=True)
    return result
