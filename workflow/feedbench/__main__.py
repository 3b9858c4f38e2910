"""Command line: `python -m feedbench run CELL.yaml --out DIR`, `python -m feedbench make-images
DIR`, `... job DIR`, `... cpu-speed --out FILE`, `... preflight --cells JSON --out FILE --log
LOG`."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import yaml

from .core import metric_table
from .core.knobs import KNOBS, markdown_table
from .core.result import schema


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads 1e-05 as a string; json.dumps writes small floats so (the workflow's
    cell.yaml): read a number."""


EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789"))


def _load_cell(path: str | None, overrides: list[str]) -> dict:
    raw = {}
    if path:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        # the workflow writes cell.yaml as JSON: read it as such, so every string comes back as it
        # was
        try:
            raw = json.loads(text)
        except ValueError:
            raw = yaml.load(text, Loader=_Loader) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a cell file must be a mapping of knob: value")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KNOB=VALUE")
        raw[key.strip()] = yaml.load(value, Loader=_Loader)
    return raw


def build_parser() -> argparse.ArgumentParser:
    """The commands and their options."""
    parser = argparse.ArgumentParser(prog="feedbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_cell_commands(sub)
    _add_preflight(sub)
    _add_tool_commands(sub)
    return parser


def _add_cell_commands(sub) -> None:
    """run and job: what runs a cell."""
    run = sub.add_parser("run", help="run one cell and write DIR/result.json and DIR/steps.csv")
    run.add_argument(
        "cell", nargs="?", help="YAML file of knob: value (missing knobs take defaults)"
    )
    run.add_argument(
        "--out", required=True, help="folder for result.json, steps.csv and trace.json"
    )
    run.add_argument(
        "--set",
        "-s",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="override a knob (repeatable)",
    )
    run.add_argument(
        "--as-rank",
        action="store_true",
        help="run as one rank started by torchrun or srun (set by the launcher)",
    )
    run.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="stop the cell after this long and record it as failed",
    )
    run.add_argument(
        "--stop-at",
        type=float,
        metavar="UNIX_TIME",
        help="as --time-limit, counted to this time once the harness has started (the bench "
        "job's end)",
    )
    job = sub.add_parser(
        "job", help="the bench rule's job: write DIR/cell.yaml, run the cell, record its failure"
    )
    job.add_argument(
        "out",
        nargs="?",
        help="default: the cell's folder from its labels (feedbench.core.result.CELL_DIR)",
    )
    job.add_argument("--cell", required=True, help="the cell's knobs as JSON")
    job.add_argument(
        "--runtime",
        type=float,
        required=True,
        metavar="MINUTES",
        help="the job's runtime (outside Slurm)",
    )
    job.add_argument(
        "--log",
        help="the harness's output; default: the cell's log from its labels "
        "(feedbench.core.result.CELL_LOG)",
    )
    job.add_argument(
        "--launch-env",
        nargs="*",
        metavar="NAME=VALUE",
        help="the thread variables Snakemake sets to each job's threads, as the workflow was "
        "launched with them (feedbench.core.threads): the harness gets these back; "
        "without the option the environment is left alone",
    )


def _add_preflight(sub) -> None:
    """preflight: the check of an experiment's user code before its cells."""
    preflight = sub.add_parser(
        "preflight",
        help="the preflight rule's job: build an experiment's user code once per "
        "combination, write its record",
    )
    preflight.add_argument(
        "--cells", required=True, help="a JSON list: the first cell of each combination"
    )
    preflight.add_argument(
        "--out", required=True, metavar="FILE", help="the record (feedbench.core.preflight)"
    )
    preflight.add_argument("--log", required=True, help="the check's output, its tracebacks whole")
    preflight.add_argument(
        "--attempt", default="first", help="which attempt this is (the rule's params), recorded"
    )
    preflight.add_argument(
        "--after",
        default=None,
        help="a ceiling experiment's, JSON: the first cell of a combination -> the preflight "
        "records of the experiments it bounds; checked only where one of them passed",
    )
    preflight.add_argument(
        "--here", action="store_true", help="check in this process (the job runs it so)"
    )


def _add_tool_commands(sub) -> None:
    """The helpers: test data, a failed result, the CPU speed, the knob and metric tables."""
    images = sub.add_parser(
        "make-images", help="write a deterministic JPEG folder in the ImageNet layout"
    )
    images.add_argument("dir")
    images.add_argument("--count", type=int, default=1000)
    images.add_argument("--size", type=int, default=256)
    images.add_argument("--classes", type=int, default=10)
    images.add_argument("--seed", type=int, default=0)
    shards = sub.add_parser(
        "make-shards",
        help="write a JPEG folder as WebDataset tar shards and Parquet files, deterministically",
    )
    shards.add_argument("images", help="a folder of make-images")
    shards.add_argument("dir", help="writes DIR/shards-<N>/webdataset and DIR/shards-<N>/parquet")
    shards.add_argument(
        "--shards", type=int, nargs="+", default=[8], help="shard counts (one set per count)"
    )
    failure = sub.add_parser(
        "record-failure", help="write a failed result for a harness that died without one"
    )
    failure.add_argument("out")
    failure.add_argument("--exit-code", type=int, required=True)
    failure.add_argument("--cell", help="the cell YAML the harness was given")
    failure.add_argument("--log", help="the harness's log, whose tail becomes the traceback")
    speed = sub.add_parser(
        "cpu-speed",
        help="measure this CPU with the reference loader cell on one core and write FILE (a "
        "target's cpu_speed)",
    )
    speed.add_argument("--out", required=True, metavar="FILE", help="the JSON file to write")
    speed.add_argument(
        "--repeats", type=int, default=None, help="runs of the reference cell (default 3)"
    )
    knobs = sub.add_parser("knobs", help="list every knob with its default and allowed values")
    knobs.add_argument(
        "--markdown", action="store_true", help="as the Markdown table of docs/knobs.md"
    )
    metrics = sub.add_parser(
        "metrics", help="list every metric of a result with its summary column"
    )
    shown = metrics.add_mutually_exclusive_group()
    shown.add_argument(
        "--markdown", action="store_true", help="as the Markdown table of docs/result-schema.md"
    )
    shown.add_argument(
        "--schema",
        action="store_true",
        help="print the whole result schema, the metrics' leaves added",
    )


