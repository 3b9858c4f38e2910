"""The target's CPU speed measured by the same reference loader cell on both machines: `python -m
feedbench cpu-speed --out FILE` writes the file (run for real, once), a target that names it is
checked at plan time, and the factor is there / here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest
from conftest import ROOT
from feedbench.__main__ import main
from feedbench.analysis.target_view import cpu_speed_text
from feedbench.core.cpu_speed import KIND, read_speed_file, reference
from feedbench.core.target import read_target
from feedbench.harness.cpu_speed import target_speed
from feedbench.plan.config import ConfigError
from feedbench.plan.matrix import planned_cells
from feedbench.version import __version__
from helpers.plans import SCHEMA, plan

# one worker: fixture `here` measures its cell once
pytestmark = pytest.mark.xdist_group("cpu_speed")

H100 = {"gpu": "H100", "cores_per_gpu": 8}


@pytest.fixture(scope="module")
def here(tmp_path_factory) -> str:
    """The command's file, measured here for real (one repeat: the reference cell is the same
    whatever the repeats)."""
    path = str(tmp_path_factory.mktemp("cpu-speed") / "here.json")
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "workflow")}
    done = subprocess.run(
        [sys.executable, "-m", "feedbench", "cpu-speed", "--out", path, "--repeats", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"wrote {path}: ") and len(done.stdout.splitlines()) == 1
    return path


def copy_of(source: str, path, **changes) -> str:
    """The file at `source` written to `path` with `changes` over its fields."""
    with open(source, encoding="utf-8") as f:
        record = json.load(f)
    record.update(changes)
    path.write_text(json.dumps(record))
    return str(path)


def test_the_command_writes_a_cpu_speed_file_of_the_reference_cell(here):
    record = read_speed_file(here)  # the plan's own check passes
    assert record["kind"] == KIND and record["reference"] == reference()
    assert (
        record["reference"]["knobs"]["num_workers"] == 0
        and record["reference"]["knobs"]["torch_threads"] == 1
    )
    assert (
        len(record["repeats"]) == 1 and record["samples_per_s_per_core"] == record["repeats"][0] > 0
    )
    assert record["spread_pct"] == 0
    # the monitor's share of the core, in %
    assert len(record["cpu_pct"]) == 1 and 0 < record["cpu_pct"][0] <= 200
    assert record["host"] and record["cpu"] and record["feedbench"] == __version__
    assert datetime.fromisoformat(record["date"]).tzinfo is not None


def test_a_target_naming_the_file_plans_and_its_speed_is_there_over_here(here, tmp_path):
    assert plan({**H100, "cpu_speed": here}) == ""
    # The same file there and here: 1. A copy whose figure is halved (the ratio's arithmetic; the
    # file is real otherwise): 0.5, the slower target.
    same = target_speed(read_target({**H100, "cpu_speed": here}), here=read_speed_file(here))
    assert same["cpu_speed"] == pytest.approx(1.0) and same["cpu_speed_from"] == "measured"
    rate = read_speed_file(here)["samples_per_s_per_core"]
    there = copy_of(
        here, tmp_path / "there.json", samples_per_s_per_core=rate / 2, host="gpu-node-1"
    )
    speed = target_speed(read_target({**H100, "cpu_speed": there}), here=read_speed_file(here))
    assert speed["cpu_speed"] == pytest.approx(0.5)
    assert (
        speed["cpu_speed_there"]["host"] == "gpu-node-1"
        and speed["cpu_speed_here"]["host"] != "gpu-node-1"
    )
    assert speed["cpu_speed_file"] == there
    text = cpu_speed_text(speed)
    assert (
        text.startswith("0.50x a core here, measured")
        and f"{rate / 2:.1f} samples/s on one core there" in text
    )
    assert f"{rate:.1f} samples/s on one core here" in text
    shared = target_speed(
        read_target({**H100, "cpu_speed": there}), here={**read_speed_file(here), "cpu_pct": [40.0]}
    )
    assert "1 repeats, spread 0 %, its core shared: 40 % of it)" in cpu_speed_text(shared)


def test_a_number_stays_given():
    speed = target_speed(read_target({**H100, "cpu_speed": 1.25}))
    assert speed == {"cpu_speed": 1.25, "cpu_speed_from": "given"}
    assert cpu_speed_text(speed) == "1.25x a core here (given in the config)"


def test_a_missing_file_is_one_line_at_plan_time(tmp_path):
    missing = str(tmp_path / "there.json")
    assert plan({**H100, "cpu_speed": missing}) == (
        f"bad config: target.cpu_speed: no file {missing}; allowed: a number > 0, or a file "
        "written by `python -m feedbench cpu-speed --out FILE` on the target"
    )


def test_a_file_of_another_reference_cell_is_one_line_naming_what_differs(here, tmp_path):
    other = reference()
    other["knobs"]["batch_size"] = 32
    other["images"]["size"] = 128
    path = copy_of(here, tmp_path / "other.json", reference=other)
    got = plan({**H100, "cpu_speed": path})
    assert got == (
        f"bad config: target.cpu_speed: {path} measured another reference cell (images.size 128 "
        "(here: 256), knobs.batch_size 32 (here: 16)); allowed: a file of this feedbench's "
        "reference cell (run `python -m feedbench cpu-speed` there again)"
    )
    assert len(got.splitlines()) == 1


@pytest.mark.parametrize(
    "changes, wrong",
    [
        ({"kind": "something else"}, "is not a cpu-speed file (no kind 'feedbench cpu-speed')"),
        ({"samples_per_s_per_core": 0}, "gives samples_per_s_per_core 0; allowed: a number > 0"),
    ],
)
def test_a_file_that_is_not_a_measurement_is_one_line(here, tmp_path, changes, wrong):
    path = copy_of(here, tmp_path / "bad.json", **changes)
    with pytest.raises(ConfigError) as error:
        read_speed_file(path)
    assert wrong in str(error.value) and len(str(error.value).splitlines()) == 1


def test_a_relative_file_is_found_beside_the_config_that_names_it(here, tmp_path):
    folder = tmp_path / "plans"
    folder.mkdir()
    copy_of(here, folder / "there.json")
    configfile = folder / "config.yaml"
    config = {
        "target": {**H100, "cpu_speed": "there.json"},
        "experiments": {"e": {"base": {"scenario": "loader", "dataset": "synthetic"}}},
    }
    configfile.write_text(json.dumps(config))
    planned_cells(config, SCHEMA, [str(configfile)], str(tmp_path / "images"))
    assert config["target"]["cpu_speed"] == str(folder / "there.json")


def test_bad_repeats_is_one_line(capsys, tmp_path):
    assert main(["cpu-speed", "--out", str(tmp_path / "x.json"), "--repeats", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "feedbench: error: cpu-speed: --repeats 0 is not allowed; allowed: 1 or more\n"
    assert not (tmp_path / "x.json").exists()
