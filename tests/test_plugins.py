"""The user's own code by import path (issue #11): factories, collate, step, the default loss rule, bad targets."""

from __future__ import annotations

import json
import sys
import textwrap
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
from feedbench.harness.batches import batch_len, default_loss, move_batch, unpinned_note
from feedbench.harness.runner import run
from feedbench.plan.cell import parse_cell
from feedbench.plan.knobs import KnobError
from feedbench.plan.plugins import content_hash, load

USER_CODE = """
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset, get_worker_info

SEEN = []


class Squares(Dataset):
    def __init__(self, n, side):
        self.n, self.side = n, side

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"image": torch.full((3, self.side, self.side), float(i % 7)), "label": i % 4}


def build_dataset(ctx, n=64, side=8):
    SEEN.append(ctx)
    return Squares(n, side)


class Stream(IterableDataset):
    def __init__(self, n, rank, world):
        self.n, self.rank, self.world = n, rank, world

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        for i in range(self.rank * workers + worker, self.n, self.world * workers):
            yield torch.full((4,), float(i)), i % 2


def build_stream(ctx, n=32):
    return Stream(n, ctx.rank, ctx.world_size)


def collate(samples):
    return {"image": torch.stack([s["image"] for s in samples]), "label": torch.tensor([s["label"] for s in samples])}


def build_model(ctx, classes=4, side=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * side * side, classes))


class DictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4))

    def forward(self, batch):
        return self.net(batch["image"])


def build_dict_model(ctx):
    return DictModel()


def build_vector_model(ctx):
    return nn.Linear(4, 2)


def train_step(model, batch, ctx):
    assert ctx.optimizer is not None and ctx.batch_size == 8
    return nn.functional.cross_entropy(model(batch["image"]), batch["label"])


def step_itself(model, batch, ctx):
    loss = nn.functional.cross_entropy(model(batch["image"]), batch["label"])
    loss.backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()
    return None


def step_float(model, batch, ctx):
    return 1.0


def broken_factory(ctx):
    raise ValueError("the user's factory broke")


def not_a_dataset(ctx):
    return [1, 2, 3]
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user project outside feedbench: userproj/data.py under tmp_path/src."""
    src = tmp_path / "src" / "userproj"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "data.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield str(tmp_path / "src")
    for name in [n for n in sys.modules if n.startswith("userproj")]:
        del sys.modules[name]


def cell(project, **knobs):
    return {
        "device": "cpu",
        "steps": 4,
        "warmup_steps": 1,
        "batch_size": 8,
        "torch_threads": 1,
        "monitor_interval_s": 5,
        "python_path": [project],
        **knobs,
    }


def result_of(out):
    return json.loads((out / "result.json").read_text())


def test_dataset_collate_model_and_step_by_import_path(project, tmp_path):
    knobs = cell(
        project,
        dataset="userproj.data:build_dataset",
        dataset_args={"n": 40, "side": 8},
        collate="userproj.data:collate",
        model="userproj.data:build_model",
        model_args={"classes": 4},
        step="userproj.data:train_step",
    )
    assert run(knobs, str(tmp_path / "out")) == 0
    result = result_of(tmp_path / "out")
    assert result["status"] == "ok" and result["metrics"]["samples"] == 4 * 8
    assert result["provenance"]["user_code"][0]["path"] == project
    assert result["provenance"]["user_code"][0]["content"] == content_hash([project])
    ctx = sys.modules["userproj.data"].SEEN[0]
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.batch_size, ctx.num_workers, ctx.seed) == (0, 1, 0, 8, 0, 0)
    assert ctx.knobs["dataset_args"] == {"n": 40, "side": 8} and str(ctx.device) == "cpu"


def test_default_loss_rule_is_recorded(project, tmp_path):
    knobs = cell(
        project,
        dataset="userproj.data:build_dataset",
        collate="userproj.data:collate",
        model="userproj.data:build_dict_model",
    )
    assert run(knobs, str(tmp_path / "out")) == 0
    assert "loss: cross-entropy against batch['label'] (no step given)" in result_of(tmp_path / "out")["adjustments"]


