"""The preflight's check (feedbench.core.preflight): each combination of the user's code in an
experiment, built once by the paths a cell takes, before any of its cells runs.

For each combination, its first cell, as one process on one device with no loader workers: the
dataset (data.build_dataset), one sample, one batch through the loader's collate
(data.build_loader), then, for a cell with a model, the model and optimizer and one step on the
copied batch (loop.TrainStep, the copy by the user's to_device if any). Each stage names what runs
in it, so a failure says which factory raised. The device is the cell's own, fitted to this machine
as the cell is (fit.resolve): a model or step that needs CUDA passes where its cells would, and a
fault only the device shows (a batch left on the host) is found.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
import traceback

import torch

from ..core import preflight as shared
from ..core.cell import parse_cell
from ..core.plugins import plugins_of, resolve_all
from . import command
from .data import build_dataset, build_loader
from .distributed import World, rank_device
from .fit import resolve
from .loop import PHASES_OF, Measurement, TrainStep, context
from .models import build_optimizer
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


@contextlib.contextmanager
def stage(done: list[str], name: str, factory: str):
    """A stage of the check: appended to `done` once it passed; any exception in it becomes
    Failed."""
    try:
        yield
    # a stage that named the factory itself (the collate within a batch, the optimizer with a model)
    except Failed:
        raise
    except Exception as error:  # the user's code may raise anything: each means the same here
        raise Failed(name, factory, error) from error
    done.append(name)


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


def check(raw: dict) -> tuple[list[str], str]:
    """One combination: its first cell's knobs (labelled, as the bench job gets them). Returns the
    stages passed and the device; raises Failed."""
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

    done: list[str] = []
    # imported and checked at plan time already: cannot fail here but by a changed module
    user = resolve_all(cell)
    ctx = context(cell, device)
    with stage(done, "dataset", who("dataset")):
        dataset = build_dataset(cell, user, ctx)
    with stage(done, "sample", f"{who('dataset')} (its first sample)"):
        first_sample(dataset)
    loader = build_loader(cell, name_transforms(dataset), collate=user.get("collate"))
    # a DeviceDecoded loader (decoder torchvision-cuda) hides it
    collate = getattr(loader, "collate_fn", None)
    with stage(done, "batch", f"{who('dataset')} (the samples of a batch)"):
        try:
            batch = next(iter(loader))
        except Exception as error:  # which of the two: the collate when it is among the frames
            if raised_in(error, collate):
                raise Failed(
                    "collate", who("collate") if "collate" in names else "the collate", error
                ) from error
            raise
    scenario = cell.scenario
    move = user.get("to_device", to_device)
    if scenario == "loader":
        return done, str(device)
    with stage(
        done, "to_device", who("to_device") if "to_device" in names else f"the copy to {device}"
    ):
        moved = move(batch, device, False)
    if scenario == "transfer":
        return done, str(device)
    with stage(done, "model", who("model")):
        try:
            step = TrainStep(cell, device, Measurement(), user, ctx)
        except Exception as error:
            if raised_in(error, build_optimizer):
                raise Failed("optimizer", who("optimizer"), error) from error
            raise
    doing = (
        who("step") if "step" in names else f"the step of {who('model')} (forward, loss, backward)"
    )
    with stage(done, "step", doing):
        clock = PhaseClock("naive", device, PHASES_OF["compute"])
        clock.start_step()
        step(moved, clock)
        synchronize(device)
    return done, str(device)


def check_command(raw: dict) -> tuple[list[str], str]:
    """A command's combination: the command run to the end of its first training step
    (harness.command.preflight); the loader it trains on, printed."""
    with tempfile.TemporaryDirectory(prefix="feedbench-preflight-") as out:
        try:
            found = command.preflight(raw, out)
        except command.CommandError as error:
            raise Failed("command", f"the command '{raw['command']}'", error) from error
    loader = found["loader"]
    print(
        f"feedbench: preflight: the training loader is the one built at {loader['built_at']} "
        f"({loader['dataset']}): {loader['why']}"
    )
    return ["command", "training loader", "step"], "as the command chose"


def run(cells: list[dict], out: str, log: str, attempt: str = "first") -> int:
    """Every combination in turn, to the first that fails; the record written to `out`
    (core.preflight.record), the failure's whole traceback printed (this process's output is the
    job's log). Always 0: the record says."""
    checked, error, device = [], None, None
    experiment = cells[0].get("experiment") if cells else None
    for raw in cells:
        start = time.perf_counter()
        try:
            stages, device = check(raw)
        except Failed as failed:
            found = error_record(failed.error)
            error = {
                "stage": failed.stage,
                "factory": failed.factory,
                "cell": raw.get("cell"),
                **found,
            }
            print(
                f"feedbench: preflight of {experiment}, cell {raw.get('cell')}: {failed.factory} "
                "raised",
                file=sys.stderr,
            )
            traceback.print_exception(failed.error, file=sys.stderr)
            break
        # the cell itself refused (a knob this machine cannot run): as its cells would be
        except Exception as other:
            found = error_record(other)
            error = {
                "stage": "cell",
                "factory": "the cell's knobs",
                "cell": raw.get("cell"),
                **found,
            }
            traceback.print_exception(other, file=sys.stderr)
            break
        seconds = round(time.perf_counter() - start, 3)
        checked.append({"cell": raw.get("cell"), "stages": stages, "seconds": seconds})
        print(
            f"feedbench: preflight of {experiment}, cell {raw.get('cell')}: "
            f"{', '.join(stages)} ({seconds} s)"
        )
    shared.write(out, shared.record(experiment, log, checked, error, device, attempt=attempt))
    return 0
