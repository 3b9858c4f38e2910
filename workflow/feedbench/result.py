"""The result of one cell: written atomically as result.json (+ steps.csv), versioned by a JSON schema."""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
from importlib import resources

SCHEMA_VERSION = 1


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def failed_result(raw: dict, cell: dict | None = None, adjustments: list[str] | None = None) -> dict:
    """The fields every result has, for a cell that has not (yet) succeeded: status failed, nothing measured."""
    return {"schema_version": SCHEMA_VERSION, "status": "failed", "requested": raw, "cell": cell, "adjustments": adjustments or [],
            "error": None, "metrics": {"steps": 0}}


def tail(path: str | None, lines: int = 30) -> str:
    """The last lines of a log, or '' when there is none."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except (OSError, TypeError):
        return ""


def schema() -> dict:
    return json.loads(resources.files(__package__).joinpath("schemas/result.schema.json").read_text())


def atomic_write(path: str, text: str) -> None:
    """Write to a temporary file beside the target, then rename: readers never see half a file."""
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def write_result(out_dir: str, result: dict, name: str = "result.json") -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    atomic_write(path, json.dumps(result, indent=2, default=str) + "\n")
    return path


def write_rows(out_dir: str, rows: list[dict], name: str = "steps.csv") -> str | None:
    """One CSV row per measured step (or per timed copy for the transfer probe)."""
    if not rows:
        return None
    os.makedirs(out_dir, exist_ok=True)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(os.path.join(out_dir, name), text.getvalue())
    return name


def step_rows(table: dict[str, list[float]], samples: list[int], tokens: list[int]) -> list[dict]:
    rows = []
    for i in range(len(table["step"])):
        row = {"step": i}
        row.update({f"{name}_ms": round(values[i], 6) for name, values in table.items()})
        row["samples"] = samples[i]
        if tokens:
            row["tokens"] = tokens[i]
        rows.append(row)
    return rows
