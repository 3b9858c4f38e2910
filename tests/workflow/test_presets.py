"""The study presets (config/presets/*.yaml): each validates at full size on its own, and runs small
on this CPU.

The fast tests dry-run every preset at its study's size in a copy of the
workflow: the config validates (every cell checked by the harness's table of
knobs) and only the preset's own experiment is planned, never the default
matrix of config/config.yaml. The slow ones run every preset's small config
(what `--config size=small` makes of it) for real, all six in one Snakemake
run, and check each preset's cells, its study view in the report and, where
the study published numbers, its table beside ours.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import subprocess

import pytest
import yaml
from conftest import ROOT, needs_chromium
from feedbench.analysis import views
from feedbench.core.target import find_gpu
from helpers.browser import ARTIFACTS, assert_fits, inspect, paragraph_texts
from helpers.snakemake_run import copy_workflow, run_snakemake
from markupsafe import escape

PRESETS = list(views.NAMES)  # one preset per study view
DEFAULT_EXPERIMENTS = {"decode", "workers", "prefetch", "compute", "transfer"}  # config/config.yaml
# Cells of a small run allowed to fail, with why (none: every small cell must measure).
EXPECTED_FAILURES: dict[str, str] = {}


def load_preset(name: str) -> dict:
    with open(os.path.join(ROOT, "config", "presets", f"{name}.yaml")) as f:
        return yaml.safe_load(f)


def snakemake(
    workflow: str, workdir, *args: str, timeout: int = 600
) -> subprocess.CompletedProcess:
    """`snakemake` of the workflow copy in workdir (its profiles/default applies, as in a
    checkout)."""
    return run_snakemake(workflow, workdir, *args, timeout=timeout)


def preset_args(workflow: str, name: str) -> list[str]:
    return ["--configfile", os.path.join(workflow, "config", "presets", f"{name}.yaml")]


def planned(run: subprocess.CompletedProcess) -> list[str]:
    """experiment/cell/rep<k> of every bench job of a dry run."""
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    return re.findall(r"output: results/cells/(\S+)/result\.json", run.stdout)


def expected_cells(config: dict) -> set[str]:
    """experiment/cell of a config, by the workflow's own matrix builder (no harness checks: no
    torch, no folders)."""
    from feedbench.plan.matrix import build_cells

    return {
        f"{c.experiment}/{c.id}" for c in build_cells(config, "results/data/images", check=False)
    }


def small(config: dict) -> dict:
    """The config as `size: small` makes it (feedbench.plan.config.sized, as the Snakefile calls
    it)."""
    from feedbench.plan.config import sized

    return sized(dict(json.loads(json.dumps(config)), size="small"))


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    return copy_workflow(tmp_path_factory.mktemp("workflow"))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_is_one_experiment_named_like_its_file_with_its_view_and_a_small_switch(name):
    config = load_preset(name)
    assert list(config["experiments"]) == [name]
    assert config["experiments"][name]["view"] == name
    assert config.get("size", "full") == "full"
    assert config["small"]["experiments"].keys() <= {name}, (
        "the small fragment shrinks the preset's own experiment"
    )
    reference = os.path.join(ROOT, "report", "references", f"{name}.csv")
    assert os.path.exists(reference) or name == "datastall", f"no published table {reference}"
    # Small mode keeps the axes (so cell ids keep their shape) and stays on the CPU.
    full_axes = list(config["experiments"][name].get("matrix") or {})
    assert list(small(config)["experiments"][name].get("matrix") or {}) == full_axes
    assert small(config)["defaults"]["device"] == "cpu"


@pytest.mark.parametrize("name", PRESETS)
def test_preset_validates_at_full_size_without_the_default_config(workflow, tmp_path, name):
    """A dry run of the study's protocol: every cell passes the checks, and only the preset's
    experiment is planned."""
    config = load_preset(name)
    jobs = planned(snakemake(workflow, tmp_path, *preset_args(workflow, name), "--dry-run"))
    repeats = config["defaults"]["repeats"]
    assert {j.split("/")[0] for j in jobs} == {name}, (
        "the default experiments of config/config.yaml leaked into the preset"
    )
    assert sorted(jobs) == sorted(
        f"{c}/rep{k}" for c in expected_cells(config) for k in range(1, repeats + 1)
    )


def test_config_alone_starts_from_the_default_config(workflow):
    """`--config key=value` without a configfile merges over config/config.yaml (a checkout: the
    workdir is the workflow)."""
    with open(os.path.join(workflow, "config", "config.yaml")) as f:
        default = yaml.safe_load(f)
    jobs = planned(snakemake(workflow, workflow, "--dry-run", "--config", "size=small"))
    experiments = {j.split("/")[0] for j in jobs}
    derived = {e for e in experiments if e.startswith("ceilings-")}  # `ceilings: true` adds them
    assert experiments - derived == DEFAULT_EXPERIMENTS == set(default["experiments"])
    assert derived <= {"ceilings-loader", "ceilings-compute", "ceilings-transfer"}
    assert len(jobs) == len(expected_cells(default)) * default["defaults"]["repeats"]


def test_a_target_on_the_command_line_plans_like_one_in_a_file(workflow, tmp_path):
    """docs/target.md's `--config "target={...}"`: Snakemake leaves its numbers text
    (plan.config.typed_overrides)."""
    target = "target={gpu: K80, cores_per_gpu: 4, cpu_speed: 1.0}"
    args = (*preset_args(workflow, "scaling"), "--dry-run", "--config", "size=small", target)
    run = snakemake(workflow, tmp_path, *args)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "rule target:" in run.stdout or "localrule target:" in run.stdout


def test_size_small_merges_the_fragment_before_validation(workflow, tmp_path):
    """Mappings merge, lists replace; the small config is validated like any other."""
    config = load_preset("scaling")
    jobs = planned(
        snakemake(
            workflow,
            tmp_path,
            *preset_args(workflow, "scaling"),
            "--dry-run",
            "--config",
            "size=small",
        )
    )
    assert sorted(jobs) == sorted(f"{c}/rep1" for c in expected_cells(small(config)))
    assert "scaling/parallel-ddp_nodes-2_gpus_per_node-1_timing-events/rep1" in jobs
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**config, "small": {"defaults": {"repeats": 0}}}))
    run = snakemake(
        workflow, tmp_path, "--configfile", str(bad), "--dry-run", "--config", "size=small"
    )
    assert (
        run.returncode != 0
        and "bad config: defaults.repeats: value 0 is out of range" in run.stderr + run.stdout
    )
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({**config, "small": {"experiment": {}}}))
    run = snakemake(workflow, tmp_path, "--configfile", str(typo), "--dry-run")
    assert (
        run.returncode != 0
        and "bad config: small: value 'experiment' is not allowed; allowed: defaults, images"
        in run.stderr + run.stdout
    )


def published_hardware(name: str) -> str | None:
    """The hardware of the study's first published row, as the report prints it (escaped)."""
    path = os.path.join(ROOT, "report", "references", f"{name}.csv")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return html.escape(next(rows)["hardware"], quote=False)


