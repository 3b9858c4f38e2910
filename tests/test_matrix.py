"""feedbench.matrix: config experiments -> cells, ids, baseline, errors with key paths (no Snakemake run)."""

from __future__ import annotations

import os

import pytest
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from conftest import ROOT
from feedbench import matrix
from feedbench.knobs import KnobError
from feedbench.matrix import ConfigError, build_cells, cell_id, expand_experiment

SCHEMA = os.path.join(ROOT, "config", "schema.yaml")
PACKAGE = os.path.join(ROOT, "workflow", "feedbench")


def ids(cells):
    return [c.id for c in cells]


def config_error(config: dict, images_dir: str | None = None) -> str:
    """What the Snakefile does (workflow/rules/common.smk): validate, then build and check the cells."""
    try:
        validate(config, SCHEMA)
    except WorkflowError as error:
        return "bad config: " + matrix.schema_error(error.__context__)
    try:
        build_cells(config, images_dir)
    except ConfigError as error:
        return f"bad config: {error}"
    return ""


def test_product_in_axis_order_with_readable_ids():
    exp = {"base": {"scenario": "loader"}, "matrix": {"num_workers": [0, 2], "pin_memory": [False, True]}}
    cells = expand_experiment("workers", exp, {"steps": 5, "repeats": 3})
    assert ids(cells) == [
        "num_workers-0_pin_memory-false",
        "num_workers-0_pin_memory-true",
        "num_workers-2_pin_memory-false",
        "num_workers-2_pin_memory-true",
    ]
    assert cells[3].knobs == {"steps": 5, "scenario": "loader", "num_workers": 2, "pin_memory": True}
    assert "repeats" not in cells[0].knobs
    assert [c.baseline for c in cells] == [True, False, False, False]
    assert matrix.baseline(cells, "workers").id == "num_workers-0_pin_memory-false"


def test_adding_a_level_keeps_existing_ids():
    before = expand_experiment("e", {"matrix": {"num_workers": [0, 1], "hidden_layers": [1]}}, {})
    after = expand_experiment("e", {"matrix": {"num_workers": [0, 1, 2], "hidden_layers": [1, 4]}}, {})
    assert set(ids(before)) < set(ids(after))
    assert {c.id: c.knobs for c in before}.items() <= {c.id: c.knobs for c in after}.items()


def test_base_knobs_override_defaults_and_levels_override_base():
    cells = expand_experiment("e", {"base": {"steps": 7, "batch_size": 8}, "matrix": {"batch_size": [16]}}, {"steps": 3, "seed": 1})
    assert cells[0].knobs == {"steps": 7, "seed": 1, "batch_size": 16}
    assert cells[0].sources == {"steps": "experiments.e.base.steps", "seed": "defaults.seed", "batch_size": "experiments.e.matrix.batch_size"}


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
    assert cell_id({"data_dir": "/data/my images", "transfer_sizes": [1024, 4096], "prefetch_factor": None}, ["data_dir", "transfer_sizes", "prefetch_factor"]) == (
        "data_dir-+data+my+images_transfer_sizes-1024+4096_prefetch_factor-none"
    )
    long = cell_id({"data_dir": "x" * 500}, ["data_dir"])
    assert len(long) == matrix.MAX_ID_LENGTH and "/" not in long
    assert long != cell_id({"data_dir": "x" * 499}, ["data_dir"])


def test_generated_images_fill_in_a_missing_data_dir_only():
    cells = expand_experiment("e", {"base": {"dataset": "images"}, "matrix": {"data_dir": [None, "/real"]}}, {}, images_dir="results/data/images")
    assert [c.knobs["data_dir"] for c in cells] == ["results/data/images", "/real"]
    assert matrix.needs_images(cells, "results/data/images")


def test_duplicate_cells_are_refused():
    exp = {"matrix": {"num_workers": [0, 1]}, "include": [{"num_workers": 1}]}
    with pytest.raises(ConfigError, match=r"^experiments\.e\.include\[0\]: duplicates cell 'num_workers-1'"):
        expand_experiment("e", exp, {})


