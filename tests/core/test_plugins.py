"""The user's own code by import path: factories, collate, step, the default loss rule, bad
targets."""

from __future__ import annotations

import json
import sys
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
from feedbench.core.cell import parse_cell
from feedbench.core.knobs import KnobError
from feedbench.core.plugins import content_hash, load, resolve_all
from feedbench.harness.batches import batch_len, default_loss, move_batch, unpinned_note
from feedbench.harness.runner import run
from helpers.cells import user_package

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


class TokenBatches(Dataset):  # token ids with a mask and a label: a text pipeline's dict samples

    def __init__(self, n, length=12, vocab=50):
        self.n, self.length, self.vocab = n, length, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.arange(self.length) * (i + 1) % self.vocab
        return {"input_ids": ids, "attention_mask": torch.ones(self.length), "labels": i % 3}


class BagOfWords(nn.Module):  # a forward with several named inputs, as a text model's

    def __init__(self, vocab=50, dim=8, classes=3):
        super().__init__()
        self.embed, self.out = nn.Embedding(vocab, dim), nn.Linear(dim, classes)

    def forward(self, input_ids, attention_mask):
        return self.out((self.embed(input_ids) * attention_mask[..., None]).mean(1))


OPTIMIZERS_SEEN = []


def recording_step(model, batch, ctx):
    OPTIMIZERS_SEEN.append((type(ctx.optimizer).__name__, ctx.optimizer.defaults))
    return nn.functional.cross_entropy(model(batch), batch["label"])


class Classifier(nn.Module):  # a model class of the user's own, with no ctx

    def __init__(self, classes, side=8):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * side * side, classes))

    def forward(self, batch):
        return self.net(batch["image"])


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


def build_from(ctx, root, n=16):
    import os

    assert os.path.isdir(root), root
    return Squares(n, 4)


def not_a_dataset(ctx):
    return 3  # no __getitem__, no __iter__: nothing a DataLoader takes


class Readings(Dataset):  # a regression: 8 readings and the next one, as a tuple

    def __len__(self):
        return 32

    def __getitem__(self, i):
        x = torch.arange(8, dtype=torch.float32) + i
        return x, x.sum() / 8


def forecaster():
    return nn.Linear(8, 1)  # one output per sample: (batch, 1) against a (batch,) target


LOSSES_SEEN = []


def absolute_error(output, target):
    LOSSES_SEEN.append((tuple(output.shape), tuple(target.shape)))
    return (output.squeeze(-1) - target).abs().mean()


def per_sample(output, target):
    return (output.squeeze(-1) - target).abs()  # not reduced: refused
"""  # noqa: E501


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user project outside feedbench: userproj/data.py under tmp_path/src."""
    yield from user_package(tmp_path, monkeypatch, "userproj", "data.py", USER_CODE)


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


def classes_cell(project, **knobs):
    """A cell of the user's Dataset class and model class named as they are (no ctx, no adapter)."""
    return cell(
        project,
        dataset="userproj.data:Squares",
        dataset_args={"n": 24, "side": 8},
        collate="userproj.data:collate",
        model="userproj.data:Classifier",
        model_args={"classes": 4},
        **knobs,
    )


def built_cell(project, **knobs):
    """A cell of the user's factories, which take ctx: build_dataset, collate and build_model,
    `knobs` over them."""
    factories = {
        "dataset": "userproj.data:build_dataset",
        "collate": "userproj.data:collate",
        "model": "userproj.data:build_model",
    }
    return cell(project, **{**factories, **knobs})


def ran(knobs: dict, out, code: int = 0) -> dict:
    """The result of the cell `knobs` run in this process into `out`; its exit code is `code`."""
    assert run(knobs, str(out)) == code
    return json.loads((out / "result.json").read_text())


def test_dataset_collate_model_and_step_by_import_path(project, tmp_path):
    knobs = built_cell(
        project,
        dataset_args={"n": 40, "side": 8},
        model_args={"classes": 4},
        step="userproj.data:train_step",
    )
    result = ran(knobs, tmp_path / "out")
    assert result["status"] == "ok" and result["metrics"]["samples"] == 4 * 8
    assert result["provenance"]["user_code"][0]["path"] == project
    assert result["provenance"]["user_code"][0]["content"] == content_hash([project])
    ctx = sys.modules["userproj.data"].SEEN[0]
    assert (
        ctx.rank,
        ctx.world_size,
        ctx.local_rank,
        ctx.batch_size,
        ctx.num_workers,
        ctx.seed,
    ) == (0, 1, 0, 8, 0, 0)
    assert ctx.knobs["dataset_args"] == {"n": 40, "side": 8} and str(ctx.device) == "cpu"


