"""The GPU check (#35, #50): the first command on a GPU lent for a few minutes, at most 8 minutes on
one H100 or H200, start-up included. Run it through benchmarks/gpu_check.sh, which names the GPU
test files:

    bash benchmarks/gpu_check.sh [OUT]               # OUT: default gpu-check/<UTC date and time>
    GPU_CHECK_BUDGET_S=300 bash benchmarks/gpu_check.sh OUT
    python benchmarks/gpu_check.py --conclude OUT    # the findings' lines again, from cells.jsonl

The most important first, each part with a budget, printed as it starts:

    1  the GPU tests, each with a time limit
    2  N1 to N3 (#35) and N7, N9 (#50) in fresh-process cells; torchvision-cuda's pixels against
       the CPU decoder's and pytorch/vision#9606's reproduction (N8), each a row
    3  the two open findings told apart: arms in fresh processes, in alternating rounds, with
       per-phase columns, persistent workers and windows that resolve 2 %; a line for each finding
       saying which explanation its figures support
    4  the calibration on the GPU, only with the time left

Every finished part is kept: each row is appended to OUT/gpu-check.md the moment it is measured,
each cell's result.json summarised in one line of OUT/cells.jsonl; a timeout or a crash loses only
the cell under way. OUT holds at most 8 files: gpu-check.md (the table for
docs/results/gpu-validation.md), summary.txt (a line per part), cells.jsonl and the logs
(pytest-gpu.log, cells.log, calibration.log); the cells' own folders are temporary.

Without CUDA it runs dry and says so: the GPU tests skip with their reasons, the cells that can run
on the CPU run there at 2 steps (the plumbing, not a figure), the others are rows saying they need
CUDA, and the calibration is skipped. What it needs beyond PyTorch: gpu_check_requirements.txt.
"""  # noqa: E501

from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)

ROOT = _checkout.ROOT
REQUIREMENTS = os.path.join(ROOT, "benchmarks", "gpu_check_requirements.txt")
BUDGET_S = 480
# the most of the whole budget parts 1 and 2 may take; part 3 takes what is left, part 4 the rest
SHARES = {1: 0.31, 2: 0.19}
TEST_LIMIT_S = 60  # one GPU test
CELL_LIMIT_S = 60  # one cell; a hung cell is a failed row and the check goes on
# the calibration's repeats by the seconds left for it (54 runs took 113-120 s on an H200)
CALIBRATION = ((140, 3), (60, 1))
RESOLVE = 0.02  # what the findings' arms must resolve

JPEG = dict(
    dataset="images", model="resnet18", image_size=64, num_classes=10, batch_size=32, steps=20
)
DEVICE_STAGES = dict(
    dataset="gpu_check_stages:build", model="resnet18", num_classes=10, batch_size=32, steps=20
)
ODD = dict(  # 3000-sample batches of 3000 float32: not powers of two
    model="mlp", dataset="memory", input_size=3000, width=512, batch_size=3000, num_samples=24000,
    steps=20, pin_memory=True,
)  # fmt: skip
HOST_AHEAD = dict(  # a GPU that spins 20 ms a step, copies queued non_blocking behind it
    model="sleep", compute_ms=20, dataset="memory", image_size=32, batch_size=250,
    num_samples=8000, steps=20, pin_memory=True, non_blocking=True, timing="events",
)  # fmt: skip
TWO_WORKERS = dict(num_workers=2, persistent_workers=True)
CELLS = itertools.count()  # each cell's own folder in the scratch folder

# part 2: (check, arm, needs CUDA, knobs), the most telling first
CHECKS = [
    ("N1 N2 decode", "torchvision-cuda, pageable", True, dict(JPEG, decoder="torchvision-cuda")),
    ("N1 N2 decode", "torchvision-cuda, pin_memory", True,
     dict(JPEG, decoder="torchvision-cuda", pin_memory=True)),
    ("N1 N7 device", "all stages in the loader", False, DEVICE_STAGES),
    ("N1 N7 device", "ColorJitter on the device", False,
     dict(DEVICE_STAGES, device_stages="ColorJitter")),
    ("N3 N9 pinned", "0 workers", False, ODD),
    ("N3 N9 pinned", "2 workers", False, dict(ODD, **TWO_WORKERS)),
    ("N3 N9 pinned", "2 workers, stream prefetch", False,
     dict(ODD, **TWO_WORKERS, device_prefetch="stream")),
    ("N3 N9 pinned", "host ahead: non_blocking, events", False, HOST_AHEAD),
    ("N1 reference", "torchvision (CPU decode), pin_memory, 2 workers", False,
     dict(JPEG, decoder="torchvision", pin_memory=True, **TWO_WORKERS)),
]  # fmt: skip