def test_a_step_that_does_its_own_backward(project, tmp_path):
    knobs = cell(
        project,
        dataset="userproj.data:build_dataset",
        collate="userproj.data:collate",
        model="userproj.data:build_model",
        step="userproj.data:step_itself",
    )
    assert run(knobs, str(tmp_path / "out")) == 0
    result = result_of(tmp_path / "out")
    assert result["metrics"]["steps"] == 4 and any(n.startswith("step returned None") for n in result["adjustments"])


def test_a_step_that_returns_no_tensor_is_one_line(project, tmp_path):
    knobs = cell(
        project,
        dataset="userproj.data:build_dataset",
        collate="userproj.data:collate",
        model="userproj.data:build_model",
        step="userproj.data:step_float",
    )
    assert run(knobs, str(tmp_path / "out")) == 2
    assert result_of(tmp_path / "out")["error"]["message"] == (
        "knob 'step': 'userproj.data:step_float' returned builtins.float; "
        "allowed: the loss tensor, or None after its own backward and optimizer step"
    )


def test_iterable_dataset_with_workers(project, tmp_path):
    knobs = cell(
        project,
        dataset="userproj.data:build_stream",
        model="userproj.data:build_vector_model",
        num_workers=2,
        batch_size=4,
    )
    assert run(knobs, str(tmp_path / "out")) == 0
    result = result_of(tmp_path / "out")
    assert result["status"] == "ok" and "loss: cross-entropy against batch[1] (no step given)" in result["adjustments"]


def test_factory_that_raises_is_a_failed_cell_with_its_traceback(project, tmp_path):
    knobs = cell(project, dataset="userproj.data:broken_factory", model="userproj.data:build_model")
    assert run(knobs, str(tmp_path / "out")) == 1
    error = result_of(tmp_path / "out")["error"]
    assert error["type"] == "ValueError" and "the user's factory broke" in error["message"]
    assert "broken_factory" in error["traceback"]


def test_wrong_return_type_is_one_line(project, tmp_path):
    knobs = cell(project, dataset="userproj.data:not_a_dataset", model="userproj.data:build_model")
    assert run(knobs, str(tmp_path / "out")) == 2
    message = result_of(tmp_path / "out")["error"]["message"]
    assert message == (
        "knob 'dataset': 'userproj.data:not_a_dataset' returned builtins.list; "
        "allowed: a torch.utils.data.Dataset or IterableDataset"
    )


@pytest.mark.parametrize(
    "target, reason",
    [
        ("nomodule.data:build", "ModuleNotFoundError: No module named 'nomodule'"),
        ("userproj.data:missing", "AttributeError: module 'userproj.data' has no attribute 'missing'"),
    ],
)
def test_a_target_that_does_not_import_is_one_line(project, target, reason):
    sys.path.insert(0, project)
    with pytest.raises(KnobError) as error:
        load(target, "dataset")
    assert str(error.value) == f"knob 'dataset': cannot import '{target}' ({reason})"


def test_import_path_knobs_are_checked_as_knobs():
    assert parse_cell({"dataset": "a.b:c", "model": "a.b:d", "dataset_args": {"x": 1}}).dataset_args == {"x": 1}
    with pytest.raises(
        KnobError,
        match=r"knob 'dataset': value 'a\.b' is not allowed; allowed: synthetic, .* "
        r"or package\.module:attribute",
    ):
        parse_cell({"dataset": "a.b"})
    with pytest.raises(KnobError, match="knob 'step': value 'train' is not an import path"):
        parse_cell({"step": "train"})
    with pytest.raises(KnobError, match="knob 'model_args': .* knob 'model' is not user code"):
        parse_cell({"model_args": {"x": 1}})


Pair = namedtuple("Pair", "x y")


@dataclass
class Batch:
    x: torch.Tensor
    meta: str


