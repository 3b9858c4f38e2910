""" "Where" sees through a library's frames (#49): a dataset whose `__getitem__` is a library's (as
Hugging Face `datasets` with `with_transform`: a few layers of the library's own, then the user's
transform) has the user's transform and the costliest callee below it named by the warm-up's
profile, not the library's `__getitem__` or its helpers.

The library is a module outside the cell's `python_path` (so a package's, as `datasets` in
site-packages); the user's code is under it. One cell in this process, no workers: about 2 s.
"""

from __future__ import annotations

import json
import sys

from conftest import write_user_module
from feedbench.analysis.aggregate import load_results
from feedbench.analysis.report import build
from feedbench.harness.runner import run
from helpers.cells import user_cell

LIBRARY = """
# A datasets-like library: its rows are read by its own helpers, then formatted by the user's
# transform (with_transform); its tokenizer is a callable class, as a transformers tokenizer.
import torch.utils.data


class Tokenizer:
    def __call__(self, text, loops=60000):
        acc = 0
        for i in range(loops):  # the costliest part of each sample
            acc += i * i
        return [len(word) + acc % 7 for word in text.split()]


class Dataset(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows, self.transform = rows, None

    def with_transform(self, transform):
        self.transform = transform
        return self

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self._getitem(index)

    def _getitem(self, index):
        return self._format(self._read(index))

    def _read(self, index):
        return dict(self.rows[index])

    def _format(self, row):
        return self.transform(row) if self.transform else row
"""

USER_MODULE = "reviews_hf"
USER_CODE = """
import torch
from torch import nn

from fakedatasets import Dataset, Tokenizer

TOKENIZER = Tokenizer()


def encode(row):  # the user's transform: some work of its own, then the library's tokenizer
    acc = 0
    for i in range(25000):
        acc += i
    ids = TOKENIZER(row["text"])
    return torch.tensor(ids[:4] + [0] * (4 - len(ids[:4])), dtype=torch.float32), row["label"]


def build(ctx):
    rows = [{"text": f"a review of {i} words or so", "label": i % 2} for i in range(64)]
    return Dataset(rows).with_transform(encode)


def model(ctx):
    return nn.Linear(4, 2)


def step(model, batch, ctx):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])
"""


def test_a_librarys_getitem_calling_the_users_transform_has_the_transform_named_in_where(
    user_module, tmp_path, monkeypatch
):
    library = write_user_module(tmp_path / "lib", "fakedatasets", LIBRARY)
    monkeypatch.syspath_prepend(library)  # importable, but outside the cell's python_path
    monkeypatch.delitem(sys.modules, "fakedatasets", raising=False)
    knobs = user_cell(USER_MODULE, user_module, "build", device="cpu", stage_timing=True)
    knobs.update(batch_size=8, num_workers=0, warmup_steps=2, steps=2, torch_threads=1)
    labels = {"experiment": "hf", "cell": "base", "baseline": True}
    assert run({**knobs, **labels}, str(tmp_path / "out")) == 0
    path = str(tmp_path / "out" / "result.json")

    rows = load_results([path])
    named = [name for name, _share, _ms in json.loads(rows["stage_profile"][0])]
    assert named[:2] == ["fakedatasets:Tokenizer.__call__", "reviews_hf:encode"], named
    # the library's helpers hold no time of their own worth naming: its __getitem__ keeps the rest
    assert not any(name.endswith(("._getitem", "._format", "._read")) for name in named), named

    context = build(rows, [], [], {"experiments": {"hf": {}}}, "h")
    (experiment,) = context["experiments"]
    where = experiment["headline"]["where"]
    assert "of a sample's loader CPU time is in fakedatasets:Tokenizer.__call__ (" in where
    assert "% in reviews_hf:encode (" in where, where
