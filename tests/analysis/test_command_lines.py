"""A command experiment's own lines under its verdict (analysis.command): the loader its loop trains
on, and the fidelity of the instrumented command against the command alone."""

from __future__ import annotations

import pandas as pd
from feedbench.analysis.command import lines, where
from feedbench.analysis.report import fmt as number  # noqa: E402  (the report's own numbers)


def rows(**baseline) -> pd.DataFrame:
    common = {
        "status": "ok",
        "training_loader": "/home/u/proj/train.py:57 in train_dataloader",
        "workdir": "/home/u/proj",
        "asked_num_workers": 0,
    }
    return pd.DataFrame(
        [
            {**common, "cell": "num_workers-0", "baseline": True, **baseline},
            {**common, "cell": "num_workers-2", "baseline": False},
        ]
    )


def test_the_training_loader_is_named_where_the_script_built_it():
    found = lines(rows(), number)
    assert found == [
        "Your loop: it trains on the loader built at train.py:57 in train_dataloader, the one "
        "whose batches a backward pass follows; that loader asks for num_workers=0."
    ]
    assert where("/elsewhere/x.py:3 in f", "/home/u/proj") == "/elsewhere/x.py:3 in f"


def test_fidelity_says_how_close_the_instrument_stayed_and_against_which_goal():
    found = lines(
        rows(
            fidelity_ratio=1.031,
            plain_samples_per_s=412.0,
            instrumented_samples_per_s=399.6,
            plain_wall_s=41.0,
        ),
        number,
    )
    assert found[1] == (
        "Fidelity: run whole, start-up included, your command alone gave 412 samples/s of "
        "training (41.0 s), instrumented 400 samples/s: 3.1 % more time, outside the goal of 2 %."
    )
    faster = lines(rows(fidelity_ratio=0.99, plain_samples_per_s=1.0, plain_wall_s=1.0), number)
    assert "1.0 % less time (the two runs' noise), within the goal of 2 %" in faster[1]


def test_runs_that_were_not_compared_say_why_and_other_experiments_have_no_lines():
    note = "not compared: the plain run exited with code 1"
    assert lines(rows(fidelity_note=note), number)[1] == f"Fidelity: {note}."
    assert lines(pd.DataFrame([{"status": "ok", "cell": "x", "baseline": True}]), number) == []