def _knobs(args) -> int:
    if args.markdown:
        print(markdown_table(), end="")
        return 0
    for knob in KNOBS.values():
        print(
            f"{knob.name:26} default {knob.default!r:12} allowed: {knob.allowed()}  # {knob.help}"
        )
    return 0


def _metrics(args) -> int:
    if args.markdown:
        print(metric_table.markdown_table(), end="")
    elif args.schema:
        print(json.dumps(schema(), indent=2))
    else:
        for m in metric_table.METRICS.values():
            print(f"{m.summary_column or '-':34} {m.path:56} {m.unit:10} # {m.help}")
    return 0


def _record_failure(args) -> int:
    from .harness.runner import record_failure

    if os.path.exists(os.path.join(args.out, "result.json")):
        return 0  # the harness wrote its own result: it knows better
    raw = _load_cell(args.cell, []) if args.cell and os.path.exists(args.cell) else {}
    record_failure(args.out, raw, args.exit_code, args.log)
    return 0


def _job(args) -> int:
    from .core.threads import restored
    from .plan.job import cell_paths, run_job

    if args.out is None or args.log is None:
        try:
            out, log = cell_paths(args.cell)
        except ValueError as error:
            print(f"feedbench: error: job: {error}", file=sys.stderr)
            return 2
        args.out, args.log = args.out or out, args.log or log
    try:
        env = restored(os.environ, args.launch_env) if args.launch_env is not None else None
    except ValueError as error:
        print(f"feedbench: error: job: {error}", file=sys.stderr)
        return 2
    return run_job(args.out, args.cell, args.runtime, args.log, env)


def _preflight(args) -> int:
    if not args.here:
        from .core.preflight import run as run_preflight

        return run_preflight(args.cells, args.out, args.log, args.attempt, args.after)
    from .harness.preflight import run as check

    return check(json.loads(args.cells), args.out, args.log, args.attempt)


def _make_images(args) -> int:
    from .harness.images import make_images

    try:
        n = make_images(args.dir, args.count, args.size, args.classes, args.seed)
    except ValueError as error:
        print(f"feedbench: error: make-images: {error}", file=sys.stderr)
        return 2
    print(f"wrote {n} JPEG files under {args.dir}/train")
    return 0


def _make_shards(args) -> int:
    from .harness.shards import make_shards

    try:
        for count in args.shards:
            print(f"wrote {make_shards(args.images, args.dir, count)}")
    except (OSError, ValueError) as error:
        print(f"feedbench: error: make-shards: {error}", file=sys.stderr)
        return 2
    return 0


def _cpu_speed(args) -> int:
    from .core.cpu_speed import REPEATS
    from .harness.cpu_speed import summary, write_measurement

    repeats = REPEATS if args.repeats is None else args.repeats
    if repeats < 1:
        print(
            f"feedbench: error: cpu-speed: --repeats {repeats} is not allowed; allowed: 1 or more",
            file=sys.stderr,
        )
        return 2
    try:
        record = write_measurement(args.out, repeats)
    except (OSError, RuntimeError, ValueError) as error:
        print(f"feedbench: error: cpu-speed: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    print(summary(args.out, record))
    return 0


def _run(args) -> int:
    try:
        raw = _load_cell(args.cell, args.set)
    except (OSError, ValueError, yaml.YAMLError) as error:
        print(f"feedbench: error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.time_limit is not None and args.time_limit <= 0:
        print(
            f"feedbench: error: --time-limit: value {args.time_limit:g} is not allowed; allowed: "
            "seconds > 0",
            file=sys.stderr,
        )
        return 2
    return run_or_launch(raw, args.out, args.as_rank, args.time_limit, args.stop_at)


COMMANDS = {
    "run": _run,
    "job": _job,
    "preflight": _preflight,
    "make-images": _make_images,
    "make-shards": _make_shards,
    "record-failure": _record_failure,
    "knobs": _knobs,
    "metrics": _metrics,
    "cpu-speed": _cpu_speed,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command](args)


def run_or_launch(
    raw: dict,
    out_dir: str,
    as_rank: bool = False,
    time_limit: float | None = None,
    stop_at: float | None = None,
) -> int:
    """One process for most cells; a launcher of torchrun ranks for multi-process ones."""
    import torch

    from .core.cell import parse_cell
    from .core.knobs import KnobError
    from .core.resources import ranks
    from .harness.distributed import world_from_env
    from .harness.fit import resolve
    from .harness.launch import launch
    from .harness.runner import run

    # counted after the imports, which take seconds on a busy node; at least 1 s
    if stop_at is not None:
        time_limit = max(round(stop_at - time.time()), 1)
    if as_rank:
        return run(raw, out_dir, world_from_env())
    try:
        cell, notes = resolve(parse_cell(raw), torch.cuda.is_available())
    except KnobError:
        return run(raw, out_dir)  # writes the failed result and prints the one line
    if ranks(cell) > 1 and not cell.command:  # a command's ranks are torchrun's (harness.command)
        return launch(raw, cell, notes, out_dir, time_limit)
    return run(raw, out_dir, time_limit=time_limit, fitted=(cell, notes))


if __name__ == "__main__":
    sys.exit(main())
