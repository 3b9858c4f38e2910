"""The config side: the default matrix, the schema vs docs/knobs.md, the conda envs vs pyproject,
and bad configs stopping Snakemake before any job with one line."""

from __future__ import annotations

import os
import re

import pytest
import tomllib
import yaml
from conftest import ROOT
from feedbench.core.ceilings import ceiling_map
from feedbench.core.knobs import KNOBS
from feedbench.plan.config import validate_config
from feedbench.plan.matrix import build_cells
from helpers.snakemake_run import run_snakemake

SCHEMA = os.path.join(ROOT, "config", "schema.yaml")
# Run the workflow, never a job: they belong to the machine that drives Snakemake.
ENGINE = {"snakemake", "snakemake-executor-plugin-slurm"}


def load(path: str):
    with open(os.path.join(ROOT, path)) as f:
        return yaml.safe_load(f)


def test_default_config_is_the_matrix_of_the_issue():
    config = load("config/config.yaml")
    validate_config(config, SCHEMA)
    cells = build_cells(config, "results/data/images")
    by = {}
    for cell in cells:
        by.setdefault(cell.experiment, []).append(cell)
    assert config["defaults"]["repeats"] == 3
    workers = by["workers"]
    assert {(c.knobs["num_workers"], c.knobs["pin_memory"]) for c in workers} == {
        (w, p) for w in (0, 1, 2) for p in (False, True)
    }
    assert all(
        c.knobs["dataset"] == "images" and c.knobs["data_dir"] == "results/data/images"
        for c in workers
    )
    prefetch = by["prefetch"]
    assert {(c.knobs["device_prefetch"], c.knobs["hidden_layers"]) for c in prefetch} == {
        (d, h) for d in ("none", "stream") for h in (1, 4)
    }
    assert all(c.knobs["model"] == "mlp" and c.knobs["dataset"] == "memory" for c in prefetch)
    assert {c.knobs["scenario"] for c in by["compute"]} == {"compute"}
    assert {c.knobs["scenario"] for c in by["transfer"]} == {"transfer"}
    # A training cell starved by JPEG decoding at few workers, its stages timed, its ceilings
    # measured: the loader alone is the `workers` cell without pinning, so only its compute ceiling
    # is added. Beside them, the fix its stage profile predicts, measured: decode once at 0 workers.
    # It shares its baseline's ceilings, so it adds no cell of its own there.
    decode = by["decode"]
    assert [(c.knobs["num_workers"], c.knobs.get("cache_after")) for c in decode] == [
        (0, None),
        (1, None),
        (2, None),
        (0, "decode"),
    ]
    assert all(c.knobs["scenario"] == "train" and c.knobs["dataset"] == "images" for c in decode)
    assert (
        all(c.knobs["stage_timing"] for c in decode) and config["experiments"]["decode"]["ceilings"]
    )
    links = ceiling_map(cells)
    assert [links[f"decode/{c.id}"]["loader"] for c in decode] == [
        f"workers/num_workers-{w}_pin_memory-false" for w in (0, 1, 2, 0)
    ]
    # the probe has its batch size
    assert {links[f"decode/{c.id}"]["transfer"] for c in decode} == {"transfer/base"}
    assert sorted(by) == [
        "ceilings-compute",
        "ceilings-loader",
        "compute",
        "decode",
        "prefetch",
        "transfer",
        "workers",
    ]
    assert len(by["ceilings-compute"]) == len(by["ceilings-loader"]) == 1


def schema_keys(node: dict, prefix: str, defs: dict) -> dict[str, dict]:
    """Dotted config keys of the schema -> their schema, down to knob mappings (which `python -m
    feedbench knobs` documents)."""
    if "$ref" in node and node["$ref"] != "#/$defs/knobs":
        node = {
            **defs[node["$ref"].split("/")[-1]],
            **{k: v for k, v in node.items() if k != "$ref"},
        }
    keys = {}
    for name, sub in (node.get("properties") or {}).items():
        key = f"{prefix}.{name}" if prefix else name
        keys[key] = sub
        keys.update(schema_keys(sub, key, defs))
    if isinstance(node.get("additionalProperties"), dict) and prefix == "experiments":
        keys.update(schema_keys(node["additionalProperties"], f"{prefix}.<name>", defs))
    for branch in node.get("oneOf", []):
        keys.update(schema_keys(branch.get("items", branch), prefix, defs))
    return keys


