"""feedbench.cell.Cell, the typed harness cell, and the knob table (feedbench.knobs.KNOBS) say the same thing."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
from feedbench.cell import Cell, parse_cell
from feedbench.knobs import KNOBS, LABELS


def hints() -> dict[str, object]:
    return typing.get_type_hints(Cell)


def test_one_field_per_knob_then_the_labels():
    assert [f.name for f in dataclasses.fields(Cell)] == list(KNOBS) + list(LABELS)


@pytest.mark.parametrize("name", list(KNOBS))
def test_field_default_is_the_knobs_default(name):
    field = next(f for f in dataclasses.fields(Cell) if f.name == name)
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    assert default == KNOBS[name].default
    assert type(default) is type(KNOBS[name].default)


@pytest.mark.parametrize("name", list(KNOBS))
def test_field_type_is_the_knobs_type(name):
    knob, hint = KNOBS[name], hints()[name]
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    assert (type(None) in args) == knob.nullable, f"{name}: {hint} vs nullable={knob.nullable}"
    kinds = {typing.get_origin(a) or a for a in args} - {type(None)}
    assert kinds == {knob.type}, f"{name}: {hint} vs {knob.type}"


def test_labels_are_optional():
    assert all(type(None) in typing.get_args(hints()[label]) for label in LABELS)


def test_cell_is_frozen_and_parse_cell_fills_every_field():
    cell = parse_cell({"num_workers": 2, "compute_ms": 3, "model": "sleep"})
    assert cell == dataclasses.replace(Cell(), num_workers=2, compute_ms=3.0, model="sleep")
    assert isinstance(cell.compute_ms, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cell.num_workers = 4  # type: ignore[misc]
    assert Cell().transfer_sizes is not Cell().transfer_sizes  # a list default is a fresh list per cell
