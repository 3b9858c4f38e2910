"""The preflight's check (feedbench.core.preflight): each combination of the user's code in an
experiment, built once by the paths a cell takes, before any of its cells runs.

For each combination, its first cell, as one process on one device with no loader workers: the
dataset (data.build_dataset), one sample, one batch through the loader's collate
(data.build_loader), then, for a cell with a model, the model and optimizer and one step on the
copied batch (loop.TrainStep, the copy by the user's to_device if any). Each stage names what runs
in it, so a failure says which factory raised. The device is the cell's own, fitted to this machine
as the cell is (fit.resolve): a model or step that needs CUDA passes where its cells would, and a
fault only the device shows (a batch left on the host) is found.

A failure stops only the stages that need what it failed to make: the model is built though the
data failed; a model without a step is called, its loss taken, and a loss class built as three
checks, so a bad forward_keys, label_key and loss are found in one run; and every combination is
checked. Each distinct failure is kept (`errors`), the first also as `error`.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import torch

from ..core import preflight as shared
from ..core.cell import parse_cell
from ..core.knobs import KNOBS, KnobError
from ..core.plugins import plugins_of, resolve_all
from . import command
from .batches import label_target, uncounted
from .data import build_dataset, build_loader
from .distributed import World, rank_device
from .fit import resolve
from .loop import PHASES_OF, Measurement, TrainStep, context
from .models import build_loss, build_optimizer
from .prefetch import to_device
from .runner import error_record
from .stages import name_transforms
from .timing import PhaseClock, synchronize

# One process on one device, no loader workers: what the preflight runs each combination's first
# cell as.
ONE_PROCESS = {"num_workers": 0, "parallel": "none", "nodes": 1, "gpus_per_node": 1}


class Failed(Exception):
    """A stage of the preflight raised: which one, and what ran in it."""

    def __init__(self, stage: str, factory: str, error: BaseException):
        super().__init__(f"{stage}: {factory}")
        self.stage, self.factory, self.error = stage, factory, error


# What a stage made when it failed: the stages that need it do not run.
MISSING = object()


class Checks:
    """The stages of one combination's check: those passed, and the failures found."""

    def __init__(self):
        self.done: list[str] = []
        self.failed: list[Failed] = []

    def run(self, name: str, factory: str, make: Callable[[], Any], blame=()) -> Any:
        """What `make` returns, the stage `name` passed; MISSING when it raised, the failure kept
        (named by the first of `blame`, (stage, factory, function), whose function is among the
        frames it went through, else by `name` and `factory`)."""
        try:
            value = make()
        except Exception as error:  # the user's code may raise anything: each means the same here
            stage, who = next(
                ((s, f) for s, f, function in blame if raised_in(error, function)), (name, factory)
            )
            self.failed.append(Failed(stage, who, error))
            return MISSING
        if name not in self.done:
            self.done.append(name)
        return value

    def fail(self, name: str, factory: str, message: str) -> None:
        """A failure found without an exception: one line, as a KnobError."""
        self.failed.append(Failed(name, factory, KnobError(message)))


def first_sample(dataset):
    """One sample: dataset[0], or the first an IterableDataset yields."""
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return next(iter(dataset))
    return dataset[0]


def raised_in(error: BaseException, function) -> bool:
    """Whether `function` (or, for a callable object, its class's __call__) is among the frames
    `error` went through."""
    calls = [vars(klass).get("__call__") for klass in type(function).__mro__]
    codes = {getattr(f, "__code__", None) for f in [function, *calls]} - {None}
    return any(frame.f_code in codes for frame, _ in traceback.walk_tb(error.__traceback__))


def check(raw: dict) -> tuple[list[str], str, list[Failed]]:
    """One combination: its first cell's knobs (labelled, as the bench job gets them). Returns the
    stages passed, the device and the failures found; raises what the cell's knobs raise."""
    if raw.get("command"):
        return check_command(raw)
    cell, _ = resolve(parse_cell({**raw, **ONE_PROCESS}), torch.cuda.is_available())
    device = rank_device(cell.device, World())
    torch.set_num_threads(cell.torch_threads or torch.get_num_threads())
    torch.manual_seed(cell.seed)
    names = plugins_of(cell)

    def who(knob: str) -> str:
        return (
            f"{knob} '{names[knob]}'"
            if knob in names
            else f"the built-in {knob} '{getattr(cell, knob)}'"
        )

    checks = Checks()
    # imported and checked at plan time already: cannot fail here but by a changed module
    user = resolve_all(cell)
    ctx = context(cell, device)
    batch = _batch(checks, cell, user, ctx, who)
    if cell.scenario == "loader":
        return checks.done, str(device), checks.failed
    moved = MISSING
    if batch is not MISSING:
        mover = who("to_device") if "to_device" in names else f"the copy to {device}"
        move = user.get("to_device", to_device)
        moved = checks.run("to_device", mover, lambda: move(batch, device, False))
    if cell.scenario != "transfer":
        _step(checks, cell, device, user, ctx, who, moved)
    return checks.done, str(device), checks.failed


