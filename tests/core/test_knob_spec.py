"""The knob and dataset declarations (feedbench.core.knobs) against the code that must follow them.

Adding a knob is one declaration plus the code that reads it, and adding a dataset one declaration
plus its builder (docs/layout.md, "Where a new thing goes"): these tests fail when the second half
is missing.
"""

from __future__ import annotations

import ast
import functools
import os

import pytest
from conftest import ROOT
from feedbench.core import knobs
from feedbench.core.ceilings import LABEL_BYTES, batch_bytes
from feedbench.core.cell import parse_cell
from feedbench.core.knobs import BUILTIN_DATASETS, KNOBS
from feedbench.harness import data
from feedbench.harness.images import make_images
from feedbench.harness.shards import make_shards
from feedbench.plan.matrix import harness_files

PACKAGE = os.path.join(ROOT, "workflow", "feedbench")


@functools.cache
def harness_reads() -> frozenset[str]:
    """What the harness code (the modules `python -m feedbench run` executes, less the declarations)
    reads by name: `cell.<name>`, and `x["<name>"]` or `x.get("<name>")`, as it looks up the user's
    callables by knob."""
    names: set[str] = set()
    for path in harness_files(PACKAGE):
        if not path.endswith(".py") or os.path.basename(path) == "knobs.py":
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "cell"
            ):
                names.add(node.attr)
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                names.add(node.slice.value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
            ):
                names.update(a.value for a in node.args[:1] if isinstance(a, ast.Constant))
    return frozenset(names)


@pytest.mark.parametrize("name", list(KNOBS))
def test_every_declared_knob_is_read_by_the_harness(name):
    assert name in harness_reads(), (
        f"knob {name!r} is declared in core/knobs.py but no harness module reads it (cell.{name}"
        "): a cell would accept it, run without it, and the result would say it was set"
    )


def test_every_declared_dataset_has_a_builder():
    assert set(data.DATASETS) == set(BUILTIN_DATASETS)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """A few generated JPEGs, and the same as one shard of each format: the data_dir of the datasets
    that need one."""
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
    """ceilings.batch_bytes sizes a batch from the dataset's declared sample: its samples' bytes are
    a real batch's."""
    knobs = {
        "dataset": dataset,
        "model": model,
        "batch_size": 2,
        "num_samples": 4,
        "input_size": 32,
        "image_size": 16,
    }
    knobs.update({"data_dir": folders[dataset], "shards": 1} if dataset in folders else {})
    cell = parse_cell(knobs)
    batch = next(iter(data.build_loader(cell, data.build_dataset(cell))))
    if BUILTIN_DATASETS[dataset].sample == "tokens":
        assert batch_bytes(knobs) is None  # sequences of varying length: no size to predict
        return
    samples = batch[0]
    assert batch_bytes(knobs) - 2 * LABEL_BYTES == samples.numel() * samples.element_size()


# Lists keyed by knob: each derived from a field of the declarations (Knob.whatif, tunes,
# searchable, pays_off), one home each. A module that assigns one again, or names two what-if knobs
# in a literal, fails here.
DERIVED = {
    "STAGE_WHATIFS": knobs.STAGE_WHATIFS,
    "WHATIF_ONLY": knobs.WHATIF_ONLY,
    "SEARCHABLE": knobs.SEARCHABLE,
    "PAYS_OFF": tuple(name for name, _label, _on in knobs.PAYS_OFF),
}


def package_trees():
    for folder in (PACKAGE, os.path.join(ROOT, "workflow", "scripts")):
        for dirpath, _dirs, files in os.walk(folder):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    with open(path) as f:
                        yield os.path.relpath(path, ROOT), ast.parse(f.read(), path)


def test_knob_keyed_lists_are_derived_from_the_declarations():
    assert knobs.STAGE_WHATIFS == ("cache_after", "skip_stages", "device_stages")
    assert set(knobs.WHATIF_ONLY) == {*knobs.STAGE_WHATIFS, "cache_limit_mb", "cache_in"}
    assert knobs.SEARCHABLE == ("num_workers",)
    assert knobs.PAYS_OFF == (
        ("pin_memory", "pinning", "true"),
        ("device_prefetch", "stream prefetch", "stream"),
    )
    found = []
    for path, tree in package_trees():
        for node in ast.walk(tree):
            targets = (
                node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            )
            for target in targets:
                if (
                    isinstance(target, ast.Name)
                    and target.id in (*DERIVED, "WHATIF_KINDS")
                    and "knobs.py" not in path
                ):
                    found.append(
                        f"{path}:{node.lineno}: {target.id} assigned outside core/knobs.py"
                    )
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = {
                    e.value
                    for e in node.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                }
                # views group by pin_memory and device_prefetch
                if len(names & set(knobs.WHATIF_ONLY)) >= 2:
                    found.append(
                        f"{path}:{node.lineno}: {sorted(names)} written by hand (knobs.WHATIF_ONLY)"
                    )
    assert not found, "\n".join(found)


def test_every_stage_whatif_has_its_rule_in_the_report():
    import pandas as pd
    from feedbench.analysis.whatifs import can_take

    assert sorted(can_take(pd.DataFrame())) == sorted(knobs.STAGE_WHATIFS)


def test_the_config_schema_allows_what_the_declarations_do():
    """config/schema.yaml is data: its enums of searchable axes and of study views are checked
    against their one home (knobs.SEARCHABLE, analysis.views.NAMES, each view a module of that
    package)."""
    import yaml
    from feedbench.analysis import views

    with open(os.path.join(ROOT, "config", "schema.yaml")) as f:
        experiment = yaml.safe_load(f)["$defs"]["experiment"]["properties"]
    axis = experiment["search"]["oneOf"]
    enums = [s["enum"] for s in axis if "enum" in s] + [
        s["properties"]["axis"]["enum"] for s in axis if "properties" in s
    ]
    assert enums and all(tuple(e) == knobs.SEARCHABLE for e in enums)
    assert tuple(experiment["view"]["enum"]) == views.NAMES
    for name in views.NAMES:
        assert callable(views.builder(name))
