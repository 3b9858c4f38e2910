"""feedbench.plan.matrix: config experiments -> cells, ids, baseline, errors with key paths (no
Snakemake run)."""

from __future__ import annotations

import math
import os

import pytest
import yaml
from conftest import ROOT
from feedbench.core import planned_cell
from feedbench.core.knobs import KnobError
from feedbench.plan import matrix
from feedbench.plan.config import count_values, one_line, read_config_file, validate_config
from feedbench.plan.matrix import ConfigError, PlannedCell, build_cells, cell_id, expand_experiment

SCHEMA = os.path.join(ROOT, "config", "schema.yaml")
PACKAGE = os.path.join(ROOT, "workflow", "feedbench")


def ids(cells):
    return [c.id for c in cells]


def config_error(config: dict, images_dir: str | None = None) -> str:
    """What the Snakefile does (workflow/rules/common.smk): bound, validate, then build and check
    the cells."""
    try:
        count_values(config)
        validate_config(config, SCHEMA)
        build_cells(config, images_dir)
    except ConfigError as error:
        return one_line(error)
    return ""


def file_error(path) -> str:
    """The ConfigError read_config_file raises for the file `path`."""
    with pytest.raises(ConfigError) as error:
        read_config_file(str(path))
    return str(error.value)


def test_product_in_axis_order_with_readable_ids():
    exp = {
        "base": {"scenario": "loader"},
        "matrix": {"num_workers": [0, 2], "pin_memory": [False, True]},
    }
    cells = expand_experiment("workers", exp, {"steps": 5, "repeats": 3})
    assert ids(cells) == [
        "num_workers-0_pin_memory-false",
        "num_workers-0_pin_memory-true",
        "num_workers-2_pin_memory-false",
        "num_workers-2_pin_memory-true",
    ]
    assert cells[3].knobs == {
        "steps": 5,
        "scenario": "loader",
        "num_workers": 2,
        "pin_memory": True,
    }
    assert "repeats" not in cells[0].knobs
    assert [c.baseline for c in cells] == [True, False, False, False]
    assert matrix.baseline(cells, "workers").id == "num_workers-0_pin_memory-false"


def test_adding_a_level_keeps_existing_ids():
    before = expand_experiment("e", {"matrix": {"num_workers": [0, 1], "hidden_layers": [1]}}, {})
    after = expand_experiment(
        "e", {"matrix": {"num_workers": [0, 1, 2], "hidden_layers": [1, 4]}}, {}
    )
    assert set(ids(before)) < set(ids(after))
    assert {c.id: c.knobs for c in before}.items() <= {c.id: c.knobs for c in after}.items()


def test_base_knobs_override_defaults_and_levels_override_base():
    cells = expand_experiment(
        "e",
        {"base": {"steps": 7, "batch_size": 8}, "matrix": {"batch_size": [16]}},
        {"steps": 3, "seed": 1},
    )
    assert cells[0].knobs == {"steps": 7, "seed": 1, "batch_size": 16}
    assert cells[0].sources == {
        "steps": "experiments.e.base.steps",
        "seed": "defaults.seed",
        "batch_size": "experiments.e.matrix.batch_size",
    }


def test_exclude_then_include():
    exp = {
        "matrix": {"num_workers": [0, 1], "pin_memory": [False, True]},
        "exclude": [{"num_workers": 0, "pin_memory": True}],
        "include": [{"num_workers": 4, "pin_memory": True, "prefetch_factor": 4}],
    }
    assert ids(expand_experiment("e", exp, {})) == [
        "num_workers-0_pin_memory-false",
        "num_workers-1_pin_memory-false",
        "num_workers-1_pin_memory-true",
        "num_workers-4_pin_memory-true_prefetch_factor-4",
    ]


def test_experiment_without_matrix_is_one_base_cell():
    cells = expand_experiment("transfer", {"base": {"scenario": "transfer"}}, {})
    assert ids(cells) == ["base"] and cells[0].baseline


def test_ids_are_sanitised_for_paths_and_bounded():
    assert cell_id(
        {"data_dir": "/data/my images", "transfer_sizes": [1024, 4096], "prefetch_factor": None},
        ["data_dir", "transfer_sizes", "prefetch_factor"],
    ) == ("data_dir-+data+my+images_transfer_sizes-1024+4096_prefetch_factor-none")
    long = cell_id({"data_dir": "x" * 500}, ["data_dir"])
    assert len(long) == planned_cell.MAX_ID_LENGTH and "/" not in long
    assert long != cell_id({"data_dir": "x" * 499}, ["data_dir"])