# part 3: the two findings the 2026-11-26 run left open, each with the arms that tell its
# explanations apart (#35): windows of about 2-4 s on an H200, 2 workers kept across epochs
RESNET = dict(
    model="resnet18", dataset="memory", image_size=64, num_classes=100, batch_size=64,
    num_samples=1024, steps=200, warmup_steps=20,
)  # fmt: skip
MLP = dict(
    model="mlp", dataset="memory", input_size=4096, width=4096, hidden_layers=4, batch_size=4096,
    num_samples=32768, steps=30, warmup_steps=5, pin_memory=True, non_blocking=True,
)  # fmt: skip
FINDINGS = {
    "events": (
        "events 7 % slower than sync (ResNet-18, 64 px, batch 64)",
        {
            "naive (no instrument)": dict(RESNET, timing="naive"),
            "events": dict(RESNET, timing="events"),
            "sync": dict(RESNET, timing="sync"),
            "events, pinned non-blocking": dict(
                RESNET, timing="events", pin_memory=True, non_blocking=True
            ),
            "events, 2 workers": dict(RESNET, timing="events", **TWO_WORKERS),
        },
    ),
    "prefetch": (
        "stream prefetch 4-6 % slower than none (4096-wide MLP, 64 MB batches)",
        {
            "none, 0 workers": dict(MLP, device_prefetch="none"),
            "stream, 0 workers": dict(MLP, device_prefetch="stream"),
            "none, 2 workers": dict(MLP, device_prefetch="none", **TWO_WORKERS),
            "stream, 2 workers": dict(MLP, device_prefetch="stream", **TWO_WORKERS),
        },
    ),
}
ROUNDS = 2
# the plumbing only, on a CPU: small cells
DRY = dict(
    steps=2, warmup_steps=1, batch_size=8, num_samples=64, image_size=32, input_size=64, width=64
)

# A user dataset of uint8 images whose torchvision v2 pipeline device_stages can move (written to
# the scratch folder the cells import it from).
STAGES_MODULE = textwrap.dedent(
    """
    import torch
    from torch.utils.data import Dataset
    from torchvision.transforms import v2


    class Images(Dataset):
        def __init__(self, n=2048, size=96):
            self.n, self.size = n, size
            self.transform = v2.Compose(
                [v2.RandomResizedCrop(64), v2.ColorJitter(0.4, 0.4, 0.4), v2.ToDtype(torch.float32, scale=True)]
            )

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            image = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)
            return self.transform(image), i % 10


    def build(**kwargs):
        return Images(**kwargs)
    """  # noqa: E501
)

PART2_HEADER = (
    "| check | arm | samples/s | stall % | GPU idle % | device_prep % | h2d GB/s | "
    "copied bytes/step | pinned: count | pinned: held | note |\n" + "|---" * 11 + "|"
)
PHASES = ("wait", "h2d", "fwd", "bwd", "opt", "device_prep", "gpu_idle")
PART3_HEADER = (
    "| finding | arm | round | samples/s | step ms (± %) | "
    + " | ".join(f"{p} ms" for p in PHASES)
    + " | stall % | note |\n"
    + "|---" * (7 + len(PHASES))
    + "|"
)


