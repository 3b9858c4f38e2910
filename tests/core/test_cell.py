"""feedbench.core.cell.Cell, the typed harness cell, derived from the knob declarations
(feedbench.core.knobs.KNOBS)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from feedbench.core.cell import Cell, parse_cell


def test_cell_is_frozen_and_parse_cell_fills_every_field():
    cell = parse_cell({"num_workers": 2, "compute_ms": 3, "model": "sleep"})
    assert cell == dataclasses.replace(Cell(), num_workers=2, compute_ms=3.0, model="sleep")
    assert isinstance(cell.compute_ms, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cell.num_workers = 4  # type: ignore[misc]
    # a list default is a fresh list per cell
    assert Cell().transfer_sizes is not Cell().transfer_sizes
    assert Cell().dataset_args is not Cell().dataset_args
    assert Cell().experiment is None and Cell().code is None  # labels: set by the workflow only


def test_cell_survives_pickle():
    """A loader worker started with spawn or forkserver unpickles the dataset, and with it the cell
    it was built from: the derived class must be found where pickle looks for it,
    feedbench.core.cell.Cell."""
    cell = parse_cell(
        {
            "num_workers": 2,
            "dataset": "shapes.data:build",
            "model": "sleep",
            "dataset_args": {"crop": 56},
            "experiment": "e",
        }
    )
    assert Cell.__module__ == "feedbench.core.cell"
    assert pickle.loads(pickle.dumps(cell)) == cell