def test_exclusions_that_match_nothing_or_remove_the_baseline_are_refused():
    with pytest.raises(ConfigError, match=r"^experiments\.e\.exclude\[0\]: value \{'num_workers': 3\} matches no cell"):
        expand_experiment("e", {"matrix": {"num_workers": [0, 1]}, "exclude": [{"num_workers": 3}]}, {})
    with pytest.raises(ConfigError, match=r"^experiments\.e\.exclude: removes the baseline"):
        expand_experiment("e", {"matrix": {"num_workers": [0, 1]}, "exclude": [{"num_workers": 0}]}, {})


def test_harness_errors_are_rewritten_with_the_key_path():
    sources = {"num_workers": "experiments.w.matrix.num_workers"}
    error = matrix.knob_error(KnobError("knob 'num_workers': value -1 is out of range; allowed: an integer >= 0"), sources)
    assert str(error) == "experiments.w.matrix.num_workers: value -1 is out of range; allowed: an integer >= 0"


@pytest.mark.parametrize(
    "config, message",
    [
        ({"experiments": {"w": {"matrix": {"num_workers": [0, -1]}}}},
         "bad config: experiments.w.matrix.num_workers: value -1 is out of range; allowed: an integer >= 0"),
        ({"experiments": {"w": {"include": [{"pin_memory": "yes"}]}}},
         "bad config: experiments.w.include[0].pin_memory: value 'yes' has the wrong type; allowed: true or false"),
        ({"defaults": {"steps": 0}, "experiments": {"w": {}}},
         "bad config: defaults.steps: value 0 is out of range; allowed: an integer >= 1"),
        ({"defaults": {"nm_workers": 2}, "experiments": {"w": {}}},
         "bad config: defaults.nm_workers: unknown knob (did you mean num_workers?); allowed: amp, batch_size,"),
        ({"experiments": {"w": {"plot": [{"x": "num_workers", "kind": "pie"}]}}},
         "bad config: experiments.w.plot[0].kind: value 'pie' is not allowed; allowed: line, bar, phases, heatmap"),
        ({"experiments": {"w": {"plot": {"x": "num_workers", "colour": "red"}}}},
         "bad config: experiments.w.plot.colour: unknown key; allowed: hue, kind, title, x, y"),
        ({"images": {"count": 0}, "experiments": {"w": {}}},
         "bad config: images.count: value 0 is out of range; allowed: >= 1"),
        ({"experiments": {}},
         "bad config: experiments: value {} has too few entries; allowed: at least 1"),
        ({"experiments": {"w": {"base": {"dataset": "tokens", "model": "mlp"}}}},
         "bad config: experiments.w.base.model: value 'mlp' is not allowed with dataset 'tokens'; allowed: lstm, sleep, none"),
    ],
)
def test_bad_configs_give_one_line_with_the_key_path(config, message):
    got = config_error(config)
    assert got.startswith(message), got
    assert "\n" not in got


def test_defaults_are_filled_in_by_the_schema():
    config = {"experiments": {"w": {"base": {"scenario": "loader"}}}}
    validate(config, SCHEMA)
    assert config["defaults"] == {"repeats": 3, "torch_threads": 1}
    assert config["images"] == {"count": 512, "size": 64, "classes": 10, "seed": 0}
    assert config["experiments"]["w"]["matrix"] == {} and config["experiments"]["w"]["include"] == []


def test_harness_files_are_what_the_cli_runs():
    names = {os.path.relpath(p, PACKAGE) for p in matrix.harness_files(PACKAGE)}
    assert {"__main__.py", "__init__.py", "runner.py", "harness.py", "cell.py", "knobs.py", "images.py", os.path.join("schemas", "result.schema.json")} <= names
    assert "matrix.py" not in names  # the workflow's own module: editing it reruns no cell
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