def test_a_dataset_class_and_a_model_class_named_as_they_are(project, tmp_path):
    """No adapter: a Dataset class and a model class whose signatures take no ctx are called with
    their arguments alone (core.plugins.takes_ctx), and their arguments are checked against those
    signatures."""
    knobs = classes_cell(project)
    result = ran(knobs, tmp_path / "out")
    assert result["status"] == "ok" and result["metrics"]["samples"] == 4 * 8, result.get("error")
    misspelled = parse_cell({**knobs, "model_args": {"clases": 4}})
    with pytest.raises(
        KnobError, match="key 'clases' is not an argument of 'userproj.data:Classifier'"
    ):
        resolve_all(misspelled)


@pytest.mark.parametrize(
    "optimizer, args, name",
    [
        ("adamw", {"betas": [0.8, 0.95]}, "AdamW"),
        ("adam", {}, "Adam"),
        ("torch.optim:RMSprop", {"lr": 0.002, "alpha": 0.9}, "RMSprop"),
    ],
)
def test_the_optimizer_is_a_knob(project, tmp_path, optimizer, args, name):
    """A user keeps AdamW (or any optimizer, by import path) without writing a step: the step's
    optimizer is the knob's, with its arguments."""
    knobs = classes_cell(
        project,
        step="userproj.data:recording_step",
        optimizer=optimizer,
        optimizer_args=args,
        weight_decay=0.01,
    )
    assert ran(knobs, tmp_path / "out")["status"] == "ok"
    seen, defaults = sys.modules["userproj.data"].OPTIMIZERS_SEEN[-1]
    assert seen == name and all(
        defaults[k] == (tuple(v) if isinstance(v, list) else v) for k, v in args.items()
    )
    if optimizer in ("adam", "adamw"):
        # the cell's lr and weight_decay
        assert defaults["lr"] == 0.01 and defaults["weight_decay"] == 0.01


def test_a_model_with_named_inputs_runs_without_a_step(project, tmp_path):
    """forward_keys: the dict batch's keys go to forward by name, and label_key names the target: a
    text model with input_ids and attention_mask, with AdamW, and no hand-written step; a misspelled
    key is one line."""
    knobs = cell(
        project,
        dataset="userproj.data:TokenBatches",
        dataset_args={"n": 32},
        model="userproj.data:BagOfWords",
        forward_keys=["input_ids", "attention_mask"],
        label_key="labels",
        optimizer="adamw",
    )
    result = ran(knobs, tmp_path / "out")
    assert result["status"] == "ok", result.get("error")
    assert "loss: cross-entropy against batch['labels'] (no step given)" in result["adjustments"]
    knobs["forward_keys"] = ["input_idz", "attention_mask"]
    failed = ran(knobs, tmp_path / "typo", code=2)
    assert failed["status"] == "failed"
    assert failed["error"]["message"] == (
        "knob 'forward_keys': the batch has no key 'input_idz' (did you mean 'input_ids'?); "
        "allowed: input_ids, attention_mask, labels"
    )


def test_a_bad_optimizer_is_one_line():
    with pytest.raises(KnobError) as error:
        parse_cell({"optimizer": "adamm"})
    assert str(error.value) == (
        "knob 'optimizer': value 'adamm' is not allowed; allowed: sgd, adam, adamw or "
        "package.module:attribute"
    )
    with pytest.raises(
        KnobError, match="knob 'momentum': value 0.9 is SGD's, not allowed with optimizer 'adam'"
    ):
        parse_cell({"optimizer": "adam", "momentum": 0.9})
    with pytest.raises(
        KnobError,
        match=r"cannot import 'torch.optim:AdamX' " r"\(AttributeError: .*did you mean 'Adam",
    ):
        load("torch.optim:AdamX", "optimizer")


def test_default_loss_rule_is_recorded(project, tmp_path):
    knobs = built_cell(project, model="userproj.data:build_dict_model")
    result = ran(knobs, tmp_path / "out")
    assert "loss: cross-entropy against batch['label'] (no step given)" in result["adjustments"]


