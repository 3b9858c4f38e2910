"""A batch as a tree of tensors, whatever its shape: the harness's own rules for the user's batches.

A batch may be a tensor, or nested mappings (a dict, or any collections.abc.Mapping such as
transformers' BatchEncoding), lists, tuples, namedtuples and dataclasses of them (a user's collate
makes any of these), as the DataLoader's own collate and pinning walk them. Here are how
feedbench finds its tensors, moves them to the device, counts its samples and bytes, says when
pinning did not reach them, and, for a user model without a step, what the model is called with
(call_model) and which loss it gets (default_loss).
Harness layer: only torch-importing modules use it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, MutableMapping

import torch

from ..core.knobs import KnobError


def batch_tensors(batch) -> list:
    """Every tensor of a batch: nested mappings, lists, tuples and dataclasses."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for v in batch.values() for t in batch_tensors(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in batch_tensors(v)]
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [t for f in dataclasses.fields(batch) for t in batch_tensors(getattr(batch, f.name))]
    return []


def move_batch(batch, device, non_blocking: bool):
    """Every tensor of a batch on the device: nested mappings, lists, tuples, namedtuples and
    dataclasses."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return same_mapping(
            batch, {k: move_batch(v, device, non_blocking) for k, v in batch.items()}
        )
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_batch(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_batch(v, device, non_blocking) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(
            batch,
            **{
                f.name: move_batch(getattr(batch, f.name), device, non_blocking)
                for f in dataclasses.fields(batch)
                if f.init
            },
        )
    return batch


def same_mapping(batch: Mapping, values: dict) -> Mapping:
    """A mapping of the batch's type holding `values`, as torch's pin_memory rebuilds one: a
    mutable one copied and updated (a BatchEncoding keeps its encodings, a defaultdict its
    factory), another built from the values, or a dict where its type cannot be."""
    try:
        if isinstance(batch, MutableMapping):
            clone = copy.copy(batch)
            clone.update(values)
            return clone
        return type(batch)(values)
    except TypeError:
        return values


def batch_bytes(batch) -> int:
    """Bytes of every tensor in a batch."""
    return sum(t.numel() * t.element_size() for t in batch_tensors(batch))


def host_tensors(batch) -> list:
    """The tensors of a batch that sit in host memory: what a host-to-device copy moves and what
    pinning applies to. A tensor already on a device (decoded on the GPU: decoder torchvision-cuda,
    device_stages) is neither copied nor pinned (is_pinned() is false for it)."""
    return [t for t in batch_tensors(batch) if t.device.type == "cpu"]


def copied_bytes(batch) -> int:
    """Bytes one host-to-device copy of a batch moves: its host tensors'."""
    return batch_bytes(host_tensors(batch))


def batch_len(batch) -> int:
    """Samples in a batch: the first dimension of its first tensor (0 when it holds none)."""
    tensors = batch_tensors(batch)
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 0


def uncounted(batch) -> str | None:
    """Why no sample of the batch can be counted (it holds no tensor with a first dimension), in one
    line; None when batch_len counts them. A cell whose batches all say so measured nothing: it
    fails rather than report 0 samples/s."""
    if batch_len(batch):
        return None
    return (
        f"no samples counted: the batch (a {type(batch).__name__}) holds no tensor with a "
        "first dimension to count its samples by; allowed: a batch whose samples lie along the "
        "first dimension of its tensors (a tensor, or tensors in a Mapping, list, tuple, "
        "namedtuple or dataclass)"
    )


def unpinned_note(batch) -> str | None:
    """The adjustment when pin_memory was asked for and the first batch came back with unpinned host
    tensors (those already on the device are not the DataLoader's to pin)."""
    tensors, host = batch_tensors(batch), host_tensors(batch)
    unpinned = sum(1 for t in host if not t.is_pinned())
    if unpinned:
        counted = f"{unpinned} of {len(host)} host tensors, "
    elif not tensors and _opaque(batch) and not callable(getattr(batch, "pin_memory", None)):
        # the DataLoader returns it as it is
        counted = "its tensors hidden from feedbench and from the DataLoader, "
    else:
        return None
    return (
        f"pin_memory=true but the first batch came back unpinned ({counted}batch type "
        f"{type(batch).__name__}): the DataLoader pins tensors, dicts, lists, tuples and "
        "namedtuples; a custom batch type needs a pin_memory() method"
    )


def _opaque(batch) -> bool:
    """A batch of a type none of feedbench's rules walks (batch_tensors): an object only the user's
    code reads."""
    walked = (torch.Tensor, Mapping, list, tuple, str, bytes, int, float, bool, type(None))
    return not isinstance(batch, walked) and not dataclasses.is_dataclass(batch)


def default_loss(output, batch, label_key: str = "label", loss: str = "auto", user_loss=None):
    """(loss, rule): the loss of a user model without a step (knob `loss`). auto: the model's output
    when it is a scalar, or its `loss` (a mapping's key or an attribute, as a Hugging Face model
    returns it when its labels are among its inputs), else cross-entropy; cross_entropy, mse, l1,
    smooth_l1: torch.nn.functional's; or the user's `user_loss(output, target)`. The target is
    batch[label_key] of a mapping batch, else batch[1]."""
    if loss == "auto":
        if isinstance(output, torch.Tensor) and output.dim() == 0:
            return output, "the model's output (a scalar)"
        own = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if isinstance(own, torch.Tensor) and own.dim() == 0:
            return own, "the model's own loss (its output's loss)"
    target, label = _target(batch, label_key, _named(loss))
    if user_loss is not None:
        value = user_loss(output, target)
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            raise KnobError(
                f"knob 'loss': '{loss}' returned {type(value).__module__}."
                f"{type(value).__qualname__} {tuple(getattr(value, 'shape', ()))}; allowed: a "
                "scalar loss tensor"
            )
        return value, f"{loss} against {label}"
    logits = (
        output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", output)
    )
    if loss in REGRESSION_LOSSES:
        return _regression(loss, logits, target, label)
    return cross_entropy(logits, target, label)