def test_generated_images_fill_in_a_missing_data_dir_only():
    cells = expand_experiment(
        "e",
        {"base": {"dataset": "images"}, "matrix": {"data_dir": [None, "/real"]}},
        {},
        images_dir="results/data/images",
    )
    assert [c.knobs["data_dir"] for c in cells] == ["results/data/images", "/real"]
    assert matrix.needs_images(cells, "results/data/images")


def test_duplicate_cells_are_refused():
    exp = {"matrix": {"num_workers": [0, 1]}, "include": [{"num_workers": 1}]}
    with pytest.raises(
        ConfigError, match=r"^experiments\.e\.include\[0\]: duplicates cell " r"'num_workers-1'"
    ):
        expand_experiment("e", exp, {})


def test_exclusions_that_match_nothing_or_remove_the_baseline_are_refused():
    with pytest.raises(
        ConfigError,
        match=r"^experiments\.e\.exclude\[0\]: value " r"\{'num_workers': 3\} matches no cell",
    ):
        expand_experiment(
            "e", {"matrix": {"num_workers": [0, 1]}, "exclude": [{"num_workers": 3}]}, {}
        )
    with pytest.raises(ConfigError, match=r"^experiments\.e\.exclude: removes the baseline"):
        expand_experiment(
            "e", {"matrix": {"num_workers": [0, 1]}, "exclude": [{"num_workers": 0}]}, {}
        )


def test_harness_errors_are_rewritten_with_the_key_path():
    sources = {"num_workers": "experiments.w.matrix.num_workers"}
    error = matrix.knob_error(
        KnobError("knob 'num_workers': value -1 is out of range; allowed: an integer >= 0"), sources
    )
    assert (
        str(error) == "experiments.w.matrix.num_workers: value -1 is out of range; "
        "allowed: an integer >= 0"
    )


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"experiments": {"w": {"matrix": {"num_workers": [0, -1]}}}},
            "bad config: experiments.w.matrix.num_workers: value -1 is out of range; allowed: an "
            "integer >= 0",
        ),
        (
            {"experiments": {"w": {"include": [{"pin_memory": "yes"}]}}},
            "bad config: experiments.w.include[0].pin_memory: value 'yes' has the wrong type; "
            "allowed: true or false",
        ),
        (
            {"defaults": {"steps": 0}, "experiments": {"w": {}}},
            "bad config: defaults.steps: value 0 is out of range; allowed: an integer >= 1",
        ),
        (
            {"defaults": {"nm_workers": 2}, "experiments": {"w": {}}},
            "bad config: defaults.nm_workers: unknown knob (did you mean num_workers?); allowed: "
            "amp, batch_size,",
        ),
        (
            {"experiments": {"w": {"plot": [{"x": "num_workers", "kind": "pie"}]}}},
            "bad config: experiments.w.plot[0].kind: value 'pie' is not allowed; allowed: line, "
            "bar, phases, heatmap",
        ),
        (
            {"experiments": {"w": {"plot": {"x": "num_workers", "colour": "red"}}}},
            "bad config: experiments.w.plot.colour: unknown key; allowed: hue, kind, title, x, y",
        ),
        (
            {"images": {"count": 0}, "experiments": {"w": {}}},
            "bad config: images.count: value 0 is out of range; allowed: >= 1",
        ),
        (
            {"experiments": {}},
            "bad config: experiments: value {} has too few entries; allowed: at least 1",
        ),
        (
            {"experiments": {"w": {"base": {"dataset": "tokens", "model": "mlp"}}}},
            "bad config: experiments.w.base.model: value 'mlp' is not allowed with dataset "
            "'tokens'; allowed: lstm, sleep, none",
        ),
    ],
)
def test_bad_configs_give_one_line_with_the_key_path(config, message):
    got = config_error(config)
    assert got.startswith(message), got
    assert "\n" not in got


def test_defaults_are_filled_in_by_the_schema():
    config = {"experiments": {"w": {"base": {"scenario": "loader"}}, "v": {}}}
    validate_config(config, SCHEMA)
    # torch_threads: the harness's own default, the launch's threads
    assert config["defaults"] == {"repeats": 3}
    assert config["max_cells"] == matrix.MAX_CELLS
    # copies, not one shared {}
    assert config["experiments"]["v"]["base"] is not config["experiments"]["w"]["base"]
    assert config["images"] == {"count": 512, "size": 64, "classes": 10, "seed": 0}
    assert (
        config["experiments"]["w"]["matrix"] == {} and config["experiments"]["w"]["include"] == []
    )


