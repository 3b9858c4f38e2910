"""A cell: one point of the experiment matrix, validated.

Validation turns bad input into one line (KnobError). It is the planning
layer's: the Snakefile checks every cell with it, so this module imports no
torch and no harness module. Fitting a cell to the machine that runs it is the
harness's (feedbench.harness.fit).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import field, make_dataclass
from typing import Any, Optional, Union

from .command import check_knobs as check_command
from .knobs import (
    BUILTIN_DATASETS,
    JPEG_DATASETS,
    KNOBS,
    LABELS,
    STAGE_WHATIFS,
    Knob,
    KnobError,
    defaults,
    shown,
    user_code,
)


def _field(knob: Knob) -> tuple[str, Any, Any]:
    """One field of Cell: the knob's name, type (or None, when nullable) and default (lists and
    mappings: a copy)."""
    kind = knob.type if isinstance(knob.type, type) else Union[knob.type]
    hint = Optional[kind] if knob.nullable else kind
    if isinstance(knob.default, (list, dict)):
        return knob.name, hint, field(default_factory=functools.partial(copy.copy, knob.default))
    return knob.name, hint, field(default=knob.default)


# The knobs of one cell, checked by parse_cell: one field per knob of core.knobs.KNOBS, with its
# type and default, then the labels the workflow adds (knobs.LABELS: set by the workflow, copied
# into the result, unused by the harness). Derived from the declarations, so a knob is declared
# once. Import-light: the Snakefile checks every cell with it.
Cell = make_dataclass(
    "Cell",
    [_field(knob) for knob in KNOBS.values()]
    + [(label, Any, field(default=None)) for label in LABELS],
    frozen=True,
)
Cell.__module__ = __name__  # where pickle finds it (a spawned loader worker unpickles the cell)
Cell.__doc__ = (
    "The knobs of one cell (feedbench.core.knobs.KNOBS), then its labels "
    "(knobs.LABELS); see parse_cell."
)


def parse_cell(raw: dict[str, Any]) -> Cell:
    """Validate a mapping of knobs (missing ones take their defaults)."""
    if not isinstance(raw, dict):
        raise KnobError(f"a cell must be a mapping of knob: value, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(KNOBS) - set(LABELS))
    if unknown:
        raise KnobError(f"unknown knob '{unknown[0]}'; allowed: {', '.join(sorted(KNOBS))}")
    values = defaults()
    for name, value in raw.items():
        values[name] = value if name in LABELS else KNOBS[name].check(value)
    sizes = values["transfer_sizes"]
    if not sizes or not all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes
    ):
        raise KnobError(
            f"knob 'transfer_sizes': value {sizes!r} is not allowed; allowed: a non-empty list "
            "of byte counts > 0"
        )
    if not all(isinstance(p, str) and p for p in values["python_path"]):
        raise KnobError(
            f"knob 'python_path': value {values['python_path']!r} is not allowed; allowed: a "
            "list of folders"
        )
    own_data, own_model = (
        user_code("dataset", values["dataset"]),
        user_code("model", values["model"]),
    )
    own_loss = user_code("loss", values["loss"])
    for name, own in (
        ("dataset_args", own_data),
        ("model_args", own_model),
        ("loss_args", own_loss),
    ):
        if values[name] and not own:
            raise KnobError(
                f"knob '{name}': value {values[name]!r} is set but knob '{name[:-5]}' is not "
                "user code; "
                "allowed: {} or a package.module:attribute " + name[:-5]
            )
    keys = values["forward_keys"]
    if keys is not None and (
        not keys or not all(isinstance(k, str) and k for k in keys) or not own_model
    ):
        raise KnobError(
            f"knob 'forward_keys': value {keys!r} is not allowed; allowed: null, or a non-empty "
            "list of batch keys with a user model (package.module:attribute)"
        )
    if values["loss"] != "auto" and (not own_model or values["step"]):
        raise KnobError(
            f"knob 'loss': value {values['loss']!r} is the loss of a model of your own without a "
            "step ("
            f"{'its step computes the loss' if values['step'] else 'a built-in model has its own'}"
            "); allowed: auto"
        )
    if values["momentum"] and values["optimizer"] != "sgd":
        raise KnobError(
            f"knob 'momentum': value {values['momentum']!r} is SGD's, not allowed with optimizer "
            f"'{values['optimizer']}'; allowed: 0 (an optimizer's own arguments go in "
            "optimizer_args)"
        )
    check_command(values)
    _check_model(values, own_data)
    _check_decoder(values)
    _check_stage_whatifs(values)
    _check_parallel(values)
    return Cell(**values)


def _check_model(values: dict[str, Any], own_data: bool) -> None:
    """The scenario, the dataset and the model go together."""
    scenario, dataset, model = values["scenario"], values["dataset"], values["model"]
    hint = BUILTIN_DATASETS[dataset].data_dir_hint if dataset in BUILTIN_DATASETS else None
    if hint and not values["data_dir"] and not values["download"]:
        raise KnobError(
            f"knob 'data_dir': dataset '{dataset}' needs a data_dir; allowed: an "
            f"existing folder ({hint})"
        )
    if scenario in ("train", "compute") and model == "none":
        raise KnobError(
            f"knob 'model': value 'none' is not allowed with scenario '{scenario}'; allowed: a "
            "model (mlp, sleep, lstm, resnet18, ...)"
        )
    if own_data and model in ("mlp", "lstm") and scenario in ("train", "compute"):
        raise KnobError(
            f"knob 'model': value '{model}' is not allowed with a user dataset; allowed: a user "
            "model (package.module:attribute), sleep, or a torchvision image model"
        )
    if model == "lstm" and dataset != "tokens" and scenario in ("train", "compute"):
        raise KnobError(
            f"knob 'dataset': value '{dataset}' is not allowed with model 'lstm'; allowed: tokens"
        )
    if dataset == "tokens" and model not in ("lstm", "sleep", "none"):
        raise KnobError(
            f"knob 'model': value '{model}' is not allowed with dataset 'tokens'; allowed: lstm, "
            "sleep, none"
        )


def _check_parallel(values: dict[str, Any]) -> None:
    """The parallel mode fits the GPUs, the nodes and the scenario."""
    scenario = values["scenario"]
    parallel, gpus, nodes = values["parallel"], values["gpus_per_node"], values["nodes"]
    if parallel == "none" and (gpus > 1 or nodes > 1):
        raise KnobError(
            f"knob 'parallel': value 'none' is not allowed with gpus_per_node={gpus}, nodes="
            f"{nodes}; allowed: dp, ddp, independent"
        )
    if parallel == "dp" and nodes > 1:
        raise KnobError(
            f"knob 'nodes': value {nodes} is not allowed with parallel 'dp' (one process); "
            "allowed: 1, or parallel ddp / independent"
        )
    if parallel != "none" and scenario in ("loader", "transfer"):
        raise KnobError(
            f"knob 'parallel': value '{parallel}' is not allowed with scenario '"
            f"{scenario}'; allowed: none"
        )


def _check_decoder(values: dict[str, Any]) -> None:
    """A decoder other than pil needs a built-in JPEG dataset; torchvision-cuda a device that may be
    a GPU and feedbench's own collate (its loader yields undecoded bytes: see
    harness.data.DeviceDecoded)."""
    decoder, dataset = values["decoder"], values["dataset"]
    if decoder == "pil":
        return
    if dataset not in JPEG_DATASETS:
        raise KnobError(
            f"knob 'decoder': value '{decoder}' is not allowed with dataset '{dataset}', which "
            f"decodes no JPEG; allowed: pil, or a dataset that does ({', '.join(JPEG_DATASETS)})"
        )
    if decoder == "torchvision-cuda" and values["device"] == "cpu":
        raise KnobError(
            "knob 'decoder': value 'torchvision-cuda' is not allowed with device 'cpu'; allowed: "
            "pil, torchvision, or device auto or cuda"
        )
    if decoder == "torchvision-cuda" and values["collate"] is not None:
        raise KnobError(
            f"knob 'collate': value {values['collate']!r} is not allowed with decoder "
            "'torchvision-cuda', whose loader yields undecoded bytes; allowed: null"
        )


def _check_stage_whatifs(values: dict[str, Any]) -> None:
    """What the config alone shows of a stage what-if (knobs.STAGE_WHATIFS): a dataset with stages
    to change; the names of the stages are the built dataset's (harness.whatif checks them)."""
    skip = values["skip_stages"]
    if not all(isinstance(name, str) and name for name in skip):
        raise KnobError(
            f"knob 'skip_stages': value {shown(skip)} is not allowed; allowed: a "
            "list of stage names"
        )
    wanted = [name for name in STAGE_WHATIFS if values[name]]
    if not wanted:
        return
    dataset = values["dataset"]
    # a command's dataset is its script's own: the harness finds its stages there (harness.inloop)
    builtin = None if values["command"] else BUILTIN_DATASETS.get(dataset)
    staged = ", ".join(name for name, d in BUILTIN_DATASETS.items() if d.staged)
    if builtin is not None and not builtin.staged:
        raise KnobError(
            f"knob '{wanted[0]}': dataset '{dataset}' has no stages to change; allowed: null, or "
            f"a dataset whose samples pass a torchvision Compose ({staged} or a user dataset)"
        )
    if values["decoder"] == "torchvision-cuda":
        raise KnobError(
            f"knob '{wanted[0]}': decoder 'torchvision-cuda' runs no stage in the loader's "
            "workers; allowed: null, or decoder pil or torchvision"
        )
    if values["scenario"] in ("compute", "transfer"):
        raise KnobError(
            f"knob '{wanted[0]}': scenario '{values['scenario']}' runs no loader stages; "
            "allowed: null, or scenario train or loader"
        )


def cell_dict(cell: Cell) -> dict[str, Any]:
    return dataclasses.asdict(cell)
