"""The GPU check's cells: each in a fresh process, arms in alternating order, one dated markdown
table.

    PYTHONPATH=workflow .venv/bin/python benchmarks/gpu_check.py --out DIR [--rounds 2] [--only GROUP ...]

Run by benchmarks/gpu_check.sh after `pytest -m gpu`. The groups tell apart what one GPU run left
open and check the GPU paths a CPU cannot (docs/results/gpu-validation.md):

    events      finding 1: is `timing: events` slower than `sync`? against `naive` (no instrument),
                and with the copy pinned and non-blocking, and with a loader that keeps up (2
                workers)
    prefetch    finding 2: is stream prefetch slower than none? with 0 workers (host-bound) and 2
    gpu-decode  N1, N2: torchvision-cuda decode: its device_prep, the stall, the GPU's idle, the
                copied bytes, the unpinned note
    device      N1: a device_stages what-if's GPU work between steps: device_prep, not stall or GPU
                idle
    pinned      N3: the pinned pool (shm.pinned_bytes) of batches that are not powers of two, 0 and
                2 workers

Without CUDA it runs dry: every cell that can run on the CPU runs there at 2 steps (the plumbing,
not a figure), the cells that need CUDA are skipped, and each row says which. Each cell is `python
-m feedbench run` in a process of its own: no cell inherits another's allocator, collector or CUDA
context.
"""  # noqa: E501

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import textwrap

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIME_LIMIT_S = 90  # one cell; a hung cell is recorded as failed and the check goes on

RESNET = dict(
    model="resnet18",
    dataset="memory",
    image_size=64,
    num_classes=100,
    batch_size=64,
    num_samples=1024,
    steps=50,
)
MLP = dict(
    model="mlp",
    dataset="memory",
    input_size=4096,
    width=4096,
    hidden_layers=4,
    batch_size=4096,
    num_samples=32768,
)
MLP_COPY = dict(MLP, steps=30, pin_memory=True, non_blocking=True)
JPEG = dict(
    dataset="images", model="resnet18", image_size=64, num_classes=10, batch_size=32, steps=20
)
ODD = dict(
    model="mlp",
    dataset="memory",
    input_size=3000,
    width=512,
    batch_size=3000,
    num_samples=24000,
    steps=20,
)
DEVICE_STAGES = dict(
    dataset="gpu_check_stages:build", model="resnet18", num_classes=10, batch_size=32, steps=20
)

# group -> (what it needs: "cuda" or "" , {arm: knobs})
GROUPS = {
    "events": (
        "",
        {
            "naive (no instrument)": dict(RESNET, timing="naive"),
            "events": dict(RESNET, timing="events"),
            "sync": dict(RESNET, timing="sync"),
            "events, pinned non-blocking": dict(
                RESNET, timing="events", pin_memory=True, non_blocking=True
            ),
            "events, 2 workers": dict(RESNET, timing="events", num_workers=2),
        },
    ),
    "prefetch": (
        "",
        {
            "none, 0 workers": dict(MLP_COPY, device_prefetch="none"),
            "stream, 0 workers": dict(MLP_COPY, device_prefetch="stream"),
            "none, 2 workers": dict(MLP_COPY, device_prefetch="none", num_workers=2),
            "stream, 2 workers": dict(MLP_COPY, device_prefetch="stream", num_workers=2),
        },
    ),
    "gpu-decode": (
        "cuda",
        {
            "torchvision-cuda, pageable": dict(JPEG, decoder="torchvision-cuda"),
            "torchvision-cuda, pin_memory": dict(JPEG, decoder="torchvision-cuda", pin_memory=True),
            "torchvision (CPU decode), pin_memory": dict(
                JPEG, decoder="torchvision", pin_memory=True, num_workers=2
            ),
        },
    ),
    "device": (
        "",
        {
            "all stages in the loader": dict(DEVICE_STAGES),
            "ColorJitter on the device": dict(DEVICE_STAGES, device_stages="ColorJitter"),
        },
    ),
    "pinned": (
        "",
        {
            "0 workers": dict(ODD, pin_memory=True),
            "2 workers": dict(ODD, pin_memory=True, num_workers=2),
            "2 workers, stream prefetch": dict(
                ODD, pin_memory=True, num_workers=2, device_prefetch="stream"
            ),
        },
    ),
}

# A user dataset of uint8 images whose torchvision v2 pipeline device_stages can move (written
# beside the results).
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