def test_harness_files_are_what_the_cli_runs():
    names = {os.path.relpath(p, PACKAGE) for p in matrix.harness_files(PACKAGE)}
    assert {
        "__main__.py",
        "__init__.py",
        os.path.join("harness", "__init__.py"),
        os.path.join("harness", "runner.py"),
        os.path.join("harness", "loop.py"),
        os.path.join("core", "cell.py"),
        os.path.join("core", "knobs.py"),
        os.path.join("harness", "images.py"),
        os.path.join("schemas", "result.schema.json"),
    } <= names
    # The workflow's own modules and the analysis: editing them reruns no cell.
    assert os.path.join("plan", "matrix.py") not in names
    assert not any(n.startswith("analysis") for n in names)
    assert not any(n.endswith("README.md") for n in names)  # the layers' READMEs are documentation
    assert not any(n.endswith(".pyc") for n in names)


def test_harness_fingerprint_follows_the_content(tmp_path):
    (tmp_path / "__main__.py").write_text("from .runner import run\n")
    (tmp_path / "runner.py").write_text("from . import __version__\nX = 1\n")
    (tmp_path / "__init__.py").write_text("__version__ = '1'\n")
    (tmp_path / "aggregate.py").write_text("Y = 1\n")
    first = matrix.harness_fingerprint(str(tmp_path))
    (tmp_path / "aggregate.py").write_text("Y = 2\n")
    assert matrix.harness_fingerprint(str(tmp_path)) == first
    (tmp_path / "runner.py").write_text("from . import __version__\nX = 2\n")
    assert matrix.harness_fingerprint(str(tmp_path)) != first


