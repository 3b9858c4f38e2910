"""What the config path takes, as PyTorch does (issue #48, item 7): a dataset is anything the
DataLoader takes (a Hugging Face `datasets.Dataset`, an object with __getitem__ and __len__, an
object with __iter__ alone), a batch any Mapping (transformers' BatchEncoding), its samples counted
right, and a cell that counted none fails in one line; a loss may be a class, built with
loss_args. Each cell runs in this process on tiny data."""

from __future__ import annotations

import importlib.util

import pytest


def needs(*packages: str):
    """Skipped where a package the test's real object comes from is not installed: Hugging Face's
    datasets and transformers are no dependencies of feedbench."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (not installed)")


USER_MODULE = "takes_user"
USER_CODE = '''
from collections import UserDict

import torch
from torch import nn

ROWS = [{"input_ids": [i % 5, 1, 2, 3], "label": i % 2} for i in range(24)]


class Rows:
    """A map-style dataset as Hugging Face's datasets.Dataset behaves: no torch base class, an int
    index gives a dict, and __getitems__ fetches a batch in one call (the DataLoader calls it)."""

    def __init__(self, n=24):
        self.n, self.batched = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        row = ROWS[i]
        return {"input_ids": torch.tensor(row["input_ids"]), "label": torch.tensor(row["label"])}

    def __getitems__(self, indices):
        self.batched += 1
        return [self[i] for i in indices]


class TorchRows(Rows, torch.utils.data.Dataset):
    """The same as a torch Dataset: the batch tests need no duck-typed dataset."""


class Lines:
    """Only iterable: what a generator-backed reader is."""

    def __iter__(self):
        for i in range(24):
            yield torch.full((4,), float(i % 5)).long(), torch.tensor(i % 2)


def hf_rows(n=24):
    import datasets

    return datasets.Dataset.from_dict({k: [r[k] for r in ROWS[:n]] for k in ROWS[0]}).with_format(
        "torch"
    )


class Encoding(UserDict):
    """A Mapping that is no dict, as transformers' BatchEncoding (a UserDict)."""


def encode(samples):
    ids = torch.stack([s["input_ids"] for s in samples])
    return Encoding({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                     "labels": torch.stack([s["label"] for s in samples])})


def batch_encoding(samples):
    from transformers import BatchEncoding

    return BatchEncoding(dict(encode(samples)))


def forgot_return():
    ROWS.copy()


def words(samples):
    return [str(s["label"]) for s in samples]


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(8, 2)

    def forward(self, input_ids, attention_mask=None):
        return self.bag(input_ids)


BUILT = []


class Smoothed(nn.CrossEntropyLoss):
    """A loss class as timm's LabelSmoothingCrossEntropy: built with its arguments, then called."""

    def __init__(self, smoothing=0.0):
        super().__init__(label_smoothing=smoothing)
        BUILT.append(smoothing)


class Weighted(nn.CrossEntropyLoss):
    """A loss class with a tensor of its own (a buffer): built on the host, used on the device."""

    def __init__(self, weights=(1.0, 1.0)):
        super().__init__(weight=torch.tensor(weights))


def plain_loss(output, target):
    return nn.functional.cross_entropy(output, target)


def step(model, batch, ctx):
    return nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])
