"""Python's garbage collector in the measured window: its pauses recorded in the result and the
summary, the knob `gc` (normal | freeze | disable), and the collector left as it was found after
every cell, a failed one too."""

from __future__ import annotations

import gc

import feedbench
import pytest
import torch
from feedbench.core.cell import parse_cell
from feedbench.core.knobs import KnobError
from feedbench.core.metric_table import row_of
from torch import nn
from torch.utils.data import Dataset

KNOBS = dict(
    batch_size=8, steps=40, warmup_steps=2, device="cpu", torch_threads=1, monitor_interval_s=5
)


class Rows(Dataset):
    """Eight features a sample; its label says whether the process that made it had its collector
    on."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((8,), float(i)), int(gc.isenabled())


def garbage_step(model, batch, ctx):
    """A step that leaves cyclic garbage, as object-heavy Python code does: the young generation
    fills every step."""
    for _ in range(2000):
        a, b = [], []
        a.append(b)
        b.append(a)
    x, collector_on = batch
    assert bool(collector_on.all()), "a loader worker ran with its collector off"
    return model(x).pow(2).mean()


def cell(**knobs):
    return feedbench.measure(
        dataset=Rows(), model=nn.Linear(8, 1), step=garbage_step, **{**KNOBS, **knobs}
    )


def test_the_collections_in_the_window_are_recorded_in_the_result_and_the_summary():
    result = cell(gc="normal")
    assert result["status"] == "ok", result["error"]
    recorded = result["metrics"]["gc"]
    assert recorded["mode"] == "normal"
    # 4000 new cyclic lists a step, 700 a young collection
    assert recorded["collections"] >= 40, recorded
    assert recorded["by_generation"][0] >= 40 and recorded["pause_ms"] > 0
    assert sum(recorded["by_generation"]) == recorded["collections"]
    row = row_of(result)
    assert (
        row["gc_collections"] == recorded["collections"]
        and row["gc_pause_ms"] == recorded["pause_ms"]
    )


def test_disable_keeps_the_collector_out_of_the_window_and_gives_it_back():
    enabled, callbacks = gc.isenabled(), list(gc.callbacks)
    # a worker's collector stays on (its samples say so: the step checks)
    result = cell(gc="disable", num_workers=1)
    assert result["status"] == "ok", result["error"]
    assert result["metrics"]["gc"]["collections"] == 0, result["metrics"]["gc"]
    assert gc.isenabled() == enabled and gc.get_freeze_count() == 0 and gc.callbacks == callbacks


def test_freeze_sets_the_start_up_heap_aside_and_leaves_the_collector_on():
    kept = [[] for _ in range(1000)]  # objects alive before the window: frozen with it, then thawed
    result = cell(gc="freeze", num_workers=1)
    assert result["status"] == "ok", result["error"]
    assert result["metrics"]["gc"]["collections"] >= 40, "the step's own garbage is still collected"
    assert gc.isenabled() and gc.get_freeze_count() == 0 and kept


def test_a_cell_failing_mid_window_leaves_the_collector_as_it_found_it():
    calls = []

    def failing_step(model, batch, ctx):
        calls.append(1)
        if len(calls) > 5:
            raise RuntimeError("the user's step failed")
        return model(batch[0]).mean()

    enabled, callbacks = gc.isenabled(), list(gc.callbacks)
    result = feedbench.measure(
        dataset=Rows(), model=nn.Linear(8, 1), step=failing_step, gc="disable", **KNOBS
    )
    assert result["status"] == "failed" and "the user's step failed" in result["error"]["message"]
    assert gc.isenabled() == enabled and gc.get_freeze_count() == 0 and gc.callbacks == callbacks


def test_a_gc_mode_not_allowed_is_one_line_naming_the_allowed():
    # the allowed words, then how to quote one YAML reads as a boolean (#49)
    allowed = r"allowed: normal, freeze, disable \(YAML reads on, off, yes and no as booleans"
    with pytest.raises(KnobError, match=r"^knob 'gc'.*" + allowed):
        parse_cell({"gc": False})  # `gc: off` as YAML reads it
