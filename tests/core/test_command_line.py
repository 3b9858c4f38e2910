"""A command cell's command as the plan reads it (core.command): split as a shell splits it, checked
before any job, fingerprinted so a change to the script reruns its cells."""

from __future__ import annotations

import sys

import pytest
from feedbench.core import command
from feedbench.core.cell import parse_cell
from feedbench.core.knobs import ConfigError, KnobError
from feedbench.plan.matrix import build_cells


def test_a_command_is_split_as_a_shell_splits_it():
    assert command.argv('train.py --name "my run" -x') == ["train.py", "--name", "my run", "-x"]
    assert command.script_of(command.argv("-m pkg.train --epochs 1")) is None
    assert command.script_of(command.argv("train.py")) == "train.py"


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"command": 'train.py --name "x'}, "cannot be split (No closing quotation)"),
        ({"command": "-c 'print(1)'"}, "names no script"),
        ({"command": "-m"}, "names no module after -m"),
        ({"command": "train.py", "scenario": "transfer"}, "allowed: train, loader, compute"),
        ({"command": "train.py", "parallel": "dp"}, "allowed: none, or ddp"),
        ({"command": "train.py", "batch_size": 32}, "knob 'batch_size': value 32 is not allowed"),
        ({"python": "python3"}, "knob 'python': value 'python3' is set without a command"),
    ],
)
def test_what_a_command_cell_cannot_run_is_refused_in_one_line(knobs, message):
    with pytest.raises(KnobError) as error:
        parse_cell(knobs)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_command_cell_takes_the_loader_knobs():
    cell = parse_cell({"command": "train.py", "num_workers": 4, "pin_memory": True})
    assert (cell.command, cell.num_workers, cell.pin_memory) == ("train.py", 4, True)


def config(command_line: str = "train.py --max-steps 25") -> dict:
    return {
        "defaults": {"repeats": 1, "batch_size": 32, "steps": 20},
        "experiments": {
            "mine": {
                "ceilings": True,
                "base": {"command": command_line, "stage_timing": True},
                "matrix": {"num_workers": [0, 2]},
            },
            "other": {"base": {"model": "mlp"}},
        },
    }


def test_the_plan_runs_a_command_in_the_config_files_folder(tmp_path):
    """workdir: the config file's folder; `defaults` the script decides (batch_size, set there for
    the other experiment) dropped from its cells; its ceilings are the loader alone and its own loop
    on replayed batches, with no transfer probe (its copy is its own loop's)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    cells = build_cells(config(), args_folder=str(tmp_path))
    mine = [c for c in cells if c.experiment == "mine"]
    assert [c.id for c in mine] == ["num_workers-0", "num_workers-2"]
    assert all(c.knobs["workdir"] == str(tmp_path) for c in mine)
    assert all("batch_size" not in c.knobs for c in mine)
    other = next(c for c in cells if c.experiment == "other")
    assert other.knobs["batch_size"] == 32
    derived = {c.experiment for c in cells} - {"mine", "other"}
    assert derived == {"ceilings-loader", "ceilings-compute"}


def test_a_script_that_is_not_there_stops_the_plan(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    with pytest.raises(ConfigError) as error:
        build_cells(config("trian.py --max-steps 25"), args_folder=str(tmp_path))
    assert "script 'trian.py' does not exist in" in str(error.value)
    assert str(error.value).startswith("experiments.mine.base.command:")


def test_the_interpreter_is_checked_before_any_job(tmp_path):
    knobs = {"command": "x.py", "workdir": str(tmp_path), "python": "no-such-python-here"}
    (tmp_path / "x.py").write_text("")
    with pytest.raises(KnobError, match="no executable file nor a name on PATH"):
        command.check_paths(knobs)
    command.check_paths({**knobs, "python": sys.executable})


def test_a_change_to_the_script_changes_its_fingerprint(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    knobs = {"command": "train.py --x 1", "workdir": str(tmp_path)}
    first = command.fingerprint(knobs)
    assert first == command.fingerprint(dict(knobs))
    script.write_text("print(2)\n")
    assert command.fingerprint(knobs) != first
    assert command.fingerprint({**knobs, "command": "train.py --x 2"}) != command.fingerprint(knobs)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "train.py").write_text("")
    assert command.fingerprint({"command": "-m pkg.train", "workdir": str(tmp_path)})
