"""`ceilings: true`: every training cell gets the ceilings its prediction needs, each measured
once."""

from __future__ import annotations

import os

import pytest
from feedbench.core.ceilings import ceiling_sources
from feedbench.plan.config import validate_config
from feedbench.plan.matrix import ConfigError, build_cells

SCHEMA = "config/schema.yaml"
MLP = {
    "scenario": "train",
    "model": "mlp",
    "dataset": "memory",
    "input_size": 64,
    "width": 64,
    "batch_size": 16,
}


def cells_of(experiments: dict, defaults: dict | None = None) -> dict[str, list]:
    config = {"defaults": defaults or {}, "experiments": experiments}
    validate_config(config, SCHEMA)  # fills the schema's defaults in
    found: dict[str, list] = {}
    for cell in build_cells(config, check=True):
        found.setdefault(cell.experiment, []).append(cell)
    return found


def test_each_training_cell_gets_its_loader_compute_and_transfer_ceilings():
    found = cells_of(
        {
            "w": {
                "ceilings": True,
                "base": MLP,
                "matrix": {"num_workers": [0, 2], "hidden_layers": [1, 4]},
                "include": [{"batch_size": 32}],
            }
        }
    )
    loaders = {
        (c.knobs.get("num_workers", 0), c.knobs["batch_size"]) for c in found["ceilings-loader"]
    }
    computes = {
        (c.knobs.get("hidden_layers", 1), c.knobs["batch_size"]) for c in found["ceilings-compute"]
    }
    # 4 + 1 training cells share 3 loader ceilings (hidden_layers is no loader knob) and 3 compute
    # ceilings.
    assert loaders == {(0, 16), (2, 16), (0, 32)}
    assert computes == {(1, 16), (4, 16), (1, 32)}
    assert all(
        c.knobs["scenario"] == "loader" and "hidden_layers" not in c.knobs
        for c in found["ceilings-loader"]
    )
    assert all(
        c.knobs["scenario"] == "compute" and "num_workers" not in c.knobs
        for c in found["ceilings-compute"]
    )
    # One transfer probe covers every batch size: 16 and 32 samples of 64 float32 features and an
    # int64 label.
    (probe,) = found["ceilings-transfer"]
    assert probe.knobs["transfer_sizes"] == [16 * (64 * 4 + 8), 32 * (64 * 4 + 8)]
    assert all(c.parsed is not None for cells in found.values() for c in cells)


def test_a_ceiling_an_experiment_measures_is_not_measured_again():
    found = cells_of(
        {
            "w": {"ceilings": True, "base": MLP, "matrix": {"num_workers": [0, 2]}},
            "c": {"base": {**MLP, "scenario": "compute"}},
        },
        defaults={"device": "cpu"},
    )
    assert "ceilings-compute" not in found and len(found["c"]) == 1
    assert len(found["ceilings-loader"]) == 2
    assert "ceilings-transfer" not in found  # a CPU copies nothing


def test_the_loader_alone_on_images_is_one_cell_for_every_model_but_not_for_samples_shaped_by_it():
    # A built-in image dataset makes the same samples whatever the model: the loader ceiling resets
    # the model, so two models share one loader ceiling, and a loader experiment with the same knobs
    # already measures it. Samples the model shapes (memory: input_size floats for the mlp) keep it.
    images = {
        "scenario": "train",
        "dataset": "images",
        "data_dir": ".",
        "image_size": 32,
        "batch_size": 8,
    }
    found = cells_of(
        {
            "t": {"ceilings": True, "base": images, "matrix": {"model": ["sleep", "resnet18"]}},
            "l": {"base": {**images, "scenario": "loader"}},
        },
        defaults={"device": "cpu"},
    )
    assert "ceilings-loader" not in found and len(found["ceilings-compute"]) == 2
    assert {
        ceiling_sources(c, [c for cells in found.values() for c in cells])["loader"].experiment
        for c in found["t"]
    } == {"l"}
    memory = cells_of({"m": {"ceilings": True, "base": MLP, "matrix": {"model": ["mlp", "sleep"]}}})
    assert {c.knobs["model"] for c in memory["ceilings-loader"]} == {"mlp", "sleep"}


def test_ids_stay_when_cells_are_added():
    small = cells_of({"w": {"ceilings": True, "base": MLP, "matrix": {"num_workers": [0]}}})
    large = cells_of({"w": {"ceilings": True, "base": MLP, "matrix": {"num_workers": [0, 1, 2]}}})
    assert {c.id for c in small["ceilings-loader"]} <= {c.id for c in large["ceilings-loader"]}


def test_without_the_option_nothing_is_added():
    assert set(cells_of({"w": {"base": MLP, "matrix": {"num_workers": [0, 2]}}})) == {"w"}


def test_the_ceilings_names_are_reserved():
    with pytest.raises(ConfigError, match="name 'ceilings-loader' is the ceilings' own"):
        cells_of({"w": {"ceilings": True, "base": MLP}, "ceilings-loader": {"base": MLP}})