def test_a_step_that_does_its_own_backward(project, tmp_path):
    knobs = built_cell(project, step="userproj.data:step_itself")
    result = ran(knobs, tmp_path / "out")
    assert result["metrics"]["steps"] == 4 and any(
        n.startswith("step returned None") for n in result["adjustments"]
    )


def test_a_step_that_returns_no_tensor_is_one_line(project, tmp_path):
    knobs = built_cell(project, step="userproj.data:step_float")
    assert ran(knobs, tmp_path / "out", code=2)["error"]["message"] == (
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
    result = ran(knobs, tmp_path / "out")
    assert (
        result["status"] == "ok"
        and "loss: cross-entropy against batch[1] (no step given)" in result["adjustments"]
    )


def test_factory_that_raises_is_a_failed_cell_with_its_traceback(project, tmp_path):
    knobs = cell(project, dataset="userproj.data:broken_factory", model="userproj.data:build_model")
    error = ran(knobs, tmp_path / "out", code=1)["error"]
    assert error["type"] == "ValueError" and "the user's factory broke" in error["message"]
    assert "broken_factory" in error["traceback"]


def test_wrong_return_type_is_one_line(project, tmp_path):
    knobs = cell(project, dataset="userproj.data:not_a_dataset", model="userproj.data:build_model")
    message = ran(knobs, tmp_path / "out", code=2)["error"]["message"]
    assert message == (
        "knob 'dataset': 'userproj.data:not_a_dataset' returned builtins.int; allowed: what "
        "torch.utils.data.DataLoader takes: an object with __getitem__ and __len__ (a torch "
        "Dataset, a Hugging Face datasets.Dataset, a list) or with __iter__ (an IterableDataset, "
        "a stream)"
    )


@pytest.mark.parametrize(
    "target, reason",
    [
        ("nomodule.data:build", "ModuleNotFoundError: No module named 'nomodule'"),
        (
            "userproj.data:missing",
            "AttributeError: module 'userproj.data' has no attribute 'missing'",
        ),
    ],
)
def test_a_target_that_does_not_import_is_one_line(project, target, reason):
    sys.path.insert(0, project)
    with pytest.raises(KnobError) as error:
        load(target, "dataset")
    assert str(error.value) == f"knob 'dataset': cannot import '{target}' ({reason})"


def test_a_misspelled_attribute_gets_the_closest_name(project):
    sys.path.insert(0, project)
    with pytest.raises(KnobError) as error:
        load("userproj.data:build_datset", "dataset")
    assert str(error.value) == (
        "knob 'dataset': cannot import 'userproj.data:build_datset' (AttributeError: module "
        "'userproj.data' has no attribute 'build_datset' (did you mean 'build_dataset'?))"
    )


def test_factory_arguments_are_checked_against_its_signature_before_any_job(project):
    """`dataset_args` and `model_args` keys against the factory's signature (f(ctx, **args)): a typo
    is one line with the closest name, from the config's own key path, where it was a TypeError in
    every cell."""
    from feedbench.plan.matrix import ConfigError, build_cells

    def config(**args):
        base = {
            "dataset": "userproj.data:build_dataset",
            "model": "userproj.data:build_model",
            **args,
        }
        return {"python_path": [project], "experiments": {"mine": {"base": base}}}

    assert len(build_cells(config(dataset_args={"n": 16, "side": 4}))) == 1
    with pytest.raises(ConfigError) as error:
        build_cells(config(dataset_args={"n": 16, "sied": 4}))
    assert str(error.value) == (
        "experiments.mine.base.dataset_args: key 'sied' is not an argument of "
        "'userproj.data:build_dataset' (did you mean 'side'?); allowed: n, side"
    )
    with pytest.raises(
        ConfigError,
        match=r"model_args: key 'width' is not an argument of " r"'userproj.data:build_model'",
    ):
        build_cells(config(model_args={"width": 3}))


def test_relative_paths_in_a_factorys_arguments_follow_the_config_file(project, tmp_path):
    """`./` and `../` in dataset_args are relative to the config file's folder, as python_path is,
    not to Snakemake's --directory; one that does not exist is one line before any job."""
    from feedbench.plan.matrix import ConfigError, build_cells

    folder = tmp_path / "conf"
    (folder / "data").mkdir(parents=True)
    base = {
        "dataset": "userproj.data:build_from",
        "model": "userproj.data:build_model",
        "dataset_args": {"root": ""},
    }
    config = {"python_path": [project], "experiments": {"mine": {"base": base}}}
    base["dataset_args"]["root"] = "./data"
    cells = build_cells(config, args_folder=str(folder))
    assert cells[0].knobs["dataset_args"] == {"root": str(folder / "data")}
    base["dataset_args"]["root"] = "../missing"
    with pytest.raises(ConfigError) as error:
        build_cells(config, args_folder=str(folder))
    assert str(error.value) == (
        "experiments.mine.base.dataset_args.root: path '../missing' does not exist (relative to "
        f"the config file's folder, {folder}: {tmp_path / 'missing'}); allowed: an existing path"
    )


def test_check_args_reads_keyword_only_var_positional_and_required_arguments():
    from feedbench.core.plugins import check_args

    def keyword_only(ctx, *, root, crop=224):
        return ctx

    def var_positional(*args, root):
        return args

    def anything(ctx, **kwargs):
        return kwargs

    check_args(keyword_only, {"root": "x", "crop": 160}, "p.m:keyword_only", "dataset_args")
    check_args(var_positional, {"root": "x"}, "p.m:var_positional", "dataset_args")
    check_args(anything, {"whatever": 1}, "p.m:anything", "dataset_args")
    with pytest.raises(KnobError) as error:
        check_args(keyword_only, {"crop": 160}, "p.m:keyword_only", "dataset_args")
    assert (
        str(error.value) == "knob 'dataset_args': 'p.m:keyword_only' needs 'root'; "
        "allowed: add it to dataset_args"
    )
    with pytest.raises(KnobError, match="key 'ctx' is not an argument"):
        check_args(keyword_only, {"ctx": 1, "root": "x"}, "p.m:keyword_only", "dataset_args")


def test_import_path_knobs_are_checked_as_knobs():
    assert parse_cell(
        {"dataset": "a.b:c", "model": "a.b:d", "dataset_args": {"x": 1}}
    ).dataset_args == {"x": 1}
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
    assert (
        isinstance(moved["a"][1], Pair) and isinstance(moved["b"], Batch) and moved["b"].meta == "m"
    )
    assert batch_len(batch) == 3 and batch_len(Batch(torch.zeros(6, 1), "m")) == 6


def test_unpinned_first_batch_is_named():
    assert "1 of 1 host tensors, batch type Batch" in unpinned_note(Batch(torch.zeros(2), "m"))
    assert unpinned_note({"meta": "no tensors"}) is None


class Hidden:
    """A batch type that keeps its tensors to itself, as a user's may; `pinnable` gives it a
    pin_memory()."""

    def __init__(self, pinnable: bool = False):
        self.images = torch.zeros(2, 3)
        if pinnable:
            self.pin_memory = lambda: self


def test_an_opaque_batch_without_pin_memory_is_named_unpinned():
    """The DataLoader hands back an object it cannot walk as it is (seen on an H200: the note was
    missing)."""
    assert (
        "its tensors hidden from feedbench and from the DataLoader, batch type Hidden"
        in unpinned_note(Hidden())
    )
    assert unpinned_note(Hidden(pinnable=True)) is None


def test_default_loss_rules():
    assert default_loss(torch.tensor(2.0), None)[1] == "the model's output (a scalar)"
    with pytest.raises(KnobError, match="knob 'step': no loss"):
        default_loss(torch.zeros(2, 3), (torch.zeros(2),))
    # a dict batch: the label_key it lacks, with the keys it has
    with pytest.raises(KnobError) as missing:
        default_loss(torch.zeros(2, 3), {"image": torch.zeros(2), "lable": torch.zeros(2)})
    assert str(missing.value) == (
        "knob 'label_key': the model's output has no loss and the batch has no key 'label' (did "
        "you mean 'lable'?) to take cross-entropy against; allowed: image, lable, or a step "
        "(package.module:train_step) returning the loss"
    )


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
    assert (
        cells[2].knobs["dataset_args"] == {"n": 40, "side": 16}
        and cells[2].parsed.dataset_args["side"] == 16
    )
    assert cells[3].parsed.model_args == {"classes": 3} and cells[0].parsed.python_path == [project]


def test_a_target_that_does_not_import_stops_the_config_with_its_key_path(project):
    from feedbench.plan.matrix import ConfigError, build_cells

    config = {
        "python_path": [project],
        "experiments": {
            "mine": {
                "base": {
                    "dataset": "myproj.data:build_dataset",
                    "model": "userproj.data:build_model",
                }
            }
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

    cells = build_cells(
        {"python_path": [project], "experiments": {"plain": {"base": {"steps": 3}}}}
    )
    assert "python_path" not in cells[0].knobs


def test_compute_ceiling_replays_real_batches_of_the_users_pipeline(project, tmp_path):
    knobs = built_cell(
        project,
        scenario="compute",
        model="userproj.data:build_dict_model",
        resident_batches=3,
        steps=5,
    )
    result = ran(knobs, tmp_path / "out")
    assert (
        result["status"] == "ok"
        and result["metrics"]["samples"] == 5 * 8
        and result["cell"]["resident_batches"] == 3
    )


def regression_cell(project, **knobs):
    return cell(
        project,
        dataset="userproj.data:Readings",
        model="userproj.data:forecaster",
        optimizer="adamw",
        **knobs,
    )


@pytest.mark.parametrize(
    "loss, rule",
    [
        ("mse", "loss: mse against batch[1], viewed as (8, 1) (no step given)"),
        (
            "userproj.data:absolute_error",
            "loss: userproj.data:absolute_error against batch[1] (no step given)",
        ),
    ],
)
def test_a_regression_keeps_its_loss_without_a_step(project, tmp_path, loss, rule):
    """Knob `loss`: a regression model without a step trains on mse (torch.nn.functional's) or on a
    loss of the user's own, with AdamW, where the default cross-entropy is refused (one output per
    sample)."""
    result = ran(regression_cell(project, loss=loss), tmp_path / "out")
    assert result["status"] == "ok", result.get("error")
    assert rule in result["adjustments"]
    # the user's function got the model's output and the target as they are
    if loss.startswith("userproj"):
        assert sys.modules["userproj.data"].LOSSES_SEEN[-1] == ((8, 1), (8,))


def test_a_regression_loss_is_taken_in_the_outputs_shape_not_broadcast():
    """(batch, 1) against (batch,): torch would broadcast mse to a batch x batch loss; the target is
    viewed in the output's shape, so the loss is the per-sample one."""
    output, target = torch.tensor([[1.0], [2.0], [4.0]]), torch.tensor([1, 1, 1])
    loss, rule = default_loss(output, (None, target), loss="mse")
    assert (
        loss.item() == pytest.approx((0 + 1 + 9) / 3)
        and rule == "mse against batch[1], viewed as (3, 1)"
    )
    loss, _ = default_loss(output, {"label": target.float()}, loss="l1")
    assert loss.item() == pytest.approx((0 + 1 + 3) / 3)


def test_a_bad_loss_is_one_line(project):
    with pytest.raises(KnobError) as error:
        parse_cell({"loss": "huber"})
    assert str(error.value) == (
        "knob 'loss': value 'huber' is not allowed; allowed: auto, cross_entropy, mse, l1, "
        "smooth_l1 or package.module:attribute"
    )
    with pytest.raises(
        KnobError,
        match="knob 'loss': value 'mse' is the loss of a model of your own without a step",
    ):
        parse_cell({"loss": "mse", "model": "mlp"})
    with pytest.raises(KnobError, match="its step computes the loss"):
        parse_cell(regression_cell(project, loss="mse", step="userproj.data:train_step"))
    sizes = (
        r"mse needs the model's output and batch\[1\] of one size, and they are \(4, 2\) "
        r"and \(4,\)"
    )
    with pytest.raises(KnobError, match=sizes):
        default_loss(torch.zeros(4, 2), (None, torch.zeros(4)), loss="mse")
    sys.path.insert(0, project)  # the project fixture restores sys.path
    per_sample = load("userproj.data:per_sample", "loss")
    with pytest.raises(
        KnobError, match=r"knob 'loss': 'userproj.data:per_sample' returned " r"torch.Tensor \(4,\)"
    ):
        default_loss(
            torch.zeros(4, 1),
            (None, torch.zeros(4)),
            "label",
            "userproj.data:per_sample",
            per_sample,
        )
