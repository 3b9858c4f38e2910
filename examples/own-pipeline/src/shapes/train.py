"""The training step of the shapes project: label-smoothed cross-entropy over a dict batch."""

from __future__ import annotations

from torch import nn


def train_step(model, batch, ctx):
    """Return the loss; feedbench calls backward and the optimizer (return None after doing them
    yourself)."""
    return nn.functional.cross_entropy(model(batch["image"]), batch["label"], label_smoothing=0.1)
