"""What the Snakefile does before any job, without Snakemake: a target planned
(tests/core/test_target.py, tests/harness/test_cpu_speed.py) and a study preset's cells
(tests/plan/test_studies_presets.py, tests/analysis/test_studies_scaling.py)."""

from __future__ import annotations

import os

import yaml
from conftest import ROOT
from feedbench.plan.config import count_values, one_line, sized, validate_config
from feedbench.plan.matrix import ConfigError, build_cells

SCHEMA = os.path.join(ROOT, "config", "schema.yaml")
TRAIN = {
    "scenario": "train",
    "model": "resnet18",
    "dataset": "synthetic",
    "image_size": 32,
    "num_classes": 10,
}


def plan(target: dict, base: dict | None = None) -> str:
    """What the Snakefile does before any job (workflow/rules/common.smk): validate, build and check
    the cells."""
    config = {
        "target": target,
        "experiments": {"e": {"base": base or TRAIN, "matrix": {"num_workers": [0, 2]}}},
    }
    try:
        count_values(config)
        validate_config(config, SCHEMA)
        build_cells(config)
    except ConfigError as error:
        return one_line(error)
    return ""


PRESETS = os.path.join(ROOT, "config", "presets")


def preset_cells(name: str, size: str) -> list:
    """The cells of config/presets/<name>.yaml at its full or small size."""
    with open(os.path.join(PRESETS, f"{name}.yaml")) as f:
        config = yaml.safe_load(f)
    if size == "small":
        config = sized(dict(config, size="small"))
    return build_cells(config, check=False)