class Check:
    """The output folder, the clock against the budget, and what each part says as it goes."""

    def __init__(self, out: str, budget: float):
        self.out, self.budget, self.start = out, budget, time.monotonic()
        os.makedirs(out, exist_ok=True)

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def say(self, line: str) -> None:
        """A line of the run: on stdout and in summary.txt."""
        print(line, flush=True)
        self.append("summary.txt", line)

    def table(self, text: str) -> None:
        self.append("gpu-check.md", text)

    def append(self, name: str, text: str) -> None:
        with open(self.path(name), "a") as f:
            f.write(text.rstrip("\n") + "\n")

    def part(self, number: int, title: str, budget: float) -> float:
        """Start a part: its budget, printed and in the table; the seconds it may take."""
        budget = max(0.0, min(budget, self.left()))
        self.say(
            f"gpu_check: part {number}, {title}: budget {budget:.0f} s of {self.left():.0f} left"
        )
        self.table(f"\n#### {number}. {title} (budget {budget:.0f} s)\n")
        return budget


def limited(command: list[str], seconds: float, log: str, **kwargs) -> tuple[int | None, float]:
    """Run `command`, its output appended to `log`, for at most `seconds`, then kill it and every
    process under it; (exit code, None when killed at the limit; seconds). The child stays in this
    process's group: whatever stops the check stops it too."""
    start = time.monotonic()
    with open(log, "a") as f:
        f.write(f"$ {' '.join(command)}\n")
        f.flush()
        proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, **kwargs)
        try:
            code = proc.wait(timeout=max(1.0, seconds))
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            code = None
    return code, time.monotonic() - start


def kill_tree(proc: subprocess.Popen) -> None:
    """The child and every process under it (a cell's loader workers, a test's own processes)
    killed; the child alone where psutil is missing."""
    try:
        import psutil

        family = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # psutil missing, or the child just ended
        family = []
    proc.kill()
    for process in family:
        try:
            process.kill()
        except Exception:  # ended meanwhile
            pass
    proc.wait()


def child_env(*paths: str) -> dict:
    """This checkout's workflow/ and tests/ (and `paths`) first on the path of a child, before the
    path it was given (a rehearsal's hidden modules stay hidden)."""
    given = os.environ.get("PYTHONPATH")
    first = [os.path.join(ROOT, "workflow"), os.path.join(ROOT, "tests"), *paths]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(first + ([given] if given else [])))


def needs() -> list[str]:
    """One line for each package of gpu_check_requirements.txt this Python cannot import."""
    missing = []
    with open(REQUIREMENTS) as f:
        for line in f:
            package, _, note = line.partition("#")
            if not package.strip():
                continue
            module, _, what = note.partition(":")
            if importlib.util.find_spec(module.strip()) is None:
                missing.append(
                    f"missing {package.strip()} (import {module.strip()}), needed by{what.rstrip()}"
                )
    return missing


def facts() -> None:
    """Child: this machine's CUDA, device and versions as one JSON line."""
    import platform

    import torch

    cuda = torch.cuda.is_available()
    found = {
        "cuda": cuda,
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python": platform.python_version(),
    }
    try:
        import torchvision

        found["torchvision"] = torchvision.__version__
    except ImportError:
        found["torchvision"] = None
    print(json.dumps(found))


def commit() -> str:
    """The checkout's commit, `-dirty` with changes: the table says what it measured."""
    try:
        done = subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True
        )
    except OSError:  # no git on the machine
        return "unknown (no git)"
    return done.stdout.strip() if done.returncode == 0 else "unknown (no git checkout)"


def start(check: Check) -> dict | None:
    """The table's heading from the machine's facts (a child, so this process holds no CUDA
    context), and what is missing; None where torch cannot even start."""
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--facts"],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(),
        )
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, IndexError, ValueError):
        done, found = None, None
    if found is None:
        check.append("cells.log", done.stderr if done is not None else "the facts timed out")
        check.say("gpu_check: torch did not start (cells.log says why): nothing was checked")
        return None
    name = found["device"] or "no CUDA: dry run on the CPU, 2 steps a cell, no figure"
    now = datetime.datetime.now(datetime.timezone.utc)
    check.table(
        f"### GPU check, {now:%Y-%m-%d %H:%M} UTC: {name}\n\ncommit {commit()}; torch "
        f"{found['torch']} (CUDA {found['cuda_version']}), torchvision {found['torchvision']}, "
        f"Python {found['python']}; budget {check.budget:.0f} s"
    )
    for line in needs():
        check.say(f"gpu_check: {line}")
    return found