# Issue #9: every case below once ran jobs, crashed Snakemake or hung; now one line, before any job.
@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"experiments": {"w": {"matrix": {"momentum": [math.nan]}}}},
            "bad config: experiments.w.matrix.momentum: value nan is not a finite number; "
            "allowed: a number >= 0 and <= 1",
        ),
        (
            {"experiments": {"w": {"base": {"momentum": math.nan}}}},
            "bad config: experiments.w.base.momentum: value nan is not a finite number; allowed: "
            "a number >= 0 and <= 1",
        ),
        (
            {
                "experiments": {
                    "w": {"base": {"model": "sleep"}, "matrix": {"compute_ms": [math.inf]}}
                }
            },
            "bad config: experiments.w.matrix.compute_ms: value inf is not a finite number; "
            "allowed: a number >= 0 and <= 3600000",
        ),
        (
            {"defaults": {"lr": -math.inf}, "experiments": {"w": {}}},
            "bad config: defaults.lr: value -inf is not a finite number; allowed: a number >= 0",
        ),
        (
            {
                "experiments": {
                    "w": {"exclude": [{"momentum": math.nan}], "matrix": {"momentum": [0.0, 0.9]}}
                }
            },
            "bad config: experiments.w.exclude[0].momentum: value nan is not a finite number",
        ),
        (
            {"experiments": {"x" * 300: {}}},
            "bad config: experiments: name "
            "'xxxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxxxxxxxxxxxx' has 300 characters; "
            "allowed: at most 64",
        ),
        (
            {"experiments": {"a" * 30: {}}},
            f"bad config: experiments: name '{'a' * 30}' ends in a part repeated 20 times or "
            "more, which Snakemake refuses",
        ),
        (
            {"experiments": {"x\n": {}}},
            "bad config: experiments: name 'x\\n' is not fit for a path; allowed: letters, "
            "digits, _ and - (not first)",
        ),
        (
            {"experiments": {"w": {"view": "nmt", "reference": "nmt\n"}}},
            "bad config: experiments.w.reference: value 'nmt\\n' is not fit for a path;"
            " allowed: letters, digits, _ and - (not first)",
        ),
        (
            {"experiments": {"w": {"matrix": {"steps": [1, 10**21]}}}},
            "bad config: experiments.w.matrix.steps: value 1000000000000000000000 is out of "
            "range; allowed: an integer >= 1 and <= 1000000",
        ),
        (
            {"experiments": {"w": {"base": {"num_workers": 100_000}}}},
            "bad config: experiments.w.base.num_workers: value 100000 is out of range; allowed: "
            "an integer >= 0 and <= 256",
        ),
        (
            {"defaults": {"repeats": 10**22}, "experiments": {"w": {}}},
            "bad config: defaults.repeats: value 10000000000000000000000 is out of range; "
            "allowed: <= 100",
        ),
        (
            {"experiments": {"w": {"matrix": {"momentum": [0.0, 1, 1.0]}}}},
            "bad config: experiments.w.matrix.momentum: value 1.0 is given twice (as 1 and 1.0); "
            "allowed: levels that differ",
        ),
        (
            {"experiments": {"w": {"matrix": {"pin_memory": [True, True]}}}},
            "bad config: experiments.w.matrix.pin_memory: value True is given twice; allowed: "
            "levels that differ",
        ),
        (
            {
                "experiments": {
                    "w": {
                        "matrix": {"momentum": [0.5, 0.9]},
                        "include": [{"momentum": 0.9, "num_workers": 0}],
                    }
                }
            },
            "bad config: experiments.w.include[0]: duplicates cell 'momentum-0.9' "
            "(experiments.w.matrix); allowed: cells that differ",
        ),
        (
            {
                "experiments": {
                    "w": {
                        "matrix": {"num_workers": [0, 1]},
                        "plot": {"x": "num_workers", "y": "samples_per_sec"},
                    }
                }
            },
            (
                "bad config: experiments.w.plot.y: column 'samples_per_sec' is neither a knob "
                "nor a summary column (did you mean samples_per_s?); allowed: a knob, a monitor "
                "series' <name>_mean, or experiment, cell, repeat, baseline, status,"
            ),
        ),
        (
            {
                "experiments": {
                    "w": {"plot": [{"x": "num_workers"}, {"x": "num_workers", "hue": "colour"}]}
                }
            },
            "bad config: experiments.w.plot[1].hue: column 'colour' is neither a knob nor a "
            "summary column; allowed: a knob,",
        ),
        (
            {"experiments": {"w": {"plot": {"x": "num_wrkers", "kind": "phases"}}}},
            "bad config: experiments.w.plot.x: column 'num_wrkers' is neither a knob nor a "
            "summary column (did you mean num_workers?)",
        ),
        (
            {
                "experiments": {
                    "w": {
                        "matrix": {
                            "seed": list(range(100)),
                            "steps": list(range(1, 101)),
                            "lr": [i / 10 for i in range(100)],
                            "width": list(range(1, 101)),
                        },
                        "include": [{"seed": 100}],
                    }
                }
            },
            "bad config: experiments: 100000001 cells (w: 100000001); allowed: at most 10000 "
            "cells in all (max_cells)",
        ),
        (
            {
                "max_cells": 5,
                "experiments": {
                    "a": {"matrix": {"seed": [0, 1, 2]}},
                    "b": {"matrix": {"seed": [0, 1, 2]}},
                },
            },
            "bad config: experiments: 6 cells (a: 3, b: 3); allowed: at most 5 cells in all "
            "(max_cells)",
        ),
        (
            {"experiments": {"w": {"title": [0] * 90_000}}},
            "bad config: experiments.w.title: value [0, 0, 0, 0, 0, 0, ...] has the wrong type; "
            "allowed: a string",
        ),
    ],
)
def test_inputs_of_issue_9_give_one_line_before_any_job(config, message):
    got = config_error(config)
    assert got.startswith(message), got
    assert "\n" not in got and len(got) <= 2000


def test_max_cells_lets_a_larger_matrix_through():
    config = {"max_cells": 20, "experiments": {"w": {"matrix": {"seed": list(range(20))}}}}
    assert config_error(config) == ""


def test_plots_may_name_knobs_summary_columns_and_monitor_means():
    specs = [
        {"x": "num_workers", "y": "stall_pct", "hue": "pin_memory"},
        {"x": "num_workers", "y": "host_cpu_pct_mean"},
        {"x": "pin_memory", "y": "not used by phases", "kind": "phases"},
    ]
    config = {
        "experiments": {
            "w": {"matrix": {"num_workers": [0, 1]}, "plot": specs},
            "probe": {
                "base": {"scenario": "transfer"},
                "plot": {"x": "size_bytes", "y": "gb_per_s", "hue": "pinned"},
            },
        }
    }
    assert config_error(config) == ""