def test_nested_batches_are_moved_and_counted():
    batch = {"a": [torch.zeros(3, 2), Pair(torch.zeros(3), 1)], "b": Batch(torch.zeros(3, 5), "m")}
    moved = move_batch(batch, torch.device("cpu"), False)
    assert isinstance(moved["a"][1], Pair) and isinstance(moved["b"], Batch) and moved["b"].meta == "m"
    assert batch_len(batch) == 3 and batch_len(Batch(torch.zeros(6, 1), "m")) == 6


def test_unpinned_first_batch_is_named():
    assert "1 of 1 tensors, batch type Batch" in unpinned_note(Batch(torch.zeros(2), "m"))
    assert unpinned_note({"meta": "no tensors"}) is None


class Hidden:
    """A batch type that keeps its tensors to itself, as a user's may; `pinnable` gives it a pin_memory()."""

    def __init__(self, pinnable: bool = False):
        self.images = torch.zeros(2, 3)
        if pinnable:
            self.pin_memory = lambda: self


def test_an_opaque_batch_without_pin_memory_is_named_unpinned():
    """The DataLoader hands back an object it cannot walk as it is (seen on an H200: the note was missing, #27)."""
    assert "its tensors hidden from feedbench and from the DataLoader, batch type Hidden" in unpinned_note(Hidden())
    assert unpinned_note(Hidden(pinnable=True)) is None


def test_default_loss_rules():
    assert default_loss(torch.tensor(2.0), None)[1] == "the model's output (a scalar)"
    with pytest.raises(KnobError, match="knob 'step': no loss"):
        default_loss(torch.zeros(2, 3), {"image": torch.zeros(2)})


def test_argument_axes_name_their_cells_and_fold_into_the_args(project):
    from feedbench.plan.matrix import build_cells

    config = {
        "python_path": [project],
        "defaults": {"dataset_args": {"n": 40}},
        "experiments": {
            "mine": {
                "base": {
                    "dataset": "userproj.data:build_dataset",
                    "model": "userproj.data:build_model",
                    "collate": "userproj.data:collate",
                },
                "matrix": {"dataset_args.side": [8, 16], "num_workers": [0, 2]},
                "exclude": [{"dataset_args.side": 16, "num_workers": 2}],
                "include": [{"model_args.classes": 3}],
            }
        },
    }
    cells = build_cells(config)
    assert [c.id for c in cells] == [
        "dataset_args.side-8_num_workers-0",
        "dataset_args.side-8_num_workers-2",
        "dataset_args.side-16_num_workers-0",
        "dataset_args.side-none_num_workers-0_model_args.classes-3",
    ]
    assert cells[2].knobs["dataset_args"] == {"n": 40, "side": 16} and cells[2].parsed.dataset_args["side"] == 16
    assert cells[3].parsed.model_args == {"classes": 3} and cells[0].parsed.python_path == [project]


def test_a_target_that_does_not_import_stops_the_config_with_its_key_path(project):
    from feedbench.plan.matrix import ConfigError, build_cells

    config = {
        "python_path": [project],
        "experiments": {
            "mine": {"base": {"dataset": "myproj.data:build_dataset", "model": "userproj.data:build_model"}}
        },
    }
    with pytest.raises(ConfigError) as error:
        build_cells(config)
    assert str(error.value) == (
        "experiments.mine.base.dataset: cannot import 'myproj.data:build_dataset' "
        "(ModuleNotFoundError: No module named 'myproj')"
    )


def test_builtin_cells_do_not_carry_the_python_path(project):
    from feedbench.plan.matrix import build_cells

    cells = build_cells({"python_path": [project], "experiments": {"plain": {"base": {"steps": 3}}}})
    assert "python_path" not in cells[0].knobs


def test_compute_ceiling_replays_real_batches_of_the_users_pipeline(project, tmp_path):
    knobs = cell(
        project,
        scenario="compute",
        dataset="userproj.data:build_dataset",
        collate="userproj.data:collate",
        model="userproj.data:build_dict_model",
        resident_batches=3,
        steps=5,
    )
    assert run(knobs, str(tmp_path / "out")) == 0
    result = result_of(tmp_path / "out")
    assert (
        result["status"] == "ok" and result["metrics"]["samples"] == 5 * 8 and result["cell"]["resident_batches"] == 3
    )