def guarded(check: Check, number: int, part, *args) -> None:
    """A part that crashes says so in one line (its traceback in cells.log); the next part runs and
    every row already written stays."""
    try:
        part(check, *args)
    except Exception as error:  # the check goes on whatever broke
        import traceback

        check.append("cells.log", traceback.format_exc())
        check.say(f"gpu_check: part {number} crashed: {type(error).__name__}: {error} (cells.log)")


OUTCOME = re.compile(r"^(tests/\S+) (PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)\b", re.M)


def gpu_tests(check: Check, files: list[str]) -> None:
    """Part 1: pytest -m gpu over the files gpu_check.sh names, each test with a time limit
    (tests/helpers/time_limit.py); a file that cannot be collected loses only its own tests."""
    title = f"the GPU tests of {len(files)} files, each at most {TEST_LIMIT_S} s"
    budget = check.part(1, title, SHARES[1] * check.budget)
    log = check.path("pytest-gpu.log")
    command = [
        sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rfEs", "-p", "no:cacheprovider",
        "-p", "helpers.time_limit", "--each-test-s", str(TEST_LIMIT_S),
        "--continue-on-collection-errors", *files,
    ]  # fmt: skip
    code, took = limited(command, budget, log, env=child_env(), cwd=ROOT)
    with open(log) as f:
        text = f.read()
    counts: dict[str, int] = {}
    for _test, outcome in OUTCOME.findall(text):
        counts[outcome.lower()] = counts.get(outcome.lower(), 0) + 1
    ended = "cut at its budget" if code is None else f"exit {code}"
    found = ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) or "no test ran"
    check.say(f"gpu_check: part 1: pytest -m gpu {ended} in {took:.0f} s: {found}")
    check.table(f"pytest -m gpu {ended} in {took:.0f} s: {found} (pytest-gpu.log)")
    for line in text.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            check.table(f"* {line[:300]}")


def make_images(check: Check, folder: str, cuda: bool, seconds: float) -> None:
    count, size = ("1024", "80") if cuda else ("64", "40")
    command = [sys.executable, "-m", "feedbench", "make-images", folder, "--count", count]
    limited([*command, "--size", size], seconds, check.path("cells.log"), env=child_env())


def cell(check: Check, where: dict, knobs: dict, cuda: bool, scratch: str, seconds: float) -> dict:
    """One cell as `python -m feedbench run` in a fresh process, for at most `seconds` (the harness
    stops itself a little before and writes what it measured); its result summarised in one line
    of cells.jsonl, and returned."""
    knobs = dict(knobs, device="cuda" if cuda else "cpu", torch_threads=1)
    knobs.setdefault("warmup_steps", 5)
    if not cuda:
        knobs.update(DRY)
    if knobs["dataset"] == "images":
        knobs["data_dir"] = os.path.join(scratch, "images")
    out = os.path.join(scratch, f"cell{next(CELLS)}")
    hard = min(CELL_LIMIT_S, seconds)
    command = [sys.executable, "-m", "feedbench", "run", "--out", out]
    command += ["--time-limit", f"{max(2.0, hard - max(3.0, 0.15 * hard)):.0f}"]
    for knob, value in knobs.items():
        command += ["--set", f"{knob}={json.dumps(value)}"]
    code, took = limited(command, hard, check.path("cells.log"), env=child_env(scratch), cwd=ROOT)
    try:
        with open(os.path.join(out, "result.json")) as f:
            result = json.load(f)
    except (OSError, ValueError):
        why = "killed at its time limit" if code is None else f"exit {code}, no result.json"
        result = {"status": "failed", "error": {"message": f"{why} (cells.log)"}}
    summary = summarize(where, result, took)
    check.append("cells.jsonl", json.dumps(summary))
    return summary


