"""`pip install .` gives a working feedbench: views, schemas and report templates are inside the
package.

The wheel is built from a copy of the files a build reads (pyproject.toml, README.md,
workflow/feedbench), installed with --no-deps into a fresh venv that sees the test venv's packages
(torch, pandas, ...) but not the source tree, and renders a report from a stored run
(tests/stored/workers-small) in a folder outside the checkout.
"""

from __future__ import annotations

import glob
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest
from conftest import ROOT
from feedbench.plan.matrix import harness_files

# One worker runs the module: the fixture `installed` builds a wheel and a venv.
pytestmark = pytest.mark.xdist_group("packaging")
STORED = os.path.join(ROOT, "tests", "stored", "workers-small")
PACKAGE = os.path.join(ROOT, "workflow", "feedbench")

RENDER = textwrap.dedent("""
    import glob, os, sys

    import yaml

    import feedbench, feedbench.analysis.report
    from feedbench.analysis.aggregate import read_summary
    from feedbench.analysis.plots import plot_experiment
    from feedbench.analysis.report import write_report

    stored, references, out = sys.argv[1:4]
    print(feedbench.__file__)
    config = yaml.safe_load(open(os.path.join(stored, "config.yaml")))
    summary = os.path.join(stored, "summary.csv")
    svg = os.path.join(out, "workers.svg")
    plot_experiment(read_summary(summary), "workers", config["experiments"]["workers"]["plot"], svg)
    results = sorted(glob.glob(os.path.join(stored, "cells", "*", "result.json")))
    write_report(summary, [svg], results, config, "c0ffee42", os.path.join(out, "index.html"),
                 references=[os.path.join(references, "workers.csv")])
""")


def wheel_files(tmp_path) -> tuple[str, list[str]]:
    """Build the wheel from a clean copy of what the build reads; its path and the names in it."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    shutil.copytree(
        PACKAGE,
        source / "workflow" / "feedbench",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = glob.glob(str(tmp_path / "dist" / "feedbench-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        return wheel, archive.namelist()


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv with the wheel installed and the test venv's site-packages on its path (their .pth
    files unread, so the editable install's path to the source tree stays out): its python, the
    wheel's names, the venv."""
    tmp = tmp_path_factory.mktemp("packaging")
    wheel, names = wheel_files(tmp)
    venv = tmp / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = str(venv / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            wheel,
        ],
        **outside(tmp),
    )
    assert install.returncode == 0, install.stdout + install.stderr
    # Only now the test venv's packages: pip would otherwise find its editable feedbench and install
    # nothing.
    ours = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    with open(os.path.join(purelib, "test_venv.pth"), "w") as f:
        f.write("\n".join(dict.fromkeys(p for p in ours if os.path.isdir(p))) + "\n")
    return python, names, str(venv)


def outside(tmp_path) -> dict:
    """Run in a folder of its own, with no PYTHONPATH: the source tree cannot be imported."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {"cwd": str(tmp_path), "env": env, "capture_output": True, "text": True, "timeout": 300}


@pytest.mark.slow
def test_the_wheel_holds_the_views_the_schemas_and_the_templates(installed):
    _, names, _ = installed
    for name in (
        "feedbench/analysis/views/__init__.py",
        "feedbench/analysis/views/workers.py",
        "feedbench/schemas/result.schema.json",
        "feedbench/templates/report.html.j2",
        "feedbench/templates/report.css",
        "feedbench/core/model_names.py",
        # the published cells' counts a target's estimate reads (harness.flops.PUBLISHED_COUNTS)
        "feedbench/harness/published_counts.json",
        # what puts the instrument into a command cell's command (harness.command.BOOTSTRAP)
        "feedbench/harness/bootstrap/sitecustomize.py",
    ):
        assert name in names
    assert not any(n.startswith(("rules/", "scripts/", "report/")) for n in names)


@pytest.mark.slow
def test_the_installed_package_renders_a_report_from_a_stored_run(installed, tmp_path):
    python, _, venv = installed
    run = subprocess.run(
        [
            python,
            "-I",
            "-c",
            RENDER,
            STORED,
            os.path.join(ROOT, "report", "references"),
            str(tmp_path),
        ],
        **outside(tmp_path),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    imported = run.stdout.splitlines()[0]
    assert imported.startswith(os.path.realpath(venv)) or imported.startswith(venv), imported
    assert not imported.startswith(ROOT)
    html = (tmp_path / "index.html").read_text()
    # the experiment, through the templates
    assert "How many loader workers does CIFAR-100 need?" in html
    assert "<style>" in html and "<svg" in html  # report.css and the figure, inline
    # the workers view (feedbench.analysis.views.workers), with its tables
    assert 'class="view"' in html
    # ours and the published one (report/references/workers.csv)
    assert html.count('class="view-table"') >= 2


@pytest.mark.slow
def test_the_installed_command_runs(installed, tmp_path):
    _, _, venv = installed
    run = subprocess.run([os.path.join(venv, "bin", "feedbench"), "knobs"], **outside(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "num_workers" in run.stdout


def test_templates_are_the_reports_not_the_harness():
    """Editing a report template reruns no cell: the harness fingerprint leaves the templates
    out."""
    names = {os.path.relpath(p, PACKAGE) for p in harness_files(PACKAGE)}
    assert os.path.join("schemas", "result.schema.json") in names
    assert not any(n.startswith("templates") for n in names)
    assert os.path.isfile(os.path.join(PACKAGE, "templates", "report.html.j2"))