def _batch(checks: Checks, cell, user: dict, ctx, who: Callable[[str], str]):
    """The dataset, its first sample, and one batch through the loader's collate (MISSING where a
    stage failed); a batch whose samples cannot be counted is a failure too."""
    dataset = checks.run("dataset", who("dataset"), lambda: build_dataset(cell, user, ctx))
    if dataset is MISSING:
        return MISSING
    sample = checks.run(
        "sample", f"{who('dataset')} (its first sample)", lambda: first_sample(dataset)
    )
    if sample is MISSING:  # the batch would fail as the sample did
        return MISSING
    loader = build_loader(cell, name_transforms(dataset), collate=user.get("collate"))
    # a DeviceDecoded loader (decoder torchvision-cuda) hides it
    collate = getattr(loader, "collate_fn", None)
    collated = who("collate") if "collate" in user else "the collate"
    batch = checks.run(
        "batch",
        f"{who('dataset')} (the samples of a batch)",
        lambda: next(iter(loader)),
        blame=[("collate", collated, collate)] if collate is not None else (),
    )
    if batch is not MISSING and uncounted(batch):
        checks.fail("batch", f"{who('dataset')} (the samples of a batch)", uncounted(batch))
    return batch


def _step(checks: Checks, cell, device, user: dict, ctx, who, moved) -> None:
    """The model and its optimizer (built though the data failed), the user's loss class, then one
    step on the copied batch: for a user model without a step, its forward, its loss and the update
    as checks of their own, so that each mismatch among forward_keys, label_key and the loss is
    found."""
    own = {knob: value for knob, value in user.items() if knob != "loss"}
    step = checks.run(
        "model",
        who("model"),
        lambda: TrainStep(cell, device, Measurement(), own, ctx),
        blame=[("optimizer", who("optimizer"), build_optimizer)],
    )
    if "loss" in user and step is not MISSING:
        step.user_loss = checks.run("loss", who("loss"), lambda: build_loss(cell, user, device))
    if step is MISSING or moved is MISSING:
        return
    clock = PhaseClock("naive", device, PHASES_OF["compute"])
    clock.start_step()
    if "step" in user or step.loss_fn is not None:
        doing = (
            who("step")
            if "step" in user
            else f"the step of {who('model')} (forward, loss, backward)"
        )
        checks.run("step", doing, lambda: _whole(step, moved, clock, device))
        return
    doing = f"the step of {who('model')} (forward, loss, backward)"
    loss = MISSING
    with step.autocast():
        output = checks.run("step", doing, lambda: step.forward(moved))
        if output is not MISSING and step.user_loss is not MISSING:
            loss = checks.run("step", doing, lambda: step.own_loss(output, moved))
        # the loss unknown (its forward or its class failed): its target where surely needed
        elif _target_named(cell):
            checks.run("step", doing, lambda: label_target(moved, cell.label_key, cell.loss))
    if loss is not MISSING:
        checks.run("step", doing, lambda: _update(step, loss, clock, device))


def _target_named(cell) -> bool:
    """Whether the loss surely takes its target from the batch, whatever the model's output (the
    forward failed, so it is unknown): a loss other than auto, or a label_key the config set."""
    return cell.loss != "auto" or cell.label_key != KNOBS["label_key"].default


def _whole(step, moved, clock, device) -> None:
    step(moved, clock)
    synchronize(device)


def _update(step, loss, clock, device) -> None:
    clock.mark()
    step.update(loss, clock)
    synchronize(device)


def check_command(raw: dict) -> tuple[list[str], str, list[Failed]]:
    """A command's combination: the command run to the end of its first training step
    (harness.command.preflight); the loader it trains on, printed. Its failure is one: the command
    ended there."""
    with tempfile.TemporaryDirectory(prefix="feedbench-preflight-") as out:
        try:
            found = command.preflight(raw, out)
        except command.CommandError as error:
            return (
                [],
                "as the command chose",
                [Failed("command", f"the command '{raw['command']}'", error)],
            )
    loader = found["loader"]
    print(
        f"feedbench: preflight: the training loader is the one built at {loader['built_at']} "
        f"({loader['dataset']}): {loader['why']}"
    )
    return ["command", "training loader", "step"], "as the command chose", []


def run(cells: list[dict], out: str, log: str, attempt: str = "first") -> int:
    """Every combination in turn, each failure's whole traceback printed (this process's output is
    the job's log); the record written to `out` (core.preflight.record) with every distinct failure.
    Always 0: the record says."""
    checked, errors, device = [], [], None
    experiment = cells[0].get("experiment") if cells else None
    for raw in cells:
        start = time.perf_counter()
        try:
            stages, device, failed = check(raw)
        # the cell itself refused (a knob this machine cannot run): as its cells would be
        except Exception as other:
            stages, failed = [], [Failed("cell", "the cell's knobs", other)]
        for failure in failed:
            _report(experiment, raw, failure, errors)
        seconds = round(time.perf_counter() - start, 3)
        if not failed:
            checked.append({"cell": raw.get("cell"), "stages": stages, "seconds": seconds})
            print(
                f"feedbench: preflight of {experiment}, cell {raw.get('cell')}: "
                f"{', '.join(stages)} ({seconds} s)"
            )
    shared.write(out, shared.record(experiment, log, checked, errors, device, attempt=attempt))
    return 0


def _report(experiment: str | None, raw: dict, failure: Failed, errors: list[dict]) -> None:
    """One failure: its traceback printed, its record added to `errors` unless an earlier
    combination's was the same (the same factory raising the same)."""
    print(
        f"feedbench: preflight of {experiment}, cell {raw.get('cell')}: {failure.factory} raised",
        file=sys.stderr,
    )
    traceback.print_exception(failure.error, file=sys.stderr)
    found = {"stage": failure.stage, "factory": failure.factory, "cell": raw.get("cell")}
    found.update(error_record(failure.error))
    same = ("stage", "factory", "type", "message")
    if not any(all(e[k] == found[k] for k in same) for e in errors):
        errors.append(found)