def summarize(where: dict, result: dict, seconds: float) -> dict:
    """A cell's result.json in one line: what the check's rows and findings read."""
    metrics = result.get("metrics") or {}
    phases, step = metrics.get("phases") or {}, metrics.get("step_ms") or {}
    steps = metrics.get("steps") or 0
    shm = result.get("shm") or {}
    resolution = (
        100 * step["std"] / step["mean"] / math.sqrt(steps)
        if steps > 1 and step.get("mean") and step.get("std") is not None
        else None
    )
    return {
        **where,
        "status": result.get("status", "failed"),
        "error": (result.get("error") or {}).get("message"),
        "seconds": round(seconds, 1),
        "timing": (result.get("timing") or {}).get("effective"),
        "samples_per_s": metrics.get("samples_per_s"),
        "steps": steps,
        "step_ms": step.get("median"),
        "resolution_pct": resolution,
        "phases_ms": {name: p.get("median_ms") for name, p in phases.items()},
        "shares_pct": {
            name: 100 * p["share"] for name, p in phases.items() if p.get("share") is not None
        },
        "stall_pct": metrics.get("stall_pct"),
        "h2d_gb_per_s": metrics.get("h2d_gb_per_s"),
        "copied_per_step": metrics["h2d_bytes"] / steps if metrics.get("h2d_bytes") else None,
        "pinned_bytes": shm.get("pinned_bytes"),
        "pinned_held_bytes": shm.get("pinned_held_bytes"),
        "notes": result.get("adjustments") or [],
    }


def fmt(value, digits: str = ".3g") -> str:
    return "-" if value is None else format(value, digits)


def note(summary: dict, cuda: bool) -> str:
    if summary["status"] != "ok":
        return f"failed: {str(summary['error'])[:160]}"
    said = ["dry (CPU)"] if not cuda else []
    said += ["unpinned note"] if any("unpinned" in n for n in summary["notes"]) else []
    return "; ".join(said)


def part2_row(s: dict, cuda: bool) -> str:
    shares = s["shares_pct"]
    return (
        f"| {s['check']} | {s['arm']} | {fmt(s['samples_per_s'], '.0f')} | {fmt(s['stall_pct'])} "
        f"| {fmt(shares.get('gpu_idle'))} | {fmt(shares.get('device_prep'))} "
        f"| {fmt(s['h2d_gb_per_s'])} | {fmt(s['copied_per_step'], '.0f')} "
        f"| {fmt(s['pinned_bytes'], 'd')} | {fmt(s['pinned_held_bytes'], 'd')} | {note(s, cuda)} |"
    )


def part3_row(s: dict, cuda: bool) -> str:
    phases = " | ".join(fmt(s["phases_ms"].get(p)) for p in PHASES)
    step = f"{fmt(s['step_ms'])} (± {fmt(s['resolution_pct'], '.2f')})"
    return (
        f"| {s['finding']} | {s['arm']} | {s['round']} | {fmt(s['samples_per_s'], '.0f')} "
        f"| {step} | {phases} | {fmt(s['stall_pct'])} | {note(s, cuda)} |"
    )


def pixels(folder: str) -> None:
    """Child, on a GPU: torchvision-cuda's decode of 8 of the check's JPEGs against the CPU
    decoder's, and vision#9606's reproduction both ways (tests/helpers/cuda_decode.py), as one JSON
    line."""
    from helpers import cuda_decode

    raws, cpu = cuda_decode.jpegs(folder, count=8)
    decode = cuda_decode.decoders(folder)
    ordered, images = cuda_decode.corrupted_runs(decode["ordered"], raws)
    straight, _ = cuda_decode.corrupted_runs(decode["straight"], raws)
    apart = cuda_decode.levels_apart(images, cpu)
    between = cuda_decode.levels_apart(cpu[1:], cpu[:-1])
    print(
        json.dumps(
            {
                "images": len(raws),
                "mean": statistics.fmean(apart),
                "worst": max(apart),
                "between": statistics.fmean(between),
                "runs": 20,
                "straight": straight,
                "ordered": ordered,
            }
        )
    )


