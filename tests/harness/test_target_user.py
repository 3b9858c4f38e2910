"""A target for the user's own code (issue #33, 5): the user's model counted on the meta device on a
batch drawn from its own pipeline, the copy priced from that batch's bytes, not from an image batch
of the knobs' shape; one line, pointing to `compute: measured`, for a model the meta device cannot
run."""

from __future__ import annotations

import os

import pytest
from conftest import ROOT
from feedbench.analysis.target_view import cell_row, with_measured_copy
from feedbench.core.ceilings import batch_bytes, training_cells
from feedbench.core.records import read_record
from feedbench.core.target import PAGEABLE_SHARE, read_target
from feedbench.harness.flops import estimate_cell
from feedbench.harness.runner import run
from feedbench.plan.matrix import build_cells
from helpers.cells import user_package

TARGET = {"gpu": "H100", "cores_per_gpu": 4, "cpu_speed": 1.0}
SHAPES = os.path.join(ROOT, "examples", "own-pipeline", "src")

# A text classifier as a user writes it: token ids of 3 to 7 tokens, a padding collate that returns
# a dict, a model whose forward takes two named inputs, and two models the meta device cannot run.
TEXT = """
import torch
from torch import nn
from torch.utils.data import Dataset


class Lines(Dataset):
    def __init__(self, n, vocab):
        self.n, self.vocab = n, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": torch.arange(3 + i % 5) % self.vocab + 1, "label": i % 2}


def pad(samples):
    ids = torch.zeros(len(samples), max(len(s["input_ids"]) for s in samples), dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = sample["input_ids"]
    return {"input_ids": ids, "mask": ids != 0, "label": torch.tensor([s["label"] for s in samples])}


class Text(nn.Module):
    def __init__(self, vocab, dim, classes):
        super().__init__()
        self.embed = nn.Embedding(vocab + 1, dim, padding_idx=0)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids, mask):
        pooled = (self.embed(input_ids) * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled)


class Missing(Lines):  # a pipeline whose data is not there: no batch to draw
    def __getitem__(self, i):
        raise OSError(f"no such shard: lines-{i}.jsonl")


class Picky(Text):  # a check on the data's values in forward: a meta tensor has none
    def forward(self, input_ids, mask):
        if int(input_ids.max()) >= self.embed.num_embeddings:
            raise ValueError("token id out of range")
        return super().forward(input_ids, mask)


class Calibrated(Text):  # a figure read from a weight in the constructor: a meta tensor has none
    def __init__(self, vocab, dim, classes):
        super().__init__(vocab, dim, classes)
        self.scale = float(self.head.weight.detach().norm())
"""  # noqa: E501
# 8 lines of 3 to 7 tokens in one batch of 8: ids (int64) and mask (bool) padded to 7, and the
# labels (int64).
TEXT_BATCH_BYTES = 8 * 7 * 8 + 8 * 7 * 1 + 8 * 8
DIM, CLASSES = 16, 2
TEXT_CELL = {
    "dataset": "usertext.text:Lines",
    "dataset_args": {"n": 8, "vocab": 50},
    "collate": "usertext.text:pad",
    "model_args": {"vocab": 50, "dim": DIM, "classes": CLASSES},
    "forward_keys": ["input_ids", "mask"],
    "label_key": "label",
    "batch_size": 8,
}
# The shapes CNN of examples/own-pipeline at batch 16 on 56 px crops: its dict batch of images
# (float32) and labels.
SHAPES_BATCH_BYTES = 16 * 3 * 56 * 56 * 4 + 16 * 8


@pytest.fixture
def text_project(tmp_path, monkeypatch):
    """The text classifier as usertext/text.py under tmp_path/src; the shapes example it is planned
    beside is forgotten after the test too."""
    yield from user_package(tmp_path, monkeypatch, "usertext", "text.py", TEXT, forget=("shapes",))


@pytest.fixture
def estimates(text_project, tmp_path):
    """results/target.json's cells as rule target makes them (workflow/scripts/target.py, through
    flops.target_estimates): the config planned, each training cell estimated on an H100. The
    efficiency is no part of what is checked here: 1.0, the roofline itself, where rule target fits
    it to every published study (half a minute)."""
    shapes = {
        "dataset": "shapes.data:build_dataset",
        "dataset_args": {"root": str(tmp_path / "shapes"), "count": 32, "shards": 1},
        "collate": "shapes.data:collate",
        "model": "shapes.models:build_model",
        "step": "shapes.train:train_step",
        "batch_size": 16,
    }
    config = {
        "python_path": [SHAPES, text_project],
        "defaults": {
            "repeats": 1,
            "steps": 2,
            "warmup_steps": 1,
            "device": "cpu",
            "torch_threads": 1,
        },
        "target": TARGET,
        "experiments": {
            "shapes": {"base": {"scenario": "train", **shapes}},
            "text": {
                "base": {"scenario": "train", **TEXT_CELL},
                "matrix": {
                    "model": [f"usertext.text:{name}" for name in ("Text", "Picky", "Calibrated")]
                },
            },
            "missing": {
                "base": {
                    "scenario": "train",
                    **TEXT_CELL,
                    "dataset": "usertext.text:Missing",
                    "model": "usertext.text:Text",
                }
            },
        },
    }
    target = read_target(TARGET)
    cells = training_cells(build_cells(config))
    # <experiment>/<the model's name>: one cell each
    named = {
        f"{key.split('/')[0]}/{knobs['model'].rsplit(':', 1)[1]}": knobs
        for key, knobs in cells.items()
    }
    return {name: estimate_cell(knobs, target) for name, knobs in named.items()}


