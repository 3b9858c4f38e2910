"""Shared helpers: run a cell in-process and read its result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

# before any import of them: their asserts say what they compared
pytest.register_assert_rewrite("helpers")

from helpers.browser import find_chromium  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def has_gpu() -> bool:
    return torch.cuda.is_available()


# The browser tests (tests/helpers/browser.py drives Debian's Chromium): skipped, saying how to get
# it, where it is missing.
needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="needs Chromium: run `make system-deps` as root (or `apt-get install chromium`)",
)


def pytest_configure(config):
    """Refuse --dist loadgroup where it would drop the groups without a word (pytest-xdist#1386):
    every worker would then run its own share of each group, with its own Slurm cluster and its own
    copies of the module fixtures' runs.

    A run started in the background by a script (`make test &`) inherits SIGINT ignored, as would
    every process the tests start (xdist's workers, Snakemake): the Ctrl-C test would then see
    nothing stop. Ctrl-C works as in a terminal."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    version = tuple(int(part) for part in pytest.__version__.split(".")[:2])
    if config.getoption("dist", "no") == "loadgroup" and version >= (9, 2):
        raise pytest.UsageError(
            f"--dist loadgroup: pytest {pytest.__version__} loses pytest-xdist's groups "
            "(pytest-xdist#1386); allowed: pytest<9.2, as the test extra pins it (pip install "
            "-e '.[test]')"
        )


# before pytest-xdist's own hook, which reads the groups (--dist loadgroup)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # One worker runs every Slurm test, so only it starts the session's cluster
    # (tests/helpers/slurm_cluster.py).
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
    # Under pytest-xdist, the tests marked slow first: --dist loadgroup hands out the groups
    # (largest first), then every other test on its own in this order, so a slow one (a real
    # Snakemake run of minutes) left for the end would run on one worker while the others sit idle.
    # A stable sort: each module keeps its own order. a pytest-xdist worker: its collection order is
    # the scheduler's
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if has_gpu():
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA GPU: none is present here (run on a GPU machine; see "
        "docs/results/gpu-validation.md)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def means_gpu(request) -> bool:
    return request.node.get_closest_marker("gpu") is not None


@pytest.fixture(autouse=True)
def cpu_unless_gpu(request, monkeypatch):
    """A test not marked gpu means the CPU, on a GPU machine too: the processes it starts (torchrun
    ranks, Snakemake jobs) see no GPU. This process has counted its GPUs already: run_cell and the
    in-process runs say device cpu. The Slurm tests keep the environment Slurm gives their jobs."""
    if not means_gpu(request) and request.node.get_closest_marker("slurm") is None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def run_cell(tmp_path, request):
    """run_cell(**knobs) -> (exit code, result dict): the harness in this process, on the CPU unless
    marked gpu."""
    from feedbench.harness.runner import run

    counter = iter(range(1000))

    def _run(**knobs):
        if not means_gpu(request):
            knobs.setdefault("device", "cpu")
        out = tmp_path / f"cell{next(counter)}"
        code = run(knobs, str(out))
        with open(out / "result.json") as f:
            return code, json.load(f)

    return _run


def write_user_module(folder, name: str, code: str) -> str:
    """A user's module `name`.py of `code` in `folder`/src, outside feedbench; that src folder, for
    `python_path`."""
    src = folder / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / f"{name}.py").write_text(textwrap.dedent(code))
    return str(src)


@pytest.fixture
def user_module(tmp_path, request):
    """The test module's USER_CODE as the user's module USER_MODULE under tmp_path/src; that folder,
    for `python_path`. The module is forgotten after the test, so the next test's own copy is the
    one imported."""
    name = request.module.USER_MODULE
    yield write_user_module(tmp_path, name, request.module.USER_CODE)
    sys.modules.pop(name, None)


def cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    """`python -m feedbench ARGS` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "feedbench", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


@pytest.fixture(scope="session")
def calibration_runs(tmp_path_factory):
    """Result paths of the calibration workloads (tests/helpers/calibration.py), measured once for
    test_calibration and test_predict."""
    from helpers.calibration import measure

    return measure(str(tmp_path_factory.mktemp("calibration")))