def pixel_rows(check: Check, cuda: bool, folder: str, seconds: float) -> None:
    """Part 2's first two rows: the pixels, and N8's race (a child on the GPU)."""
    names = (
        ("pixels", "torchvision-cuda against the CPU decoder"),
        ("N8 vision#9606", "tensors freed with reads queued, then the decode"),
    )
    if not cuda:
        for check_name, arm in names:
            check.table(f"| {check_name} | {arm} |" + " |" * 8 + " skipped: needs CUDA |")
        return
    log = check.path("cells.log")
    code, _ = limited([sys.executable, __file__, "--pixels", folder], seconds, log, env=child_env())
    with open(log) as f:
        lines = [line for line in f if line.startswith('{"images"')]
    if code != 0 or not lines:
        why = "cut at the part's budget" if code is None else f"failed (exit {code}, cells.log)"
        for check_name, arm in names:
            check.table(f"| {check_name} | {arm} |" + " |" * 8 + f" {why} |")
        return
    found = json.loads(lines[-1])
    check.append("cells.jsonl", json.dumps({"part": 2, "check": "pixels", **found}))
    blank = " |" * 8
    check.table(
        f"| {names[0][0]} | {names[0][1]}, {found['images']} images |{blank} mean "
        f"{found['mean']:.2f}, worst {found['worst']:.2f} levels of 255 apart (two different "
        f"images: {found['between']:.0f}) |"
    )
    check.table(
        f"| {names[1][0]} | {names[1][1]}, {found['runs']} runs each way |{blank} corrupted: "
        f"decode_jpeg on the caller's stream {found['straight']}/{found['runs']}, DeviceDecoded "
        f"{found['ordered']}/{found['runs']} |"
    )


def n_checks(check: Check, cuda: bool, scratch: str) -> None:
    """Part 2: N1 to N3, N7 to N9 and the pixels, the most telling first."""
    budget = check.part(
        2, "N1-N3, N7-N9 and the pixels, a fresh process a cell", SHARES[2] * check.budget
    )
    deadline = time.monotonic() + budget
    images = os.path.join(scratch, "images")
    make_images(check, images, cuda, budget)
    check.table(PART2_HEADER)
    pixel_rows(check, cuda, images, deadline - time.monotonic())
    skipped = []
    for check_name, arm, needs_cuda, knobs in CHECKS:
        left = deadline - time.monotonic()
        if needs_cuda and not cuda:
            check.table(f"| {check_name} | {arm} |" + " |" * 8 + " skipped: needs CUDA |")
        elif left < 5:
            skipped.append(arm)
        else:
            where = {"part": 2, "check": check_name, "arm": arm}
            check.table(part2_row(cell(check, where, knobs, cuda, scratch, left), cuda))
    ended(check, 2, skipped)


def ended(check: Check, number: int, skipped: list[str]) -> None:
    if skipped:
        check.say(f"gpu_check: part {number} cut at its budget: not run: {'; '.join(skipped)}")
        check.table(f"\nCut at its budget, not run: {'; '.join(skipped)}.")
    else:
        check.say(f"gpu_check: part {number} done, {check.left():.0f} s of the budget left")


def findings(check: Check, cuda: bool, scratch: str) -> None:
    """Part 3: the arms of the two open findings, in alternating rounds (drift falls on every arm),
    then a line for each finding."""
    rounds = ROUNDS if cuda else 1
    title = f"the two open findings, {rounds} alternating round(s), a fresh process an arm"
    deadline = time.monotonic() + check.part(3, title, check.left() - 5)
    check.table(PART3_HEADER)
    summaries, skipped = [], []
    for k in range(rounds):
        for finding, (_title, arms) in FINDINGS.items():
            for arm in list(arms) if k % 2 == 0 else list(reversed(arms)):
                left = deadline - time.monotonic()
                if left < 5:
                    skipped.append(f"{arm} (round {k + 1})")
                    continue
                where = {"part": 3, "finding": finding, "arm": arm, "round": k + 1}
                summaries.append(cell(check, where, arms[arm], cuda, scratch, left))
                check.table(part3_row(summaries[-1], cuda))
    ended(check, 3, skipped)
    for line in conclusions(summaries, dry=not cuda):
        check.table(line)


