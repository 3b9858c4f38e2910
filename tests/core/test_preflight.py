"""The preflight, without Snakemake: which cells need one and how they group, what the check builds
and which factory it blames, and a check that dies still leaves a record. Through real Snakemake:
tests/workflow/test_failed_run.py."""

from __future__ import annotations

import json

import pytest
from feedbench.core import preflight
from feedbench.core.planned_cell import PlannedCell
from feedbench.harness import preflight as check

USER_MODULE = "preflight_user"
USER_CODE = """
import os

import torch
from torch import nn
from torch.utils.data import Dataset


class Tokens(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"input_ids": torch.full((4,), i % 8), "label": torch.tensor(i % 2)}


def dies():
    os.kill(os.getpid(), 9)


def bad_collate(samples):
    raise ValueError("cannot pad 0-d labels\\nsecond line")


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(8, 2)

    def forward(self, input_ids):
        return self.bag(input_ids)


class Readings(Dataset):  # a regression's samples: a tuple of readings and the next one, floats

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((3,), float(i)), torch.tensor([i / 8])


def forecaster():
    return nn.Linear(3, 1)


def too_wide():
    raise MemoryError("model too wide")


def bad_optimizer(params, lr=0.1):
    raise TypeError("betas must be a pair")


def no_volume():
    raise FileNotFoundError("no /data/text: is the volume mounted?")


class Weighted(nn.CrossEntropyLoss):
    def __init__(self, classes=2):
        raise ValueError(f"weights for {classes} classes, got 3")
"""
M = USER_MODULE


def planned(experiment: str, cell: str, **knobs) -> PlannedCell:
    return PlannedCell(experiment, cell, knobs, {})


def test_each_combination_of_user_code_in_an_experiment_is_checked_once():
    """Cells that differ only in loader knobs are one combination; an argument of a factory makes
    another. A loader or transfer cell needs one only for the code that makes its batch; a cell of
    the project's own code, none."""
    cells = [
        planned("e", "w0-s1", num_workers=0, dataset=f"{M}:Tokens", dataset_args={"shards": 1}),
        planned("e", "w2-s1", num_workers=2, dataset=f"{M}:Tokens", dataset_args={"shards": 1}),
        planned("e", "w0-s4", num_workers=0, dataset=f"{M}:Tokens", dataset_args={"shards": 4}),
        planned("own", "base", dataset="memory", model="mlp"),
        planned("copy", "base", scenario="transfer", model=f"{M}:Bag"),
        planned("loader", "base", scenario="loader", collate=f"{M}:bad_collate"),
    ]
    found = preflight.combinations(cells)
    assert {name: [c.id for c in firsts] for name, firsts in found.items()} == {
        "e": ["w0-s1", "w0-s4"],
        "loader": ["base"],
    }
    # One process with no workers, on one GPU where its cells may use one (device auto, the
    # default).
    assert preflight.resources(found["e"]) == {"mem_mb": 2048, "gpu": 1}
    assert (
        preflight.resources([planned("g", "base", parallel="ddp", gpus_per_node=4, num_workers=8)])[
            "gpu"
        ]
        == 1
    )
    assert preflight.resources([planned("c", "base", device="cpu", num_workers=8)]) == {
        "mem_mb": 2048,
        "gpu": 0,
    }


def base(src, **knobs) -> dict:
    """A labelled train cell of the user's dict batches and model, on the CPU, as a bench job gets
    it."""
    return {
        "experiment": "e",
        "cell": "base",
        "repeat": 1,
        "device": "cpu",
        "batch_size": 4,
        "torch_threads": 1,
        "python_path": [src],
        "dataset": f"{M}:Tokens",
        "model": f"{M}:Bag",
        "forward_keys": ["input_ids"],
        **knobs,
    }


def run_check(tmp_path, cells: list[dict]) -> dict:
    out = tmp_path / "preflight.json"
    assert check.run(cells, str(out), "logs/preflight/e.log") == 0
    return json.loads(out.read_text())


def test_the_check_builds_each_stage_the_cell_runs(user_module, tmp_path):
    record = run_check(
        tmp_path, [base(user_module), base(user_module, cell="copy", scenario="transfer")]
    )
    assert record["status"] == "ok" and record["error"] is None and record["device"] == "cpu"
    assert [(c["cell"], c["stages"]) for c in record["checked"]] == [
        ("base", ["dataset", "sample", "batch", "to_device", "model", "step"]),
        ("copy", ["dataset", "sample", "batch", "to_device"]),
    ]


