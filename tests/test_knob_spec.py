"""The knob and dataset declarations (feedbench.plan.knobs) against the code that must follow them.

Adding a knob is one declaration plus the code that reads it, and adding a dataset one declaration plus its
builder (docs/layout.md, "Where a new thing goes"): these tests fail when the second half is missing.
"""

from __future__ import annotations

import ast
import functools
import os

import pytest
from conftest import ROOT
from feedbench.harness import data
from feedbench.harness.images import make_images
from feedbench.harness.shards import make_shards
from feedbench.plan.ceilings import LABEL_BYTES, batch_bytes
from feedbench.plan.cell import parse_cell
from feedbench.plan.knobs import BUILTIN_DATASETS, KNOBS
from feedbench.plan.matrix import harness_files

PACKAGE = os.path.join(ROOT, "workflow", "feedbench")


@functools.cache
def harness_reads() -> frozenset[str]:
    """What the harness code (the modules `python -m feedbench run` executes, less the declarations) reads by name:
    `cell.<name>`, and `x["<name>"]` or `x.get("<name>")`, as it looks up the user's callables by knob."""
    names: set[str] = set()
    for path in harness_files(PACKAGE):
        if not path.endswith(".py") or os.path.basename(path) == "knobs.py":
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cell":
                names.add(node.attr)
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                names.add(node.slice.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                names.update(a.value for a in node.args[:1] if isinstance(a, ast.Constant))
    return frozenset(names)


@pytest.mark.parametrize("name", list(KNOBS))
def test_every_declared_knob_is_read_by_the_harness(name):
    assert name in harness_reads(), (
        f"knob {name!r} is declared in plan/knobs.py but no harness module reads it (cell.{name}): a cell would"
        " accept it, run without it, and the result would say it was set"
    )


def test_every_declared_dataset_has_a_builder():
    assert set(data.DATASETS) == set(BUILTIN_DATASETS)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """A few generated JPEGs, and the same as one shard of each format: the data_dir of the datasets that need one."""
    root = tmp_path_factory.mktemp("datasets")
    images = str(root / "images")
    make_images(images, 4, 24, 2)
    make_shards(images, str(root / "shards"), 1)
    return {"images": images, "webdataset": str(root / "shards"), "parquet": str(root / "shards")}


CASES = [
    ("synthetic", "mlp"),
    ("synthetic", "resnet18"),
    ("memory", "mlp"),
    ("memory", "sleep"),
    ("images", "resnet18"),
    ("webdataset", "resnet18"),
    ("parquet", "resnet18"),
    ("tokens", "lstm"),
]


@pytest.mark.parametrize("dataset, model", CASES)
def test_batch_bytes_follows_the_declared_sample(dataset, model, folders):
    """ceilings.batch_bytes sizes a batch from the dataset's declared sample: its samples' bytes are a real batch's."""
    knobs = {"dataset": dataset, "model": model, "batch_size": 2, "num_samples": 4, "input_size": 32, "image_size": 16}
    knobs.update({"data_dir": folders[dataset], "shards": 1} if dataset in folders else {})
    cell = parse_cell(knobs)
    batch = next(iter(data.build_loader(cell, data.build_dataset(cell))))
    if BUILTIN_DATASETS[dataset].sample == "tokens":
        assert batch_bytes(knobs) is None  # sequences of varying length: no size to predict
        return
    samples = batch[0]
    assert batch_bytes(knobs) - 2 * LABEL_BYTES == samples.numel() * samples.element_size()