def conv_flops(batch, out_channels, side, in_channels):
    """Multiply-adds of a 3x3 convolution, twice: the FLOPs FlopCounterMode counts for it."""
    return 2 * batch * out_channels * side * side * in_channels * 9


def test_the_users_model_is_counted_on_the_meta_device_on_its_own_batch(estimates):
    shapes = estimates["shapes/build_model"]
    # Forward: two convolutions and the head; backward: the weights' gradients of all three and the
    # inputs' of the second convolution and the head (the first's input is the batch, which needs
    # none).
    conv1, conv2, head = conv_flops(16, 16, 56, 3), conv_flops(16, 32, 28, 16), 2 * 16 * 32 * 10
    assert shapes["flops"] == 2 * conv1 + 3 * conv2 + 3 * head
    assert (
        shapes["compute_s"] > 0
        and shapes["efficiency_from"] == "kernels"
        and shapes["family"] is None
    )
    text = estimates["text/Text"]
    # The dict batch through forward_keys: the embedding and the pooling are no matmuls; the head
    # is, and backward computes its weight's and its input's gradients (the embedding's weights need
    # them).
    assert text["flops"] == 3 * 2 * 8 * DIM * CLASSES and text["compute_s"] > 0


def test_the_copy_is_priced_from_the_users_batch_not_an_image_batch(estimates):
    for key, size in (("shapes/build_model", SHAPES_BATCH_BYTES), ("text/Text", TEXT_BATCH_BYTES)):
        entry = estimates[key]
        assert entry["batch_bytes"] == size and entry["batch_bytes_from"] == "drawn", (
            key,
            entry["batch_bytes"],
        )
        # the knobs' shape: an image batch
        assert entry["batch_bytes"] != batch_bytes(entry["knobs"])
        # the H100's PCIe Gen5 link, at the share a copy from pageable memory reaches (pin_memory is
        # off)
        assert entry["copy_gb_per_s"] == pytest.approx(63.0 * PAGEABLE_SHARE)
        assert entry["copy_s"] == pytest.approx(size / (63.0e9 * PAGEABLE_SHARE))


@pytest.mark.parametrize(
    "model, why",
    [
        (
            "Picky",
            "its step fails on the meta device (RuntimeError: Tensor.item() cannot be "
            "called on meta tensors)",
        ),
        (
            "Calibrated",
            "it cannot be built on the meta device (RuntimeError: Tensor.item() "
            "cannot be called on meta",
        ),
    ],
)
def test_a_model_the_meta_device_cannot_run_is_one_line_pointing_to_compute_measured(
    estimates, model, why
):
    entry = estimates[f"text/{model}"]
    error = entry["error"]
    assert error.startswith(f"model 'usertext.text:{model}': no compute estimate: {why}"), error
    assert error.endswith(
        "or the compute measured on the target's GPU: target: {compute: measured}"
    ), error
    assert "\n" not in error and "compute_s" not in entry
    assert entry["batch_bytes"] == TEXT_BATCH_BYTES  # the copy is still the user's batch
    row = cell_row(f"text/{model}", entry, [], {**TARGET, "link_gb_per_s": 63.0}, [])
    assert row["note"] == f"no compute estimate: {error}"


def test_the_bytes_a_cell_copied_are_its_drawn_batchs_and_the_section_prices_its_copy_from_them(
    estimates, text_project, tmp_path
):
    """A real training cell of the text pipeline records what its steps copied (metrics.h2d_bytes);
    the section prices the copy from it, and for a batch of fixed shape that is the drawn batch's
    bytes."""
    entry = estimates["text/Text"]
    out = tmp_path / "cell"
    knobs = {**entry["knobs"], "python_path": [text_project], "steps": 3, "warmup_steps": 1}
    assert run(knobs, str(out)) == 0
    record = read_record(str(out / "result.json"))
    assert record.metrics["h2d_bytes"] == 3 * TEXT_BATCH_BYTES
    priced = with_measured_copy(entry, [record], entry["copy_gb_per_s"])
    assert (
        priced["batch_bytes"] == entry["batch_bytes"] and priced["batch_bytes_from"] == "measured"
    )
    assert priced["copy_s"] == pytest.approx(entry["copy_s"])


def test_a_pipeline_with_no_batch_to_draw_leaves_the_copy_unpriced_and_says_why(estimates):
    entry = estimates["missing/Text"]
    why = "no batch could be drawn from its pipeline (OSError: no such shard: lines-"
    assert entry["error"].startswith(f"model 'usertext.text:Text': no compute estimate: {why}"), (
        entry["error"]
    )
    assert entry["error"].endswith("target: {compute: measured}") and "\n" not in entry["error"]
    assert entry["batch_bytes"] is None and entry["copy_s"] == 0
    assert entry["batch_bytes_from"].startswith(f"unknown: {why}"), entry["batch_bytes_from"]
