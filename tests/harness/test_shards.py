"""make-shards and the built-in webdataset and parquet datasets."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from feedbench.harness.images import make_images
from feedbench.harness.runner import run
from feedbench.harness.shards import make_shards

# one worker: the module fixture makes the images and shards once
pytestmark = pytest.mark.xdist_group("shards")

COUNT = 24


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    make_images(str(root / "images"), COUNT, 32, 3)
    for n in (1, 2):
        make_shards(str(root / "images"), str(root / "out"), n)
    return root


def digests(folder) -> dict[str, str]:
    return {
        os.path.relpath(os.path.join(d, n), folder): hashlib.sha256(
            open(os.path.join(d, n), "rb").read()
        ).hexdigest()
        for d, _, names in os.walk(folder)
        for n in names
    }


def test_make_shards_is_deterministic_from_the_command_line(shards, tmp_path):
    command = [
        sys.executable,
        "-m",
        "feedbench",
        "make-shards",
        str(shards / "images"),
        str(tmp_path),
        "--shards",
        "1",
        "2",
    ]
    assert subprocess.run(command, capture_output=True, text=True, timeout=120).returncode == 0
    assert digests(tmp_path) == digests(shards / "out")
    assert sorted(digests(tmp_path)) == [
        "shards-1/parquet/part-00000.parquet",
        "shards-1/webdataset/shard-00000.tar",
        "shards-2/parquet/part-00000.parquet",
        "shards-2/parquet/part-00001.parquet",
        "shards-2/webdataset/shard-00000.tar",
        "shards-2/webdataset/shard-00001.tar",
    ]


def sharded(shards, dataset: str, count: int, **knobs) -> dict:
    """A cell on the CPU reading the fixture's images as `count` shards of format `dataset`, 4 of
    16 px a batch, `knobs` over it."""
    read = dict(dataset=dataset, data_dir=str(shards / "out"), shards=count)
    return dict(**read, device="cpu", image_size=16, batch_size=4, monitor_interval_s=5, **knobs)


@pytest.mark.parametrize("workers", [0, 2])
def test_webdataset_loader_reads_its_shards_with_and_without_workers(shards, tmp_path, workers):
    knobs = sharded(
        shards,
        "webdataset",
        2,
        scenario="loader",
        num_workers=workers,
        steps=COUNT // 4,
        warmup_steps=0,
    )
    assert run(knobs, str(tmp_path)) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["metrics"]["samples"] == COUNT


def test_parquet_trains(shards, tmp_path):
    knobs = sharded(
        shards,
        "parquet",
        2,
        model="resnet18",
        num_classes=3,
        steps=3,
        warmup_steps=1,
        torch_threads=1,
    )
    assert run(knobs, str(tmp_path)) == 0


def test_a_shard_count_never_written_is_one_line(shards, tmp_path):
    knobs = sharded(shards, "webdataset", 3, scenario="loader")
    assert run(knobs, str(tmp_path)) == 2
    message = json.loads((tmp_path / "result.json").read_text())["error"]["message"]
    assert message.startswith("knob 'shards': no webdataset shards in ") and "--shards 3" in message