def config_reference() -> dict[str, list[str]]:
    """The table of docs/knobs.md, "Configuration reference"."""
    with open(os.path.join(ROOT, "docs", "knobs.md")) as f:
        text = f.read()
    section = text.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \|(.*)\|$", section, re.M)
    return {key: [cell.strip() for cell in rest.split("|")] for key, rest in rows}


def test_config_reference_lists_every_key_of_the_schema_with_its_default():
    schema = load("config/schema.yaml")
    keys = schema_keys(schema, "", schema["$defs"])
    reference = config_reference()
    assert set(reference) == set(keys), (
        "docs/knobs.md's configuration reference and config/schema.yaml disagree"
    )
    for key, sub in keys.items():
        if "default" in sub:
            shown = (
                yaml.safe_dump(sub["default"], default_flow_style=True)
                .strip()
                .removesuffix("...")
                .strip()
            )
            assert reference[key][1] == f"`{shown}`", (
                f"{key}: docs/knobs.md says {reference[key][1]}, the schema's default is {shown}"
            )
        if key in schema.get("required", []):
            assert reference[key][1] == "required", key


def test_config_accepts_exactly_the_knobs_of_the_harness():
    """Knob names and values are checked against core.knobs.KNOBS (not listed in the schema): they
    cannot drift."""
    every = {name: knob.default for name, knob in KNOBS.items()}
    config = {
        "defaults": dict(every),
        "experiments": {
            "all": {"base": dict(every), "matrix": {name: [value] for name, value in every.items()}}
        },
    }
    validate_config(config, SCHEMA)
    (cell,) = build_cells(config)
    assert cell.knobs == every
    assert "enum" not in yaml.safe_load(open(SCHEMA))["$defs"]["knob"]


def requirement_name(line: str) -> str:
    return re.split(r"[<>=!~\[ ;]", line, maxsplit=1)[0].lower()


def test_conda_envs_follow_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = {requirement_name(d): d for d in tomllib.load(f)["project"]["dependencies"]}
    used: set[str] = set()
    for name in sorted(os.listdir(os.path.join(ROOT, "envs"))):
        env = load(os.path.join("envs", name))
        pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
        for line in pip:
            assert requirement_name(line) in declared, (
                f"envs/{name}: {line} is not a dependency in pyproject.toml"
            )
            assert line == declared[requirement_name(line)], (
                f"envs/{name}: {line} but pyproject.toml says {declared[requirement_name(line)]}"
            )
            used.add(requirement_name(line))
    assert set(declared) - ENGINE - used == set(), (
        "dependencies of pyproject.toml that no env installs"
    )


def test_every_conda_env_is_used_by_a_rule():
    rules = "".join(
        open(os.path.join(ROOT, "workflow", "rules", f)).read()
        for f in os.listdir(os.path.join(ROOT, "workflow", "rules"))
    )
    referenced = set(re.findall(r'"\.\./\.\./envs/([\w.-]+)"', rules))
    assert referenced == set(os.listdir(os.path.join(ROOT, "envs")))