def merged_small() -> dict:
    """Every preset's small config as one config, so that one Snakemake run measures them all.

    Each experiment takes its preset's small `defaults` into its `base` (a base knob wins over a
    default, so every cell gets the knobs of its preset's own small run:
    test_merged_small_config_has_each_presets_own_cells checks it). The generated JPEG folder is one
    for all: the most images and the largest size the presets ask for, and the fewest classes (their
    models have that many outputs).
    """
    experiments, images, repeats = {}, [], set()
    for name in PRESETS:
        config = small(load_preset(name))
        defaults = dict(config["defaults"])
        repeats.add(defaults.pop("repeats"))
        experiment = config["experiments"][name]
        experiments[name] = {**experiment, "base": {**defaults, **(experiment.get("base") or {})}}
        if "images" in config:
            images.append(config["images"])
    assert len(repeats) == 1, f"the small presets differ in repeats: {repeats}"
    shared = {
        "count": max(i["count"] for i in images),
        "size": max(i["size"] for i in images),
        "classes": min(i["classes"] for i in images),
    }
    return {"defaults": {"repeats": repeats.pop()}, "images": shared, "experiments": experiments}


# The run's target: the scaling study's GPU, so its view puts the predictions beside the published
# figures of the same GPU; the other studies' views add the target's column (issue #25's done-when).
SMALL_TARGET = {"gpu": "K80", "cores_per_gpu": 4, "cpu_speed": 1.0}
# The views whose study published GPU figures, and the GPU of each
# (feedbench.core.estimate.STUDY_GPUS).
PREDICTED_BESIDE_PUBLISHED = {"scaling": "K80", "prefetch": "RTX2080Ti", "nmt": "P100"}


def test_merged_small_config_has_each_presets_own_cells():
    """The one small run below measures exactly the cells, with exactly the knobs, of the six runs
    it replaces."""
    from feedbench.plan.matrix import build_cells

    def knobs(cells):
        return {(c.experiment, c.id): c.knobs for c in cells}

    merged = knobs(build_cells(merged_small(), "results/data/images", check=False))
    separate = {}
    for name in PRESETS:
        separate.update(
            knobs(build_cells(small(load_preset(name)), "results/data/images", check=False))
        )
    assert merged == separate


