"""A command cell's instrument in the user's own loop, against the same command run plain.

The command is an example's train.py (examples/plain-loop by default) at the user's own settings,
`--workers W` in its own arguments, so the cell sets no knob: the only difference between the two
runs is the instrument (the bootstrap, the patched DataLoader, the step's marks, the window's
figures). Each round runs both, plain first, each to its own end, with the harness's own code
(harness.command.run_once: "plain" and "whole", as a baseline's fidelity pair runs), at 0 and 2
workers, rounds interleaved so a shared machine's drift hits both. Two figures per pair:

* whole: the instrumented run's wall time over the plain one's (what the report's Fidelity line
  says, start-up included);
* loop: the plain run's own printed samples/s over the instrumented one's (the script measures its
  steady steps itself: the instrument's cost per step, start-up left out).

Medians over the rounds; 1.00 is no cost, 1.02 is 2 % slower.

    .venv/bin/python benchmarks/command_overhead.py [--rounds 5] [--steps 60] [--example lightning]
        [--workers 0 2]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
from feedbench.core.cell import parse_cell
from feedbench.harness.command import run_once

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
OWN_RATE = re.compile(r"train: ([\d.]+) samples/s")


def own_rate(log: str) -> float | None:
    """The samples/s the script printed of its own steady steps."""
    with open(log, encoding="utf-8") as f:
        found = OWN_RATE.findall(f.read())
    return float(found[-1]) if found else None


def pair(example: str, workers: int, steps: int, out: str) -> dict:
    """One plain and one instrumented run of the example's command, both whole."""
    workdir = os.path.abspath(os.path.join(EXAMPLES, example))
    raw = {
        "command": f"train.py --max-steps {steps} --workers {workers}",
        "workdir": workdir,
        "torch_threads": 1,
        "warmup_steps": 5,
        "steps": max(steps - 5, 1),
    }
    cell = parse_cell(raw)
    runs = {}
    for mode in ("plain", "whole"):
        log = os.path.join(out, f"{mode}.log")
        runs[mode] = run_once(cell, raw, out, mode, log)
        runs[mode].rate = own_rate(log)
    plain, whole = runs["plain"], runs["whole"]
    for run in (plain, whole):
        if run.exit_code:
            raise SystemExit(
                f"{example}, {run.mode}: exit code {run.exit_code}: {run.last_lines()}"
            )
    return {
        "whole": whole.wall_s / plain.wall_s,
        "loop": plain.rate / whole.rate if plain.rate and whole.rate else None,
        "plain_s": plain.wall_s,
        "rate": plain.rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help="the command's own --max-steps")
    parser.add_argument("--example", default="plain-loop")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    found: dict[int, list[dict]] = {workers: [] for workers in args.workers}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(args.rounds):
            for workers in found:
                found[workers].append(pair(args.example, workers, args.steps, out))
    print(f"{args.example}, --max-steps {args.steps}, {args.rounds} rounds (medians)")
    print("workers  plain s  its samples/s  whole (inst/plain time)  loop (plain/inst samples/s)")
    for workers, pairs in found.items():
        loops = [p["loop"] for p in pairs if p["loop"]]
        print(
            f"{workers:>7}  {statistics.median(p['plain_s'] for p in pairs):7.2f}  "
            f"{statistics.median(p['rate'] or 0 for p in pairs):13.1f}  "
            f"{statistics.median(p['whole'] for p in pairs):23.3f}  "
            f"{statistics.median(loops) if loops else float('nan'):27.3f}"
        )


if __name__ == "__main__":
    main()