# Bad configs, through Snakemake itself: one line, before any job starts.
BAD = {
    "unknown key": (
        {"experiments": {"w": {"base": {}, "titel": "x"}}},
        "bad config: experiments.w.titel: unknown key; allowed: base, ceilings, exclude, "
        "include, matrix, plot, reference, search, title, view",
    ),
    "unknown knob": (
        {"experiments": {"w": {"base": {"num_wokers": 2}}}},
        "bad config: experiments.w.base.num_wokers: unknown knob (did you mean num_workers?); "
        "allowed: ",
    ),
    "wrong type": (
        {"experiments": {"w": {"base": {"batch_size": "64"}}}},
        "bad config: experiments.w.base.batch_size: value '64' has the wrong type; allowed: an "
        "integer >= 1",
    ),
    "level out of range": (
        {"experiments": {"w": {"matrix": {"num_workers": [0, -1]}}}},
        "bad config: experiments.w.matrix.num_workers: value -1 is out of range; allowed: an "
        "integer >= 0",
    ),
    "unknown model": (
        {"experiments": {"w": {"matrix": {"model": ["mlp", "resnet999"]}}}},
        "bad config: experiments.w.matrix.model: value 'resnet999' is not known; allowed: none, "
        "mlp, sleep, lstm or a torchvision",
    ),
    "unknown dataset": (
        {"experiments": {"w": {"base": {"dataset": "imagenet"}}}},
        "bad config: experiments.w.base.dataset: value 'imagenet' is not allowed; allowed: "
        "synthetic, memory, images,",
    ),
    "axis without levels": (
        {"experiments": {"w": {"matrix": {"num_workers": []}}}},
        "bad config: experiments.w.matrix.num_workers: value [] has no levels; allowed: at least 1",
    ),
    "name unfit for a path": (
        {"experiments": {"../w": {"base": {}}}},
        "bad config: experiments: name '../w' is not fit for a path; allowed: letters, digits, _ "
        "and - (not first)",
    ),
    "missing data_dir": (
        {"experiments": {"w": {"base": {"dataset": "images", "data_dir": "no/such/folder"}}}},
        "bad config: experiments.w.base.data_dir: value 'no/such/folder' does not exist; "
        "allowed: an existing folder",
    ),
    "unknown published table": (
        {"experiments": {"w": {"view": "prefetch", "reference": "nosuch", "base": {}}}},
        "bad config: experiments.w.reference: no table ",
    ),
    "unknown size": (
        {"size": "medium", "experiments": {"w": {"base": {}}}},
        "bad config: size: value 'medium' is not allowed; allowed: full, small",
    ),
    "unknown key in small": (
        {"small": {"experimants": {}}, "experiments": {"w": {"base": {}}}},
        "bad config: small: value 'experimants' is not allowed; allowed: defaults, images, "
        "retry_failed, experiments",
    ),
    # Issue #9: these ran jobs, crashed Snakemake or exhausted the machine.
    "not a number": (
        {"experiments": {"w": {"matrix": {"momentum": [float("nan")]}}}},
        "bad config: experiments.w.matrix.momentum: value nan is not a finite number; allowed: a "
        "number >= 0 and <= 1",
    ),
    "name too long": (
        {"experiments": {"x" * 300: {}}},
        "bad config: experiments: name "
        "'xxxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxxxxxxxxxxxx' has 300 characters; "
        "allowed: at most 64",
    ),
    "periodic name": (
        {"experiments": {"a" * 40: {}}},
        "bad config: experiments: name 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' ends in a part "
        "repeated 20 times or more",
    ),
    "22-digit level": (
        {"experiments": {"w": {"matrix": {"steps": [1, 10**21]}}}},
        "bad config: experiments.w.matrix.steps: value 1000000000000000000000 is out of range; "
        "allowed: an integer >= 1 and <= 1000000",
    ),
    "plot column": (
        {
            "experiments": {
                "w": {
                    "matrix": {"num_workers": [0, 1]},
                    "plot": {"x": "num_workers", "y": "samples"},
                }
            }
        },
        "bad config: experiments.w.plot.y: column 'samples' is neither a knob nor a summary column",
    ),
    "huge matrix": (
        {
            "experiments": {
                "w": {"matrix": {"seed": list(range(1000)), "steps": list(range(1, 1001))}}
            }
        },
        "bad config: experiments: 1000000 cells (w: 1000000); allowed: at most 10000 cells in "
        "all (max_cells)",
    ),
    # Issue #25: a target the plan cannot predict for is refused before any job (the other cases:
    # test_target.py).
    "unknown target GPU": (
        {
            "target": {"gpu": "B300", "cores_per_gpu": 8, "cpu_speed": 1.0},
            "experiments": {"w": {"base": {}}},
        },
        "bad config: target.gpu: unknown GPU 'B300'; allowed: K80, P100, RTX2080Ti, V100, A100, "
        "H100, H200, L4, V100-PCIe, A100-PCIe, H100-PCIe",
    ),
    "levels equal by value": (
        {"experiments": {"w": {"matrix": {"momentum": [1, 1.0]}}}},
        "bad config: experiments.w.matrix.momentum: value 1.0 is given twice (as 1 and 1.0); "
        "allowed: levels that differ",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD))
def test_bad_config_stops_snakemake_before_any_job(case, tmp_path):
    config, message = BAD[case]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run = snakemake(tmp_path, "--configfile", str(path))
    assert run.returncode != 0
    lines = [
        line for line in (run.stderr + run.stdout).splitlines() if line.startswith("bad config:")
    ]
    assert len(lines) == 1 and lines[0].startswith(message), run.stderr[-2000:]
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()


def snakemake(tmp_path, *args):
    """The checkout's workflow, run in tmp_path."""
    return run_snakemake(ROOT, tmp_path, *args, timeout=300)


def bad_config_line(run) -> str:
    lines = [
        line for line in (run.stderr + run.stdout).splitlines() if line.startswith("bad config:")
    ]
    assert run.returncode != 0 and len(lines) == 1, run.stderr[-2000:]
    return lines[0]