class Arms:
    """The finished cells of one finding, by arm: medians over the rounds and their spread."""

    def __init__(self, summaries: list[dict], finding: str):
        self.cells: dict[str, list[dict]] = {}
        for s in summaries:
            if s.get("finding") == finding and s["status"] == "ok" and s["samples_per_s"]:
                self.cells.setdefault(s["arm"], []).append(s)

    def rate(self, arm: str) -> float | None:
        cells = self.cells.get(arm)
        return statistics.median(c["samples_per_s"] for c in cells) if cells else None

    def ratio(self, arm: str, against: str) -> float | None:
        """arm's samples/s over against's, less 1: -0.05 is 5 % slower."""
        a, b = self.rate(arm), self.rate(against)
        return a / b - 1 if a and b else None

    def phase(self, arm: str, *names: str) -> float | None:
        """The median over the rounds of the sum of these phases' medians, in ms."""
        sums = [sum(c["phases_ms"].get(n) or 0.0 for n in names) for c in self.cells.get(arm, [])]
        return statistics.median(sums) if sums else None

    def spread(self, *arms: str) -> float:
        """The largest spread of one arm's rounds, over its median: what a gap must exceed."""
        spreads = [
            (max(r) - min(r)) / statistics.median(r)
            for arm in arms
            if len(r := [c["samples_per_s"] for c in self.cells.get(arm, [])]) > 1
        ]
        return max(spreads, default=0.0)

    def figures(self) -> str:
        return ", ".join(f"{arm} {self.rate(arm):.0f}" for arm in self.cells)


def pct(ratio: float) -> str:
    return f"{100 * ratio:+.1f} %"


def explain_events(arms: Arms) -> str:
    """Finding 1: events slower than sync. Told apart: the in-process order (fresh processes taken
    in turn), the events' own host cost (against naive, no instrument), the pageable blocking copy
    (pinned, non-blocking), the loader at 0 workers (2 persistent workers)."""
    gap = arms.ratio("events", "sync")
    if gap is None:
        return "not measured: events or sync has no finished cell"
    if abs(gap) < RESOLVE:
        return (
            f"events {pct(gap)} against sync, within 2 %: in fresh processes taken in turn the "
            "7 % is gone, an artefact of the in-process runs (the cell order, the collector)"
        )
    if gap > 0:
        return f"events {pct(gap)} against sync: faster, the 7 % reversed"
    cost = arms.ratio("events", "naive (no instrument)")
    copy = arms.ratio("events, pinned non-blocking", "sync")
    loader = arms.ratio("events, 2 workers", "sync")
    if cost is not None and cost < -RESOLVE:
        return f"the events' own host cost: events {pct(cost)} against naive, no instrument"
    if copy is not None and abs(copy) < RESOLVE:
        return f"the pageable blocking copy: pinned and non-blocking, events is {pct(copy)}"
    if loader is not None and abs(loader) < RESOLVE:
        return f"the loader at 0 workers: with 2 persistent workers, events is {pct(loader)}"
    return (
        f"none of the arms explains it: events {pct(gap)} against sync, as fast as naive, and "
        "neither the pinned copy nor 2 workers closes the gap; the phase columns say where it lies"
    )


def explain_prefetch(arms: Arms) -> str:
    """Finding 2: stream prefetch slower than none. Told apart: the in-process order (fresh
    processes taken in turn), a host-bound loader at 0 workers (2 workers), the copy competing with
    compute (fwd+bwd+opt longer under stream), a longer wait for the batch (wait+h2d)."""
    gaps = {w: arms.ratio(f"stream, {w} workers", f"none, {w} workers") for w in (0, 2)}
    if all(gap is None for gap in gaps.values()):
        return "not measured: no worker count has both a stream and a none cell finished"
    found = ", ".join(f"{pct(gap)} at {w} workers" for w, gap in gaps.items() if gap is not None)
    if all(gap >= -RESOLVE for gap in gaps.values() if gap is not None):
        return (
            f"stream against none: {found}, none slower beyond 2 %: in fresh processes taken "
            "in turn the 4-6 % is gone, an artefact of the in-process runs"
        )
    if gaps[2] is not None and gaps[2] >= -RESOLVE:
        return f"the host-bound loader at 0 workers: stream against none {found}"
    w = 2 if gaps[2] is not None else 0
    stream, none = f"stream, {w} workers", f"none, {w} workers"
    compute = [arms.phase(arm, "fwd", "bwd", "opt") for arm in (stream, none)]
    wait = [arms.phase(arm, "wait", "h2d") for arm in (stream, none)]
    step = arms.phase(none, *PHASES) or 0.0
    if None not in compute and compute[1] and compute[0] / compute[1] - 1 >= RESOLVE:
        longer = pct(compute[0] / compute[1] - 1)
        return (
            f"the side-stream copy slows the compute: fwd+bwd+opt {longer} under stream ({found})"
        )
    if None not in wait and wait[0] - wait[1] >= RESOLVE * step:
        return (
            f"the step waits longer for its batch under stream (wait+h2d {wait[0] - wait[1]:+.1f} "
            f"ms): record_stream holding its blocks, or the prefetcher's host cost ({found})"
        )
    return f"neither the compute nor the wait explains it ({found}); see the phase columns"


