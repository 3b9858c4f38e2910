"""An IterableDataset that shards itself by ctx and worker info: every sample exactly once per
epoch, at W loader workers x R ranks (gloo processes, feedbench's own launcher)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import write_user_module
from helpers.cells import run_cell_process

pytestmark = pytest.mark.slow  # four real `feedbench run` processes, two of them with two ranks

SAMPLES, BATCH = 48, 4

USER_CODE = '''
import os

import torch
from torch import nn
from torch.utils.data import IterableDataset, get_worker_info


class Numbers(IterableDataset):
    """Sample i goes to reader i mod (ranks x workers): the usual split of a stream."""

    def __init__(self, n, rank, world_size):
        self.n, self.rank, self.world_size = n, rank, world_size

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        for i in range(self.rank * workers + worker, self.n, self.world_size * workers):
            yield torch.full((2,), float(i)), i


def build(ctx, n):
    return Numbers(n, ctx.rank, ctx.world_size)


def model(ctx):
    return nn.Linear(2, 1)


def step(model, batch, ctx):
    """Write down the ids of every sample the trainer of this rank received."""
    with open(os.path.join(os.environ["SEEN_DIR"], f"rank{ctx.rank}.txt"), "a") as f:
        f.write("".join(f"{int(i)}\\n" for i in batch[1]))
    return model(batch[0]).mean()
'''


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_exactly_once_per_epoch(tmp_path, workers, ranks):
    # run in processes of their own: none to forget
    src = write_user_module(tmp_path, "numbers_ds", USER_CODE)
    seen = tmp_path / "seen"
    seen.mkdir()
    # one epoch per rank: every reader's share is a whole number of batches
    steps = SAMPLES // (ranks * BATCH)
    knobs = {
        "dataset": "numbers_ds:build",
        "dataset_args": {"n": SAMPLES},
        "model": "numbers_ds:model",
        "step": "numbers_ds:step",
        "python_path": [src],
        "device": "cpu",
        "batch_size": BATCH,
        "num_workers": workers,
        "steps": steps,
        "warmup_steps": 0,
        "torch_threads": 1,
        "monitor_interval_s": 5,
    }
    if ranks > 1:
        knobs.update(parallel="independent", gpus_per_node=ranks)
    proc = run_cell_process(tmp_path / "out", knobs, env={**os.environ, "SEEN_DIR": str(seen)})
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert proc.returncode == 0, (result["error"], proc.stderr[-2000:])
    ids = [int(line) for path in sorted(seen.iterdir()) for line in path.read_text().split()]
    assert sorted(ids) == list(range(SAMPLES))
    assert len(list(seen.iterdir())) == ranks and result["metrics"]["samples"] == SAMPLES