def test_summary_columns_are_what_aggregate_writes():
    """core.columns lists them without pandas (the parse checks plots against them): the list must
    not go stale."""
    from feedbench.analysis.aggregate import PREDICTION_COLUMNS, result_row
    from feedbench.core.columns import SUMMARY_COLUMNS
    from feedbench.core.knobs import KNOBS
    from feedbench.core.records import record_of

    row = result_row(
        record_of({"metrics": {"transfer": {"by_size": []}}}, "result.json")
    )  # then with_predictions' columns
    written = [c for c in row if c not in KNOBS] + PREDICTION_COLUMNS
    assert SUMMARY_COLUMNS == written
    assert {
        "samples_per_s",
        "stall_pct",
        "wait_ms",
        "transfer_peak_gb_per_s_pinned",
        "predicted_samples_per_s",
    } <= set(written)


def test_ids_never_trip_snakemakes_periodic_wildcard_check():
    from snakemake.io import PeriodicityDetector

    detector = PeriodicityDetector()
    for value in ["ab" * 30, "x" * 150, "1" * 22, "/data/" + "ab+" * 40, "a" * 500]:
        ident = cell_id({"data_dir": value}, ["data_dir"])
        assert detector.is_periodic(ident) is None, ident
        assert len(ident) <= planned_cell.MAX_ID_LENGTH
    # ordinary ids are untouched
    assert cell_id({"data_dir": "abab"}, ["data_dir"]) == "data_dir-abab"
    assert planned_cell.periodic("steps-1" + "0" * 21) and not planned_cell.periodic("steps-1000")


def test_checked_cells_keep_the_harness_cell():
    config = {"experiments": {"w": {"base": {"batch_size": 8}, "matrix": {"num_workers": [0, 1]}}}}
    validate_config(config, SCHEMA)
    checked = build_cells(config)
    assert all(isinstance(c, PlannedCell) for c in checked)
    assert [c.parsed.num_workers for c in checked] == [0, 1] and checked[0].parsed.batch_size == 8
    assert all(c.parsed is None for c in build_cells(config, check=False))


ALIAS_BOMB = "\n".join(
    ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    + ["experiments: {w: {title: *a9}}"]
)


def test_an_alias_bomb_is_refused_without_being_expanded(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)  # 10**10 values in 11 lines
    assert file_error(path) == (
        f"{path}: more than 100000 values (a YAML alias counts each time it is used); "
        "allowed: at most 100000"
    )


def test_yaml_errors_name_file_line_and_column(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("experiments:\n  w:\n    base: {steps: 5\n    title: x\n")
    assert file_error(path) == (
        f"{path}, line 4, column 10: while parsing a flow mapping: expected ',' or '}}', but got "
        "':'; allowed: YAML (or JSON)"
    )
    path.write_text("[1, 2]")
    assert file_error(path).endswith(
        "value [1, 2] is not a mapping; allowed: a mapping of config keys"
    )


def test_yte_templates_are_refused_unrun(tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "config.yaml"
    path.write_text(
        "__use_yte__: true\nexperiments:\n  w:\n    title: ?__import__('os').system('touch "
        f"{marker}') or 'yte'\n"
    )
    assert file_error(path) == (
        f"{path}: __use_yte__: YTE templates run Python code in the config; allowed: "
        "plain YAML without __use_yte__"
    )
    assert not marker.exists()
    path.write_text(
        yaml.safe_dump({"experiments": {"w": {"title": "?not code without __use_yte__"}}})
    )
    assert (
        read_config_file(str(path))["experiments"]["w"]["title"] == "?not code without __use_yte__"
    )


def test_words_yaml_reads_otherwise_are_read_as_their_author_wrote_them():
    """#49: `amp: off`, as the error message allows, is YAML's false; `cache_after: [none,
    Normalize]` meant no cache for its first level. Both are read as written, before any job, in
    the cells' ids and knobs alike; a boolean no word stands for still fails in one line that says
    how to quote."""
    config = yaml.safe_load(
        "experiments:\n"
        "  e:\n"
        "    base: {amp: off, stage_timing: true}\n"
        "    matrix: {cache_after: [none, Normalize]}\n"
    )
    cells = expand_experiment("e", config["experiments"]["e"], {})
    assert config["experiments"]["e"]["base"]["amp"] is False  # as YAML read it
    assert ids(cells) == ["cache_after-none", "cache_after-Normalize"]
    assert [c.knobs["amp"] for c in cells] == ["off", "off"]
    assert [c.knobs["cache_after"] for c in cells] == [None, "Normalize"]
    with pytest.raises(ConfigError) as error:
        expand_experiment("e", yaml.safe_load("base: {amp: on}"), {})
    assert str(error.value) == (
        "experiments.e.base.amp: value True has the wrong type; allowed: off, bf16, fp16 (YAML "
        "reads on, off, yes and no as booleans: quote a word, 'on')"
    )