# The default config (config/config.yaml of the working directory) is read by the Snakefile before
# Snakemake reads it.
@pytest.mark.slow
@pytest.mark.parametrize(
    "text, message",
    [
        (
            "experiments:\n  w:\n    base: {steps: 5\n    title: x\n",
            "bad config: config/config.yaml, line 4, column 10: while parsing a flow mapping: "
            "expected ',' or '}', but got ':'; allowed: YAML (or JSON)",
        ),
        (
            "__use_yte__: true\nexperiments:\n  w:\n"
            "    title: ?__import__('os').system('touch {tmp}/PWNED') or 'yte'\n",
            "bad config: config/config.yaml: __use_yte__: YTE templates run Python code in the "
            "config; allowed: plain YAML without __use_yte__",
        ),
        (
            "\n".join(
                ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
                + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
            )
            + "\nexperiments: {w: {title: *a9}}\n",
            "bad config: config/config.yaml: more than 100000 values (a YAML alias counts each "
            "time it is used); allowed: at most 100000",
        ),
    ],
    ids=["yaml syntax", "yte templates", "alias bomb"],
)
def test_default_config_file_is_checked_before_snakemake_reads_it(text, message, tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(text.replace("{tmp}", str(tmp_path)))
    line = bad_config_line(snakemake(tmp_path))
    assert line == message
    assert not (tmp_path / "PWNED").exists(), "the template ran"
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_yte_in_a_configfile_option_is_refused_after_snakemake_ran_it(tmp_path):
    """Snakemake reads --configfile files before the Snakefile runs: the template has run.

    docs/knobs.md: "Configs are code?".
    """
    path = tmp_path / "yte.yaml"
    path.write_text(
        "__use_yte__: true\nexperiments:\n  w:\n    title: ?__import__('os').system('touch "
        f"{tmp_path}/PWNED') or 'yte'\n"
    )
    line = bad_config_line(snakemake(tmp_path, "--configfile", str(path)))
    assert line == (
        f"bad config: {path}: __use_yte__: YTE templates run Python code in the config "
        "(Snakemake has run them already, reading --configfile); allowed: plain YAML without "
        "__use_yte__"
    )
    # the limit this test documents: the code ran before the workflow could look
    assert (tmp_path / "PWNED").exists()
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="Snakemake 9 parses --configfile files before the Snakefile runs and says only "
    "'Config file is not valid JSON or YAML'; no hook lets the workflow read them first",
)
def test_yaml_error_in_a_configfile_option_names_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("experiments:\n  w:\n    base: {steps: 5\n    title: x\n")
    run = snakemake(tmp_path, "--configfile", str(path))
    assert "line 4, column 10" in run.stderr + run.stdout


def test_nested_command_line_values_are_typed_as_in_a_config_file():
    """Snakemake gives `--config target={cores_per_gpu: 4}` as '4' (YAML's base loader):
    typed_overrides reads it as a config file would, and leaves a config file's own values, and the
    top level, alone."""
    from feedbench.plan.config import typed_overrides

    given = {
        "target": {"gpu": "K80", "cores_per_gpu": "4", "cpu_speed": "1.0"},
        "defaults": {"repeats": "2"},
    }
    config = {
        "size": "small",
        "target": {"gpu": "K80", "cores_per_gpu": "4", "cpu_speed": "1.0"},
        "defaults": {"repeats": "2", "device": "cpu", "steps": 3},
        "experiments": {"e": {"matrix": {"num_workers": ["0", "2"]}}},
    }
    overrides = {
        **given,
        "size": "small",
        "experiments": {"e": {"matrix": {"num_workers": ["0", "2"]}}},
    }
    typed_overrides(config, overrides)
    assert config["target"] == {"gpu": "K80", "cores_per_gpu": 4, "cpu_speed": 1.0}
    assert config["defaults"] == {"repeats": 2, "device": "cpu", "steps": 3}
    assert (
        config["experiments"]["e"]["matrix"]["num_workers"] == [0, 2] and config["size"] == "small"
    )
    quoted = {"e": {"base": {"model": "a: b", "image_size": "32", "python_path": "[x"}}}
    typed_overrides(quoted, {"e": {"base": dict(quoted["e"]["base"])}})
    # text stays text
    assert quoted["e"]["base"] == {"model": "a: b", "image_size": 32, "python_path": "[x"}
    # a file's quoted '4' under a --config that set another key
    from_file = {"target": {"cores_per_gpu": "4"}}
    typed_overrides(from_file, {"target": {"gpu": "K80"}})
    assert from_file == {"target": {"cores_per_gpu": "4"}}
