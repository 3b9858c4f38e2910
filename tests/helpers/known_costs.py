"""A user pipeline of known costs: tests/harness/test_stages.py measures its stages,
tests/workflow/test_stage_whatifs.py runs its what-ifs."""

# A user pipeline of known costs, loaded by import path: two Compose transforms, a feedbench.stage
# span and work of its own in __getitem__ (unattributed), each a busy-wait on perf_counter (a sleep
# would not use the core). On a busy machine a worker descheduled at a wait's end overshoots it, so
# each part also reports the wall time it really took, in the sample itself (the unattributed one:
# the sample's wall time outside the other three): that is what was put there, and what the stages
# must give back.
COSTS = {"Crop": 2.0, "Jitter": 4.0, "tokenize": 1.5, "unattributed": 3.0}
# USER_CODE, imported by its path (the user_module fixture, tests/conftest.py)
USER_MODULE = "known_costs"
USER_CODE = f"""
import time

import feedbench
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset, get_worker_info
from torchvision import transforms

COSTS = {COSTS!r}
SPENT = {{}}  # the named parts of the sample being made: name -> the wall ms each took, from its start to its end
SEEN = []  # the SPENT of each batch the step received, in order


def spin(ms):
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def since(start):
    return (time.perf_counter() - start) * 1000


class Crop:
    def __call__(self, x):
        start = time.perf_counter()
        spin(COSTS["Crop"])
        SPENT["Crop"] = since(start)
        return x


class Jitter:
    def __call__(self, x):
        start = time.perf_counter()
        spin(COSTS["Jitter"])
        x = x + 1
        SPENT["Jitter"] = since(start)
        return x


class Costs(Dataset):
    def __init__(self, n):
        self.n, self.transform = n, transforms.Compose([Crop(), Jitter()])

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        start = time.perf_counter()
        spin(COSTS["unattributed"])
        with feedbench.stage("tokenize"):
            begun = time.perf_counter()
            spin(COSTS["tokenize"])
            SPENT["tokenize"] = since(begun)
        x = self.transform(torch.full((4,), float(index)))
        spent = dict(SPENT)
        spent["unattributed"] = since(start) - sum(SPENT.values())  # the sample's wall time outside the named parts
        return x, spent


def build(ctx, n=128):
    return Costs(n)


class Stream(IterableDataset):  # the same samples as a stream split over the workers; Costs' transform

    def __init__(self, n):
        self.costs = Costs(n)
        self.transform = self.costs.transform

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        for index in range(worker, len(self.costs), workers):
            yield self.costs[index]


def build_stream(ctx, n=128):
    return Stream(n)


def model(ctx):
    return nn.Linear(4, 1)


def step(model, batch, ctx):
    SEEN.append({{name: ms.tolist() for name, ms in batch[1].items()}})
    return model(batch[0]).mean()
"""  # noqa: E501