def run_cell(knobs: dict, out: str, env: dict) -> dict:
    """One cell in a fresh process; its result.json (a failed one where the harness wrote none)."""
    command = [
        sys.executable,
        "-m",
        "feedbench",
        "run",
        "--out",
        out,
        "--time-limit",
        str(TIME_LIMIT_S),
    ]
    for knob, value in knobs.items():
        command += ["--set", f"{knob}={json.dumps(value)}"]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=TIME_LIMIT_S + 60
    )
    path = os.path.join(out, "result.json")
    if not os.path.exists(path):
        return {
            "status": "failed",
            "error": {"message": done.stderr.strip().splitlines()[-1:] or ["no result"]},
        }
    with open(path) as f:
        return json.load(f)


def row(group: str, arm: str, results: list[dict], note: str) -> str:
    """One markdown row: each round's samples/s, their median, and the medians of what the check
    reads."""
    ok = [r for r in results if r.get("status") == "ok"]
    if not ok:
        errors = {str((r.get("error") or {}).get("message", ""))[:120] for r in results}
        return f"| {group} | {arm} | failed: {'; '.join(errors)} | | | | | | | {note} |"
    rates = [r["metrics"]["samples_per_s"] for r in ok]
    metrics = [r["metrics"] for r in ok]

    def median(read) -> str:
        values = [v for v in map(read, metrics) if v is not None]
        return f"{statistics.median(values):.3g}" if values else "-"

    idle = median(
        lambda m: (
            100 * m["phases"].get("gpu_idle", {}).get("share", 0)
            if "gpu_idle" in m["phases"]
            else None
        )
    )
    prep = median(
        lambda m: (
            100 * m["phases"]["device_prep"]["share"] if "device_prep" in m["phases"] else None
        )
    )
    pinned = [r["shm"].get("pinned_bytes") for r in ok if r.get("shm")]
    unpinned = sum("unpinned" in a for r in ok for a in r.get("adjustments", []))
    return (
        f"| {group} | {arm} | {', '.join(f'{x:.0f}' for x in rates)} | "
        f"{statistics.median(rates):.0f} | {median(lambda m: m['stall_pct'])} | {idle} | {prep} "
        f"| {median(lambda m: m.get('h2d_gb_per_s'))} | {pinned[0] if pinned else '-'} | {note}"
        f"{'; unpinned note' if unpinned else ''} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the cells and gpu-check.md")
    parser.add_argument(
        "--rounds", type=int, default=2, help="alternating rounds of each group's arms (dry: 1)"
    )
    parser.add_argument(
        "--only", nargs="+", choices=list(GROUPS), default=list(GROUPS), help="default: every group"
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    rounds, device = (args.rounds, "cuda") if cuda else (1, "cpu")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_check_stages.py"), "w") as f:
        f.write(STAGES_MODULE)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "workflow"), os.path.abspath(args.out)]),
    )
    images = os.path.join(args.out, "images")
    if cuda and "gpu-decode" in args.only and not os.path.isdir(images):
        subprocess.run(
            [sys.executable, "-m", "feedbench", "make-images", images],
            check=True,
            env=env,
            capture_output=True,
        )
    common = dict(device=device, warmup_steps=5, torch_threads=1, data_dir=images)
    if not cuda:  # the plumbing only: small cells
        common.update(
            steps=2,
            warmup_steps=1,
            batch_size=8,
            num_samples=64,
            image_size=32,
            input_size=64,
            width=64,
        )
    name = (
        torch.cuda.get_device_name(0)
        if cuda
        else "no CUDA: dry run on the CPU, 2 steps a cell, no figure"
    )
    lines = [
        f"### GPU check, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC: {name}",
        "",
        f"torch {torch.__version__}, {rounds} alternating round(s), each cell a fresh `python -m "
        "feedbench run`.",
        "",
        "| group | arm | samples/s by round | median | stall % | GPU idle % | device_prep % | "
        "h2d GB/s | pinned bytes | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for group in args.only:
        needs, arms = GROUPS[group]
        if needs == "cuda" and not cuda:
            lines += [
                f"| {group} | {arm} | skipped: needs CUDA | | | | | | | dry |" for arm in arms
            ]
            continue
        results = {arm: [] for arm in arms}
        for k in range(rounds):
            # alternating: drift falls on every arm
            order = list(arms) if k % 2 == 0 else list(reversed(arms))
            for arm in order:
                out = os.path.join(
                    args.out, group, arm.replace(" ", "_").replace(",", ""), f"round{k + 1}"
                )
                knobs = {**common, **arms[arm]} if cuda else {**arms[arm], **common}
                if "dataset" in knobs and knobs["dataset"] != "images":
                    knobs.pop("data_dir")
                results[arm].append(run_cell(knobs, out, env))
        lines += [row(group, arm, results[arm], "" if cuda else "dry (CPU)") for arm in arms]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "gpu-check.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