@pytest.mark.parametrize(
    "knobs, stage, factory, error",
    [
        (
            {"collate": f"{M}:bad_collate"},
            "collate",
            f"collate '{M}:bad_collate'",
            "ValueError: cannot pad 0-d labels",
        ),
        (
            {"model": f"{M}:too_wide"},
            "model",
            f"model '{M}:too_wide'",
            "MemoryError: model too wide",
        ),
        (
            {"optimizer": f"{M}:bad_optimizer"},
            "optimizer",
            f"optimizer '{M}:bad_optimizer'",
            "TypeError: betas must be a pair",
        ),
        (
            {"forward_keys": ["input_idz"]},
            "step",
            f"the step of model '{M}:Bag' (forward, loss, backward)",
            "KnobError: knob 'forward_keys': the batch has no key 'input_idz' (did you mean "
            "'input_ids'?); allowed: input_ids, label",
        ),
        (
            {"label_key": "labels"},
            "step",
            f"the step of model '{M}:Bag' (forward, loss, backward)",
            "KnobError: knob 'label_key': the model's output has no loss and the batch has no "
            "key 'labels' (did you mean 'label'?) to take cross-entropy against; allowed: "
            "input_ids, label, or a step (package.module:train_step) returning the loss",
        ),
        # a regression without a step: cross-entropy over one output per sample is 0, whatever it
        # learns
        (
            {"dataset": f"{M}:Readings", "model": f"{M}:forecaster", "forward_keys": None},
            "step",
            f"the step of model '{M}:forecaster' (forward, loss, backward)",
            "KnobError: knob 'step': the default loss, cross-entropy against batch[1], needs "
            "class scores of shape (batch, classes >= 2, ...) and the model's output is (4, 1) "
            "(a regression?); allowed: knob loss: mse, l1, smooth_l1 or a loss of your own "
            "(package.module:attribute), or a step returning the loss",
        ),
    ],
)
def test_a_failure_names_its_factory_and_the_exceptions_first_line(
    user_module, tmp_path, knobs, stage, factory, error
):
    record = run_check(tmp_path, [base(user_module, **knobs), base(user_module, cell="second")])
    # a failure stops the experiment; the other combination is checked still
    assert record["status"] == "failed" and [c["cell"] for c in record["checked"]] == ["second"]
    assert record["errors"] == [record["error"]]
    found = record["error"]
    assert (found["stage"], found["factory"], f"{found['type']}: {found['message']}") == (
        stage,
        factory,
        error,
    )
    assert preflight.reason(record) == f"{factory} raised {error} (traceback: logs/preflight/e.log)"


def test_a_check_that_dies_still_leaves_a_failed_record(user_module, tmp_path):
    """The job runs the check in a process of its own: killed (the OOM killer, a crash in a C
    extension), it still stops the experiment with a record, and the log keeps what the check
    printed."""
    out, log = tmp_path / "results" / "dies.json", tmp_path / "logs" / "dies.log"
    cells = json.dumps([base(user_module, dataset=f"{M}:dies", scenario="loader")])
    assert preflight.run(cells, str(out), str(log)) == 0
    record = json.loads(out.read_text())
    assert record["status"] == "failed" and record["experiment"] == "e"
    assert record["error"]["type"] == "Killed"
    assert preflight.stopped_line("e", str(out)) == (
        "feedbench: experiment e stopped by its preflight, none of its cells ran: the preflight "
        f"exited with code -9 (SIGKILL) without writing its record (log: {log})"
    )


def test_the_reports_failed_section_says_which_experiment_its_preflight_stopped():
    """Always said, in a run of one experiment too; other experiments' failures as before."""
    import pandas as pd
    from feedbench.analysis.report import failure_counts

    summary = pd.DataFrame(
        {
            "experiment": ["a", "b", "b"],
            "status": ["failed", "failed", "ok"],
            "error_type": [preflight.STOPPED_TYPE, "RuntimeError", None],
        }
    )
    assert failure_counts(summary) == {
        "overall": "2 of 3 runs failed, 1 completed.",
        "experiments": [
            "Experiment a: stopped by its preflight, its only run not started.",
            "Experiment b: 1 of 2 runs failed, 1 completed.",
        ],
    }
    alone = summary.iloc[:1].assign(error_type=preflight.STOPPED_TYPE)
    assert failure_counts(pd.concat([alone, alone]))["experiments"] == [
        "Experiment a: stopped by its preflight, none of its 2 runs started."
    ]