EXPLAIN = {"events": explain_events, "prefetch": explain_prefetch}


def conclusions(summaries: list[dict], dry: bool) -> list[str]:
    """A line for each finding: which explanation its figures support, and whether the rounds
    resolve it."""
    lines = []
    for finding, (title, arms_of) in FINDINGS.items():
        arms = Arms(summaries, finding)
        spread = arms.spread(*arms_of)
        said = EXPLAIN[finding](arms)
        if spread > RESOLVE:
            said = f"not resolved, the rounds of one arm spread {100 * spread:.1f} %: {said}"
        if dry:
            said = f"dry run, figures of no meaning: {said}"
        lines.append(f"\n**{title}**: {said} (median samples/s: {arms.figures() or 'none'})")
    return lines


def calibration(check: Check, cuda: bool) -> None:
    """Part 4: the calibration on the GPU (benchmarks/calibration_error.py), with what is left."""
    left = check.left()
    repeats = next((r for need, r in CALIBRATION if left >= need), None)
    if not cuda or repeats is None:
        why = "no CUDA" if not cuda else f"{left:.0f} s left, under {CALIBRATION[-1][0]}"
        check.say(f"gpu_check: part 4, the calibration: skipped: {why}")
        check.table(f"\n#### 4. The calibration\n\nSkipped: {why}.")
        return
    check.part(4, f"the calibration on the GPU, {repeats} repeat(s) of its cells", left)
    log = check.path("calibration.log")
    script = os.path.join(ROOT, "benchmarks", "calibration_error.py")
    command = [sys.executable, script, "--device", "cuda", "--repeats", str(repeats)]
    code, took = limited(command, left, log, env=child_env(), cwd=ROOT)
    with open(log) as f:
        last = (f.read().strip().splitlines() or [""])[-1]
    ended_as = "cut at its budget" if code is None else f"exit {code}"
    check.say(f"gpu_check: part 4: calibration {ended_as} in {took:.0f} s: {last}")
    check.table(f"calibration {ended_as} in {took:.0f} s: {last} (calibration.log)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the check's folder (gpu_check.sh gives it)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole")
    parser.add_argument("--gpu-tests", nargs="*", default=[], help="the files of the GPU tests")
    parser.add_argument(
        "--conclude", metavar="OUT", help="the findings' lines from OUT/cells.jsonl"
    )
    parser.add_argument("--facts", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pixels", metavar="FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.facts:
        facts()
    elif args.pixels:
        pixels(args.pixels)
    elif args.conclude:
        with open(os.path.join(args.conclude, "cells.jsonl")) as f:
            summaries = [json.loads(line) for line in f if line.strip()]
        print("\n".join(conclusions(summaries, dry=False)))
    else:
        return check_all(args.out, args.budget, args.gpu_tests)
    return 0


def check_all(out: str, budget: float, tests: list[str]) -> int:
    check = Check(out, budget)
    found = start(check)
    if found is None:
        return 1
    cuda = found["cuda"]
    guarded(check, 1, gpu_tests, tests)
    scratch = tempfile.mkdtemp(prefix="gpu-check-")
    try:
        with open(os.path.join(scratch, "gpu_check_stages.py"), "w") as f:
            f.write(STAGES_MODULE)
        guarded(check, 2, n_checks, cuda, scratch)
        guarded(check, 3, findings, cuda, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    guarded(check, 4, calibration, cuda)
    took = time.monotonic() - check.start
    check.say(f"gpu_check: {check.path('gpu-check.md')} ({took:.0f} s of {budget:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