'''
M = USER_MODULE
STEPS, BATCH = 3, 4


def knobs(src: str, **more) -> dict:
    return {
        "python_path": [src],
        "model": f"{M}:Bag",
        "steps": STEPS,
        "warmup_steps": 1,
        "batch_size": BATCH,
        "torch_threads": 1,
        "monitor_interval_s": 5,
        **more,
    }


@pytest.mark.parametrize(
    "dataset, more",
    [
        (f"{M}:Rows", {"forward_keys": ["input_ids"]}),
        (f"{M}:Lines", {}),
        pytest.param(
            f"{M}:hf_rows",
            {"forward_keys": ["input_ids"]},
            marks=needs("datasets"),
        ),
    ],
)
def test_a_dataset_is_anything_the_dataloader_takes(run_cell, user_module, dataset, more):
    """Stage timing on: the sample, its profile and the loss work on each; a dataset whose
    __getitems__ the timing bypasses says so."""
    code, result = run_cell(**knobs(user_module, dataset=dataset, stage_timing=True, **more))
    assert code == 0 and result["status"] == "ok", result.get("error")
    assert result["metrics"]["samples"] == STEPS * BATCH
    assert result["metrics"]["stages"]["samples"] >= STEPS * BATCH
    notes = " ".join(result["adjustments"])
    assert ("__getitems__" in notes) == (dataset != f"{M}:Lines"), notes


def test_what_no_dataloader_takes_is_one_line(run_cell, user_module):
    code, result = run_cell(**knobs(user_module, dataset=f"{M}:forgot_return"))
    assert code == 2 and result["error"]["message"].startswith(
        f"knob 'dataset': '{M}:forgot_return' returned builtins.NoneType; allowed: what "
        "torch.utils.data.DataLoader takes"
    )


@pytest.mark.parametrize(
    "collate",
    [
        "encode",
        pytest.param(
            "batch_encoding", id="transformers.BatchEncoding", marks=needs("transformers")
        ),
    ],
)
def test_a_mapping_batch_is_counted_copied_and_fed_by_its_keys(run_cell, user_module, collate):
    """A UserDict batch, and transformers' BatchEncoding where installed: with the user's step, and
    with forward_keys and label_key for a model without one."""
    base = knobs(user_module, dataset=f"{M}:TorchRows", collate=f"{M}:{collate}")
    code, result = run_cell(**base, step=f"{M}:step")
    assert code == 0 and result["status"] == "ok", result.get("error")
    assert result["metrics"]["samples"] == STEPS * BATCH
    assert not any("fewer samples" in note for note in result["adjustments"])
    # input_ids, attention_mask and labels: 4 + 4 + 1 int64 per sample, copied each step
    assert result["metrics"]["h2d_bytes"] == STEPS * BATCH * 9 * 8
    keyed = dict(base, forward_keys=["input_ids", "attention_mask"], label_key="labels")
    code, result = run_cell(**keyed)
    assert code == 0 and result["metrics"]["samples"] == STEPS * BATCH
    assert "loss: cross-entropy against batch['labels'] (no step given)" in result["adjustments"]


def test_a_mapping_batch_keeps_its_type_on_the_device(user_module):
    """The copy rebuilds the batch as torch's pin_memory does: a BatchEncoding stays one."""
    transformers = pytest.importorskip("transformers")
    from feedbench.core.plugins import add_paths, load
    from feedbench.harness.batches import move_batch

    add_paths([user_module])
    rows = load(f"{M}:TorchRows", "dataset")()
    batch = load(f"{M}:batch_encoding", "collate")([rows[i] for i in range(BATCH)])
    moved = move_batch(batch, "meta", False)
    assert isinstance(moved, transformers.BatchEncoding) and moved is not batch
    assert {k: v.device.type for k, v in moved.items()} == dict.fromkeys(batch, "meta")


def test_a_cell_that_counts_no_samples_fails_in_one_line(run_cell, user_module):
    code, result = run_cell(
        **knobs(user_module, dataset=f"{M}:TorchRows", collate=f"{M}:words", scenario="loader")
    )
    assert code == 2 and result["status"] == "failed"
    assert result["error"]["message"] == (
        "no samples counted: the batch (a list) holds no tensor with a first dimension to count "
        "its samples by; allowed: a batch whose samples lie along the first dimension of its "
        "tensors (a tensor, or tensors in a Mapping, list, tuple, namedtuple or dataclass)"
    )
    assert not any("fewer samples" in note for note in result["adjustments"])


def test_a_loss_class_is_built_with_loss_args_then_called(run_cell, user_module):
    import sys

    base = knobs(user_module, dataset=f"{M}:TorchRows", forward_keys=["input_ids"])
    code, result = run_cell(**base, loss=f"{M}:Smoothed", loss_args={"smoothing": 0.25})
    assert code == 0 and result["status"] == "ok", result.get("error")
    assert sys.modules[M].BUILT == [0.25]  # built once, with its arguments
    assert f"loss: {M}:Smoothed against batch['label'] (no step given)" in result["adjustments"]
    code, result = run_cell(**base, loss="torch.nn:CrossEntropyLoss")
    assert code == 0 and result["status"] == "ok", result.get("error")


@pytest.mark.gpu
def test_on_a_gpu_a_mapping_batch_is_pinned_and_streamed_and_a_loss_class_moved(
    run_cell, user_module
):
    """The DataLoader pins a UserDict batch; the stream prefetcher copies it (its tensors seen, so
    no note that it cannot record their stream); the loss class's weight moves to the GPU."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    code, result = run_cell(
        **knobs(user_module, dataset=f"{M}:TorchRows", collate=f"{M}:encode"),
        forward_keys=["input_ids"],
        label_key="labels",
        loss=f"{M}:Weighted",
        loss_args={"weights": [1.0, 2.0]},
        device="cuda",
        pin_memory=True,
        device_prefetch="stream",
    )
    assert code == 0 and result["status"] == "ok", result.get("error")
    assert result["metrics"]["samples"] == STEPS * BATCH
    assert not any("unpinned" in a or "record_stream" in a for a in result["adjustments"]), result[
        "adjustments"
    ]


@pytest.mark.parametrize(
    "loss, loss_args, error",
    [
        (
            f"{M}:Smoothed",
            {"smothing": 0.1},
            f"knob 'loss_args': key 'smothing' is not an argument of '{M}:Smoothed' (did you "
            "mean 'smoothing'?); allowed: smoothing",
        ),
        (
            f"{M}:plain_loss",
            {"smoothing": 0.1},
            f"knob 'loss_args': '{M}:plain_loss' is a function, called as f(output, target) with "
            "no loss_args; allowed: {}, or a loss class (built as cls(**loss_args))",
        ),
        (
            "mse",
            {"smoothing": 0.1},
            "knob 'loss_args': value {'smoothing': 0.1} is set but knob 'loss' is not user code; "
            "allowed: {} or a package.module:attribute loss",
        ),
    ],
)
def test_the_plan_checks_loss_args_against_the_loss(user_module, loss, loss_args, error):
    """Before any job, as the plan checks dataset_args and model_args (plan.matrix.check_cell)."""
    from feedbench.core.cell import parse_cell
    from feedbench.core.knobs import KnobError
    from feedbench.core.plugins import resolve_all

    raw = knobs(user_module, dataset=f"{M}:TorchRows", loss=loss, loss_args=loss_args)
    with pytest.raises(KnobError) as raised:
        resolve_all(parse_cell(raw))
    assert str(raised.value) == error


@pytest.mark.parametrize(
    "dataset, collate",
    [
        ("Rows", "encode"),
        pytest.param(
            "hf_rows",
            "batch_encoding",
            marks=needs("datasets", "transformers"),
        ),
    ],
)
def test_a_datasets_style_dataset_and_a_mapping_batch_pass_the_preflight(
    user_module, tmp_path, dataset, collate
):
    """#48's Done-when, through the preflight's own check (feedbench.harness.preflight.run): a
    training cell and its loader ceiling; a batch with no sample to count fails it, at the batch."""
    import json

    from feedbench.harness import preflight

    cell = {
        **knobs(user_module, dataset=f"{M}:{dataset}", collate=f"{M}:{collate}"),
        "experiment": "e",
        "cell": "base",
        "device": "cpu",
        "forward_keys": ["input_ids", "attention_mask"],
        "label_key": "labels",
    }
    out = tmp_path / "preflight.json"
    loader = dict(cell, cell="loader", scenario="loader")
    assert preflight.run([cell, loader], str(out), str(tmp_path / "e.log")) == 0
    record = json.loads(out.read_text())
    assert record["status"] == "ok", record["errors"]
    assert [c["stages"][-1] for c in record["checked"]] == ["step", "batch"]
    words = dict(loader, collate=f"{M}:words")
    assert preflight.run([words], str(out), str(tmp_path / "e.log")) == 0
    (error,) = json.loads(out.read_text())["errors"]
    assert (error["stage"], error["message"].split(":")[0]) == ("batch", "no samples counted")