@pytest.fixture(scope="module")
def small_run(workflow, tmp_path_factory):
    """One Snakemake run of every preset's small config (merged_small): the cells, the summary and
    one report.

    One run instead of six saves five Snakemake starts and five aggregate/plot/report rounds; two
    bench slots let two one-thread cells run at once (nothing here asserts a timing; threads still
    cap what runs together): so the run says torch_threads: 1, where the presets leave the trainer
    the threads of the user's launch.
    """
    workdir = tmp_path_factory.mktemp("presets-small")
    path = workdir / "presets-small.yaml"
    config = merged_small()
    config["defaults"]["torch_threads"] = 1
    path.write_text(yaml.safe_dump({**config, "target": SMALL_TARGET}, sort_keys=False))
    run = snakemake(
        workflow, workdir, "--configfile", str(path), "--resources", "bench_slots=2", timeout=1500
    )
    assert run.returncode == 0, run.stderr[-4000:]
    with open(workdir / "results" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    return workdir, rows, (workdir / "results" / "report" / "index.html").read_text()


def view_section(page: str, name: str) -> str:
    """The report's part about one experiment: from its view to the next experiment's section."""
    start = page.index(f'id="view-{name}"')
    marks = ('id="exp-', 'id="view-', 'id="failed"')
    ends = [i for i in (page.find(mark, start + 1) for mark in marks) if i > 0]
    return page[start : min(ends)] if ends else page[start:]


@pytest.mark.slow
# one worker: small_run is one Snakemake run for all six
@pytest.mark.xdist_group("presets_small_run")
@pytest.mark.parametrize("name", PRESETS)
def test_preset_runs_small_on_a_cpu_and_its_view_renders(small_run, name):
    workdir, all_rows, page = small_run
    config = small(load_preset(name))
    cells = expected_cells(config)
    repeats = config["defaults"]["repeats"]
    for cell in cells:
        for k in range(1, repeats + 1):
            with open(workdir / "results" / "cells" / cell / f"rep{k}" / "result.json") as f:
                result = json.load(f)
            if cell in EXPECTED_FAILURES:
                assert result["status"] == "failed", cell
                continue
            assert result["status"] == "ok", f"{cell}: {result.get('error')}"
            assert result["cell"]["device"] == "cpu"
    rows = [r for r in all_rows if r["experiment"] == name]
    assert len(rows) == len(cells) * repeats
    assert f'id="view-{name}"' in page
    # as Jinja escapes it: ' is &#39;
    assert str(escape(config["experiments"][name]["title"])) in page
    hardware = published_hardware(name)
    if hardware:
        assert hardware in view_section(page, name), (
            f"the published table of {name} is not in its view"
        )
    # the run's target (SMALL_TARGET) predicts the study's published cells
    if name in PREDICTED_BESIDE_PUBLISHED:
        section, gpu = view_section(page, name), PREDICTED_BESIDE_PUBLISHED[name]
        assert f"Predicted beside published on {escape(find_gpu(gpu).title)}" in section
        assert f"predicted on {gpu}," in section and "absolute error" in section
        there = f"predicted on {SMALL_TARGET['gpu']} (the target)"
        assert (there in section) == (gpu != SMALL_TARGET["gpu"]), there
    # a cold cache that could not be made is said so, never passed off as one
    if name == "datastall":
        cold = [r for r in rows if r["page_cache"] == "cold"]
        assert cold
        if any(r["page_cache_effective"] != "cold" for r in cold):
            assert "the cold cache could not be made" in page
    if name == "nmt":
        assert all(float(r["tokens_per_s"]) > 0 for r in rows)
    # the worker count with its proof (analysis.knee), read from its loader cells
    if name == "workers":
        assert "searched: 3 levels of num_workers, ran 3: 1, 2, 4 workers" in page
        (proof,) = set(paragraph_texts(page, "search worker-count"))
        assert re.match(
            r"recommended: [124] workers?\. Measured there: [\d,.]+ samples/s " r"\(one repeat",
            proof,
        ), proof
        assert (
            "MB of shared memory in flight of " in proof
            and "Further workers are stopped by " in proof
        )


@pytest.mark.slow
@pytest.mark.xdist_group("presets_small_run")
@needs_chromium
@pytest.mark.parametrize("width", [1280, 390])
def test_the_small_presets_report_fits_a_laptop_and_a_phone(small_run, width):
    """Every study view of the small run (the breakdown preset's 5 axes and 8 cells among them) in
    Chromium: no failed load, no console error, and the page fits
    (tests/workflow/test_browser.py)."""
    workdir, _, _ = small_run
    page = inspect(
        str(workdir / "results" / "report" / "index.html"),
        os.path.join(ARTIFACTS, f"presets-{width}.png"),
        width=width,
    )
    assert page.console_errors == [] and page.failed_loads == []
    assert_fits(page, f"small presets report at {width} px", width)