# The regression losses of knob `loss`, torch.nn.functional's of those names.
REGRESSION_LOSSES = {
    "mse": torch.nn.functional.mse_loss,
    "l1": torch.nn.functional.l1_loss,
    "smooth_l1": torch.nn.functional.smooth_l1_loss,
}


def _named(loss: str) -> str:
    """The loss (knob loss) as its rule and errors name it."""
    return "cross-entropy" if loss in ("auto", "cross_entropy") else loss


def label_target(batch, label_key: str, loss: str):
    """(target, its name) of the loss `loss` in the batch, found without the model's output (the
    preflight, where the model's forward failed); KnobError in one line as _target's."""
    return _target(batch, label_key, _named(loss), because="")


def _target(batch, label_key: str, what: str, because: str = "the model's output has no loss and "):
    """(target, its name in the loss's rule): batch[label_key] of a mapping batch, else batch[1];
    KnobError in one line where the batch has neither."""
    if isinstance(batch, Mapping) and label_key in batch:
        return batch[label_key], f"batch[{label_key!r}]"
    # a mapping batch: the label is a key of it, so a missing one is that knob's fault
    if isinstance(batch, Mapping):
        from ..core.plugins import did_you_mean

        keys = [str(k) for k in batch]
        raise KnobError(
            f"knob 'label_key': {because}the batch has no key "
            f"{label_key!r}{did_you_mean(label_key, keys)} to take {what} against; allowed: "
            f"{', '.join(keys) or 'none'}, or a step (package.module:train_step) returning the "
            "loss"
        )
    if isinstance(batch, (list, tuple)) and len(batch) > 1:
        return batch[1], "batch[1]"
    raise KnobError(
        "knob 'step': no loss: the model's output is not a scalar and has no loss, and the "
        f"batch has no batch[1] or batch[{label_key!r}]; allowed: a step "
        "(package.module:train_step) returning the loss, or label_key"
    )


def _regression(name: str, output, target, label: str):
    """(loss, rule) of a regression loss: the output against the target as floats, the target viewed
    in the output's shape where only that differs ((batch, 1) against (batch,), which would
    broadcast to a batch x batch loss); KnobError in one line where their sizes differ."""
    if not isinstance(output, torch.Tensor) or not isinstance(target, torch.Tensor):
        raise KnobError(
            f"knob 'loss': {name} needs a tensor output and target, and they are "
            f"{type(output).__name__} and {type(target).__name__}; allowed: a loss of your own "
            "(package.module:attribute), or a step"
        )
    reshaped = ""
    if output.shape != target.shape:
        if output.numel() != target.numel():
            raise KnobError(
                f"knob 'loss': {name} needs the model's output and {label} of one size, and they "
                f"are {tuple(output.shape)} and {tuple(target.shape)}; allowed: a loss of your "
                "own (package.module:attribute), or a step (package.module:train_step) "
                "returning the loss"
            )
        target, reshaped = target.reshape(output.shape), f", viewed as {tuple(output.shape)}"
    loss = REGRESSION_LOSSES[name](output.float(), target.to(torch.float32))
    return loss, f"{name} against {label}{reshaped}"


def cross_entropy(logits, target, label: str):
    """(loss, rule): the default loss, refused where it cannot train: over one value per sample (a
    regression's output, shape (batch,) or (batch, 1)) cross-entropy is 0 or taken across the batch,
    whatever the model does."""
    if not isinstance(logits, torch.Tensor) or logits.dim() < 2 or logits.shape[1] < 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise KnobError(
            f"knob 'step': the default loss, cross-entropy against {label}, needs class scores "
            f"of shape (batch, classes >= 2, ...) and the model's output is {shape} (a "
            "regression?); allowed: knob loss: mse, l1, smooth_l1 or a loss of your own "
            "(package.module:attribute), or a step returning the loss"
        )
    return torch.nn.functional.cross_entropy(
        logits.float(), target
    ), f"cross-entropy against {label}"


def call_model(model, batch, forward_keys: list[str] | None = None):
    """A user model without a step, called as PyTorch users write it: with `forward_keys`,
    model(**{key: batch[key]}) for those keys of a dict batch (several named inputs: input_ids,
    attention_mask, ...); else with batch[0] of a list or tuple, or the whole batch. A key the batch
    lacks is one KnobError naming the keys it has. Any Mapping is a dict batch here (a
    BatchEncoding)."""
    if not forward_keys:
        return model(
            batch[0]
            if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields")
            else batch
        )
    if not isinstance(batch, Mapping):
        raise KnobError(
            f"knob 'forward_keys': the batch is a {type(batch).__name__}, not a mapping; "
            "allowed: forward_keys with a collate that returns a dict (any Mapping), or none"
        )
    missing = [key for key in forward_keys if key not in batch]
    if missing:
        from ..core.plugins import did_you_mean

        keys = [str(k) for k in batch]
        raise KnobError(
            f"knob 'forward_keys': the batch has no key '{missing[0]}'"
            f"{did_you_mean(missing[0], keys)}; allowed: " + ", ".join(keys)
        )
    return model(**{key: batch[key] for key in forward_keys})