def test_every_mismatch_of_a_combination_is_found_in_one_run(user_module, tmp_path):
    """#49: a bad forward_keys, a bad label_key and a loss class that cannot be built, in one run;
    a dataset that raises and a model that raises, in one run (the model is built though the data
    failed); each named by its factory, and the run's end says each on a line of its own."""
    record = run_check(
        tmp_path,
        [
            base(
                user_module,
                forward_keys=["input_idz"],
                label_key="labels",
                loss=f"{M}:Weighted",
            )
        ],
    )
    assert record["status"] == "failed" and record["checked"] == []
    assert [(e["stage"], e["message"]) for e in record["errors"]] == [
        ("loss", "weights for 2 classes, got 3"),
        (
            "step",
            "knob 'forward_keys': the batch has no key 'input_idz' (did you mean 'input_ids'?); "
            "allowed: input_ids, label",
        ),
        (
            "step",
            "knob 'label_key': the batch has no key 'labels' (did you mean 'label'?) to take "
            f"{M}:Weighted against; allowed: input_ids, label, or a step "
            "(package.module:train_step) returning the loss",
        ),
    ]
    out = tmp_path / "preflight.json"
    assert preflight.stopped_line("e", str(out)).splitlines() == [
        "feedbench: experiment e stopped by its preflight, none of its cells ran: 3 faults "
        "(tracebacks: logs/preflight/e.log):",
        f"  loss '{M}:Weighted' raised ValueError: weights for 2 classes, got 3",
        *(f"  {line}" for line in preflight.faults(record)[1:]),
    ]
    record = run_check(
        tmp_path, [base(user_module, dataset=f"{M}:no_volume", model=f"{M}:too_wide")]
    )
    assert [(e["stage"], e["type"]) for e in record["errors"]] == [
        ("dataset", "FileNotFoundError"),
        ("model", "MemoryError"),
    ]


def test_a_ceiling_experiment_waits_for_the_experiments_it_bounds(tmp_path):
    """Its preflight waits for theirs; a combination that bounds only stopped experiments is not
    checked (no process when none is left), and its cells are stopped with them, while a ceiling
    cell another experiment still needs runs."""
    from feedbench.plan.matrix import build_cells

    base = {"dataset": f"{M}:Tokens", "model": f"{M}:Bag", "device": "cpu"}
    config = {
        "experiments": {
            name: {"base": base, "matrix": {"num_workers": [workers]}, "ceilings": True}
            for name, workers in (("a", 0), ("b", 1))
        }
    }
    cells = build_cells(config, check=False)
    gated = preflight.gates(cells, ["a", "b", "ceilings-loader", "ceilings-compute"])
    loader, compute = gated["ceilings-loader"], gated["ceilings-compute"]
    assert sorted(loader.values()) == [["a"], ["b"]] and list(compute.values()) == [["a", "b"]]
    # the loader ceilings are one combination, which waits for both
    waits = preflight.waits_for("ceilings-loader", cells, loader)
    assert list(waits.values()) == [["a", "b"]]
    assert preflight.orphaned(loader, {"a"}) == {
        cell: "a" for cell, s in loader.items() if s == ["a"]
    }
    assert preflight.orphaned(compute, {"a"}) == {}
    # an experiment without a preflight (b here) keeps every ceiling cell it needs
    assert preflight.gates(cells, ["a", "ceilings-loader"]) == {
        "ceilings-loader": {cell: ["a"] for cell, s in loader.items() if s == ["a"]}
    }
    records = {}
    for name in ("a", "b"):
        records[name] = str(tmp_path / f"{name}.json")
        error = {"stage": "dataset", "factory": "dataset 'x:y'", "type": "OSError", "message": "no"}
        preflight.write(records[name], preflight.record(name, f"{name}.log", [], [error]))
    out, log = tmp_path / "loader.json", tmp_path / "loader.log"
    first = next(iter(waits))
    after = json.dumps({first: [records["a"], records["b"]]})
    cell = {**base, "experiment": "ceilings-loader", "cell": first, "scenario": "loader"}
    assert preflight.run(json.dumps([cell]), str(out), str(log), after=after) == 0
    record = json.loads(out.read_text())
    assert record["status"] == "ok" and record["checked"] == []
    assert record["skipped"] == [
        {
            "cell": first,
            "why": "it bounds only cells of experiments their preflight stopped: a, b",
        }
    ]


def test_a_fault_several_experiments_share_is_said_once(tmp_path):
    def write(name: str, *messages: str) -> str:
        path = str(tmp_path / f"{name}.json")
        errors = [
            {"stage": "dataset", "factory": "dataset 'x:y'", "type": "OSError", "message": m}
            for m in messages
        ]
        preflight.write(path, preflight.record(name, f"logs/{name}.log", [], errors))
        return path

    records = {
        "a": write("a", "no volume"),
        "b": write("b", "no volume"),
        "c": write("c", "no index"),
        "d": str(tmp_path / "missing.json"),
    }
    assert preflight.stopped_lines(records) == [
        "feedbench: experiments a, b stopped by their preflights (the same faults), none of "
        "their cells ran: dataset 'x:y' raised OSError: no volume (traceback: logs/a.log)",
        "feedbench: experiment c stopped by its preflight, none of its cells ran: dataset 'x:y' "
        "raised OSError: no index (traceback: logs/c.log)",
    ]