def test_an_experiments_own_transfer_probe_at_the_batch_size_is_shared_not_measured_twice():
    # As in the default config: 256 samples of 1,024 float32 features and an int64 label are
    # 1,050,624 bytes, within 10 % of the probe's 1 MiB; another batch size would need its own
    # probe.
    probe = {"scenario": "transfer", "transfer_sizes": [65536, 1048576, 16777216]}
    mlp = {**MLP, "input_size": 1024, "batch_size": 256}
    shared = cells_of(
        {"w": {"ceilings": True, "base": mlp}, "t": {"base": probe}}, defaults={"device": "auto"}
    )
    assert "ceilings-transfer" not in shared and len(shared["t"]) == 1
    apart = cells_of(
        {"w": {"ceilings": True, "base": {**mlp, "batch_size": 64}}, "t": {"base": probe}},
        defaults={"device": "auto"},
    )
    (own,) = apart["ceilings-transfer"]
    assert own.knobs["transfer_sizes"] == [64 * (1024 * 4 + 8)]


OWN = {
    "scenario": "train",
    "dataset": "shapes.data:build_dataset",
    "dataset_args": {"count": 64, "size": 64, "crop": 56},
    "collate": "shapes.data:collate",
    "model": "shapes.models:build_model",
    "step": "shapes.train:train_step",
}


def test_a_cell_of_the_users_own_pipeline_gets_a_transfer_probe_of_its_own_batch():
    # ceilings.batch_bytes cannot size a user's batch: the transfer ceiling times a real one
    # (transfer.batch_probe), with the cell's dataset, its arguments, collate, batch size and
    # pinning; cells that differ only in knobs no copy depends on (workers, the model) share it.
    # Built unchecked: the import paths resolve in test_own_pipeline.
    config = {
        "python_path": ["examples/own-pipeline/src"],
        "defaults": {"device": "auto", "batch_size": 16, "steps": 5},
        "experiments": {
            "own": {
                "ceilings": True,
                "base": OWN,
                "matrix": {"num_workers": [0, 2], "pin_memory": [False, True]},
            }
        },
    }
    validate_config(config, SCHEMA)
    cells = build_cells(config, check=False)
    probes = [c for c in cells if c.experiment == "ceilings-transfer"]
    assert len(probes) == 2  # one per pinning, shared by both worker counts
    for probe in probes:
        knobs = probe.knobs
        assert knobs["scenario"] == "transfer" and knobs["device"] == "auto" and knobs["steps"] == 5
        assert knobs["dataset"] == OWN["dataset"] and knobs["collate"] == OWN["collate"]
        assert knobs["dataset_args"] == OWN["dataset_args"] and knobs["batch_size"] == 16
        assert knobs["python_path"] == [os.path.abspath("examples/own-pipeline/src")]
        assert "model" not in knobs and "num_workers" not in knobs
    assert {p.knobs.get("pin_memory", False) for p in probes} == {False, True}
    # Each training cell's prediction reads the probe with its own pinning.
    for cell in (c for c in cells if c.experiment == "own"):
        source = ceiling_sources(cell, cells)["transfer"]
        assert source.knobs.get("pin_memory", False) == cell.knobs.get("pin_memory", False)


def test_on_a_cpu_the_users_pipeline_gets_no_transfer_probe():
    config = {
        "defaults": {"device": "cpu"},
        "experiments": {"own": {"ceilings": True, "base": OWN}},
    }
    validate_config(config, SCHEMA)
    cells = build_cells(config, check=False)
    assert not [c for c in cells if c.experiment == "ceilings-transfer"]
    (cell,) = [c for c in cells if c.experiment == "own"]
    assert ceiling_sources(cell, cells)["transfer"] is None


def test_ceiling_ids_name_no_path_and_stay_when_the_checkout_moves(tmp_path):
    # python_path is made absolute, so a ceiling named by it would carry the checkout's path (with +
    # for /): moved or mounted elsewhere, every ceiling would get a new id and run again. Ceilings
    # are named by the knobs that set them apart, as experiment cells are; the knobs keep the path,
    # which the job needs.
    def ids(root) -> set[str]:
        config = {
            "python_path": [str(root / "own-pipeline" / "src")],
            "defaults": {"device": "auto", "batch_size": 16},
            "experiments": {
                "own": {"ceilings": True, "base": OWN, "matrix": {"num_workers": [0, 2]}}
            },
        }
        validate_config(config, SCHEMA)
        cells = [
            c for c in build_cells(config, check=False) if c.experiment.startswith("ceilings-")
        ]
        assert {c.experiment for c in cells} == {
            "ceilings-loader",
            "ceilings-compute",
            "ceilings-transfer",
        }
        assert all(c.knobs["python_path"] == config["python_path"] for c in cells)
        for cell in cells:
            assert (
                str(root).strip("/").split("/")[0] not in cell.id and "python_path" not in cell.id
            ), cell.id
        return {(c.experiment, c.id) for c in cells}

    assert ids(tmp_path / "here") == ids(tmp_path / "moved" / "elsewhere")
