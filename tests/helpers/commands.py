"""A user's own training script, as the command cell's tests run it (harness.command): a plain
loop that iterates a validation loader first, then trains, with no feedbench in it.

Its dataset counts the samples it made in this process and prints the count as the script ends, so
a test can tell a batch made from one replayed from memory; its Compose has one costly transform of
the user's (`Busy`), which a stage profile must name.
"""

from __future__ import annotations

import os
import textwrap

TRAIN = '''
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset
{imports}

MADE = [0]


class Busy:
    """The costly transform: {busy_ms} ms of CPU per sample."""

    def __call__(self, image):
        end = time.thread_time() + {busy_ms} / 1000
        while time.thread_time() < end:
            pass
        return image


class Images(Dataset):
    def __init__(self, n, sleep_s=0.0):
        self.n, self.sleep_s = n, sleep_s
        self.transform = {transform}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        MADE[0] += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        g = torch.Generator().manual_seed(i)
        image = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=g)
        return self.transform(image), i % 4


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--device", default="cpu")
args = parser.parse_args()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 4)).to(args.device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
validation = DataLoader(Images(64), batch_size=8)
train = DataLoader(Images(512, args.sleep), batch_size=8, shuffle=True, num_workers=args.workers)
with torch.no_grad():
    for i, (x, y) in enumerate(validation):
        model(x.to(args.device))
        if i == 1:
            break
MADE[0] = 0
step = 0
while step < args.steps:
    for x, y in train:
        x, y = x.to(args.device, non_blocking=True), y.to(args.device, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == args.steps:
            break
print(f"trained {{step}} steps; made {{MADE[0]}} training samples here")
'''


# The dataset's transform: a torchvision v2 Compose, whose stages feedbench times; or, where a test
# times no stage, the same work without torchvision (its import costs a second of CPU a run).
COMPOSE = "v2.Compose([v2.RandomHorizontalFlip(), Busy(), v2.ToDtype(torch.float32)])"
PLAIN = "lambda image: Busy()(image).flip(-1).to(torch.float32)"


def write_train(folder, busy_ms: float = 1.0, stages: bool = True) -> str:
    """TRAIN as `train.py` in `folder` (its transform a torchvision Compose where `stages`); the
    folder (the cell's workdir)."""
    os.makedirs(folder, exist_ok=True)
    text = TRAIN.format(
        busy_ms=busy_ms,
        imports="from torchvision.transforms import v2" if stages else "",
        transform=COMPOSE if stages else PLAIN,
    )
    with open(os.path.join(folder, "train.py"), "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(text))
    return str(folder)


def line_of(folder, text: str) -> int:
    """The line of train.py in `folder` that holds `text` (where a loader is built)."""
    with open(os.path.join(folder, "train.py"), encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, start=1) if text in line)


def command_cell(workdir: str, command: str, **knobs) -> dict:
    """A command cell's knobs, as a bench job gets them (labelled), on the CPU, one trainer
    thread."""
    return {
        "command": command,
        "workdir": workdir,
        "device": "cpu",
        "torch_threads": 1,
        "experiment": "mine",
        "cell": "c",
        "repeat": 1,
        **knobs,
    }
