"""Functions of the user's code made stages by import path (knob stage_functions): a pipeline with
no Compose, no span and no decorator gets its costly function timed as a stage and cached or skipped
by the stage what-ifs, with no change to its code."""

from __future__ import annotations

import pytest
from feedbench.core.cell import parse_cell
from feedbench.core.knobs import KnobError
from feedbench.core.plugins import resolve_all

USER_MODULE = "plain_text"
# A plain tokenizer class: a method of fixed cost (a sleep: the cells of a comparison run one after
# the other, and a sleep is what a loaded machine disturbs least), called once per sample by a
# Dataset that knows nothing of feedbench.
USER_CODE = """
import time

import torch
from torch.utils.data import Dataset


class Tokenizer:
    def encode(self, text):
        time.sleep(0.004)
        return [ord(c) % 50 for c in text]

    @staticmethod
    def clean(text):
        return text.strip()


class Texts(Dataset):
    def __init__(self, n=64):
        self.n, self.tokenizer = n, Tokenizer()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = self.tokenizer.encode(Tokenizer.clean(f" text {i % 10} "))
        return torch.tensor(ids + [0] * (8 - len(ids)), dtype=torch.float32), i % 2


def model():
    return torch.nn.Linear(8, 2)
"""


def knobs(user_module, **more):
    return {
        "python_path": [user_module],
        "dataset": f"{USER_MODULE}:Texts",
        "model": f"{USER_MODULE}:model",
        "stage_functions": [f"{USER_MODULE}:Tokenizer.encode", f"{USER_MODULE}:Tokenizer.clean"],
        "stage_timing": True,
        "batch_size": 4,
        "steps": 8,
        "warmup_steps": 2,
        "torch_threads": 1,
        "monitor_interval_s": 5,
        **more,
    }


def test_a_method_named_by_import_path_is_timed_as_a_stage(run_cell, user_module):
    code, result = run_cell(**knobs(user_module))
    assert code == 0, result["error"]
    stages = result["metrics"]["stages"]["stages"]
    assert stages["Tokenizer.encode"]["calls"] == 32 and stages["Tokenizer.clean"]["calls"] == 32
    # its sleep, at least (a busy machine wakes it late)
    assert stages["Tokenizer.encode"]["median_ms"] >= 3.9
    # the sleep is most of a sample: no longer unattributed
    assert stages["Tokenizer.encode"]["share"] > 0.5


def test_the_function_made_a_stage_is_cached_and_skipped_by_the_what_ifs(run_cell, user_module):
    code, base = run_cell(**knobs(user_module))
    assert code == 0, base["error"]
    code, cached = run_cell(**knobs(user_module, cache_after="Tokenizer.encode"))
    assert code == 0, cached["error"]
    # a lookup, not the sleep
    assert cached["metrics"]["stages"]["stages"]["Tokenizer.encode"]["median_ms"] < 1
    assert cached["metrics"]["samples_per_s"] > 2 * base["metrics"]["samples_per_s"]
    # a static method of one argument
    code, skipped = run_cell(**knobs(user_module, skip_stages=["Tokenizer.clean"]))
    assert code == 0, skipped["error"]
    assert skipped["metrics"]["whatif"]["trades"] == ["changes the data: Tokenizer.clean skipped"]


def test_a_misspelled_function_is_one_line_before_any_job(user_module):
    cell = parse_cell(knobs(user_module, stage_functions=[f"{USER_MODULE}:Tokenizer.encdoe"]))
    with pytest.raises(
        KnobError, match=r"^knob 'stage_functions': cannot import .*did you " r"mean 'encode'"
    ):
        resolve_all(cell)


@pytest.mark.slow  # a spawned worker starts torch
def test_a_spawned_worker_makes_the_stages_again(run_cell, user_module):
    """A spawned worker imports the user's module afresh: its worker_init makes the stages again
    (data.worker_start), so the stage is timed, and cached, there too."""
    more = dict(
        num_workers=1, multiprocessing_context="spawn", cache_after="Tokenizer.encode", steps=4
    )
    code, result = run_cell(**knobs(user_module, **more))
    assert code == 0, result["error"]
    assert result["metrics"]["stages"]["stages"]["Tokenizer.encode"]["calls"] == 16
