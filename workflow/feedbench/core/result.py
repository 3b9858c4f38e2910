"""The result of one cell: written atomically as result.json (+ steps.csv), versioned by a JSON
schema, and read back against it (read_result)."""

from __future__ import annotations

import csv
import datetime
import functools
import hashlib
import io
import json
import math
import os
import sys
from importlib import resources

from .metric_table import with_metrics

SCHEMA_VERSION = 1
# With this variable set to a file, every result.json read_result reads appends its path there
# (before it is parsed and validated): how a test counts the reads of a real run, across its
# processes (tests/workflow/test_workflow.py, tests/workflow/test_failed_run.py).
READ_LOG = "FEEDBENCH_READ_LOG"

# A bench job's folder and log (plan.job), where the preflight's record (core.preflight), a twin's
# copy (plan.twins) and the run's end (plan.failures) find a cell's too: rule bench's output, log
# and benchmark are made from these (workflow/rules/bench.smk), and the job finds its own from the
# cell's labels. So the rule's shell command has two fields, not four: Snakemake formats it three
# times per job in a dry run (docs/performance.md, "Workflow DAG").
CELL_DIR = "results/cells/{experiment}/{cell}/rep{repeat}"
CELL_LOG = "logs/bench/{experiment}/{cell}/rep{repeat}.log"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def failed_result(
    raw: dict, cell: dict | None = None, adjustments: list[str] | None = None
) -> dict:
    """The fields every result has, for a cell that has not (yet) succeeded: status failed, nothing
    measured."""
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "failed",
        "requested": raw,
        "cell": cell,
        "adjustments": adjustments or [],
        "error": None,
        "metrics": {"steps": 0},
    }


def knobs_of(result: dict) -> dict:
    """A result's knobs and labels as the cell ran, or as requested where it never validated (`cell`
    is then None)."""
    return result.get("cell") or result.get("requested") or {}


def error_text(result: dict) -> str | None:
    """A failed result's one-line error message (None where it recorded none)."""
    error = result.get("error") or {}
    return error.get("message") or error.get("type") if isinstance(error, dict) else str(error)


def tail(path: str | None, lines: int = 30) -> str:
    """The last lines of a log, or '' when there is none."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except (OSError, TypeError):
        return ""


def schema_file() -> dict:
    """The result schema as its file states it: everything but the leaves core.metric_table declares
    and it omits."""
    return json.loads(
        resources.files("feedbench").joinpath("schemas/result.schema.json").read_text()
    )


def schema() -> dict:
    """The result schema: its file, with every metric of core.metric_table (`python -m feedbench
    metrics --schema`)."""
    return with_metrics(schema_file())


@functools.lru_cache(maxsize=1)
def _validator():
    # Imported here, not at the top: writing a result does not need it.
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema())


class UnusableResult(ValueError):
    """A result.json that cannot be read, is not a mapping, or does not validate: its cell counts as
    failed.

    `tag` names the damage (a digest of the bytes found, or `unreadable`), so the
    retry it asks for (plan.job) has a name that stays the same until the file changes.
    """

    def __init__(self, path: str, reason: str, tag: str):
        super().__init__(f"{path}: unusable result: {reason}")
        self.path, self.reason, self.tag = path, reason, tag


def _where(parts) -> str:
    return ".".join(str(p) for p in parts) or "the result"


def _not_finite(value, parts=()) -> str | None:
    """The path of the first NaN or infinity in a parsed JSON value, else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return _where(parts)
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _not_finite(item, (*parts, key))
        if found:
            return found
    return None


def read_result(path: str) -> dict:
    """A result.json that can be trusted, or UnusableResult saying why not.

    Unreadable bytes, JSON that is not a mapping, anything the schema refuses,
    and a measured (`ok`) result with non-finite metrics are all unusable: one
    rule for the workflow's retries and for the summary, so the two never disagree.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise UnusableResult(
            path, f"cannot be read ({error.strerror or error})", "unreadable"
        ) from None
    if os.environ.get(READ_LOG):
        # one short append: whole lines
        with open(os.environ[READ_LOG], "a", encoding="utf-8") as log:
            log.write(f"{os.path.abspath(path)}\n")
    tag = hashlib.sha256(data).hexdigest()[:12]
    try:
        result = json.loads(data)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise UnusableResult(path, f"not valid JSON ({error})", tag) from None
    if not isinstance(result, dict):
        raise UnusableResult(path, f"not a mapping but {type(result).__name__}", tag)
    reason = invalid(result)
    if reason:
        raise UnusableResult(path, reason, tag)
    return result


def results_by_cell(paths: list[str]) -> dict[str, list[dict]]:
    """`<experiment>/<cell>` -> its results that can be trusted (read_result), the others left out:
    what rule target reads of the compute ceilings measured on the target's GPU
    (harness.flops.target_estimates). The report reads the run's records (core.records)."""
    found: dict[str, list[dict]] = {}
    for path in paths:
        try:
            result = read_result(path)
        except UnusableResult:  # read_result turns an unreadable file into one too
            continue
        labels = knobs_of(result)
        found.setdefault(f"{labels.get('experiment')}/{labels.get('cell')}", []).append(result)
    return found


def invalid(result: dict) -> str | None:
    """Why a parsed result cannot be trusted (the schema refuses it, or an `ok` result has
    non-finite metrics), else None: read_result's rule, for records made in memory too (a lost
    cell's, feedbench.plan.slurm)."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(result))
    if error is not None:
        return f"{_where(error.absolute_path)}: {error.message}"
    if result["status"] == "ok":
        where = _not_finite(result["metrics"], ("metrics",))
        if where:
            return f"{where}: not a finite number"
    return None


def atomic_write(path: str, text: str) -> None:
    """Write to a temporary file beside the target, flush it to disk, then rename: readers never see
    half a file.

    On any failure (a full disk, a file size limit) the temporary file is
    removed and the target keeps whatever it held before.
    """
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:  # never created, or not removable: the first error is the one to report
            pass
        raise
    try:  # the rename itself survives a crash once the folder is on disk too
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_result(out_dir: str, result: dict, name: str = "result.json") -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    atomic_write(path, json.dumps(result, indent=2, default=str) + "\n")
    return path


def write_refusal(
    out_dir: str, result: dict, error: Exception, provenance: dict, started: str
) -> int:
    """A cell refused before it ran (a KnobError: bad knobs, or a GPU this node lacks): its failed
    result and one line on stderr; exit code 2."""
    result.update(
        error={"type": "KnobError", "message": str(error)},
        provenance=provenance,
        started_at=started,
        finished_at=now(),
    )
    write_result(out_dir, result)
    print(f"feedbench: error: {error}", file=sys.stderr)
    return 2


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
