"""Cells for tests: the tiny MLP, the endless sleep cell, a user's package to import, and `python -m
feedbench run` of a cell in a process of its own (the command line a user types), so that no test
spells that command out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# The smallest training cell that still runs every part of the harness: 4 steps of a 16-wide MLP,
# one warm-up step.
TINY_MLP = dict(model="mlp", input_size=16, width=16, batch_size=8, steps=4, warmup_steps=1)

# The image studies' model at its smallest: 2 steps of a ResNet-18 on 4 images of 32 px, 10 classes.
TINY_RESNET = dict(
    model="resnet18", image_size=32, num_classes=10, batch_size=4, steps=2, warmup_steps=1
)

# The loader alone at its smallest: 2 measured steps of 8 synthetic images of 16 px, no warm-up.
TINY_LOADER = dict(
    scenario="loader", dataset="synthetic", image_size=16, batch_size=8, steps=2, warmup_steps=0
)

# A cell that runs until it is stopped (a limit, a signal, a dead worker): sleep steps on tiny
# images, one thread, pinned, since the tests that stop it count seconds.
ENDLESS_SLEEP = dict(model="sleep", image_size=8, batch_size=2, steps=100000, torch_threads=1)


def tiny_mlp(**knobs) -> dict:
    """TINY_MLP with `knobs` over it."""
    return {**TINY_MLP, **knobs}


def jpeg_cell(folder, **knobs) -> dict:
    """TINY_RESNET on the JPEG folder `folder` (dataset images), `knobs` over it."""
    return {**TINY_RESNET, "dataset": "images", "data_dir": str(folder), **knobs}


def tiny_mlp_base(**knobs) -> dict:
    """The tiny MLP as an experiment's base in a workflow config, `knobs` over it: training on 32
    samples in memory, its steps left to the config's defaults."""
    shape = {k: v for k, v in TINY_MLP.items() if k not in ("steps", "warmup_steps")}
    return {"scenario": "train", "dataset": "memory", **shape, "num_samples": 32, **knobs}


def user_cell(module: str, src: str | None = None, dataset: str = "build", **knobs) -> dict:
    """A cell of a user's module (tests/conftest.py's user_module): its `dataset` builder, `model`
    and `step`, the module imported from the folder `src` where given, `knobs` over them."""
    cell = {"dataset": f"{module}:{dataset}", "model": f"{module}:model", "step": f"{module}:step"}
    return {**cell, **({"python_path": [src]} if src is not None else {}), **knobs}


def user_package(folder, monkeypatch, package: str, module: str, code: str, forget=()):
    """For a fixture to `yield from`: the user's package `package` with its module `module` of
    `code`, under `folder`/src, outside feedbench; that src folder, for `python_path`. sys.path is
    restored after the test (which may insert into it), and the package's modules, with those of
    the packages in `forget`, are forgotten, so that the next test imports its own copy."""
    src = folder / "src" / package
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / module).write_text(textwrap.dedent(code))
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield str(folder / "src")
    for name in [n for n in sys.modules if n.startswith((package, *forget))]:
        del sys.modules[name]


def cell_command(out, knobs: dict | None = None, *options: str, cell=None) -> list[str]:
    """`python -m feedbench run [CELL] --out OUT OPTIONS --set k=v ...`: each value written as JSON,
    which the CLI reads as YAML, so every string, number, bool, list and None comes back as it
    was."""
    command = [
        sys.executable,
        "-m",
        "feedbench",
        "run",
        *([str(cell)] if cell is not None else []),
        "--out",
        str(out),
    ]
    sets = [f"--set={k}={json.dumps(v)}" for k, v in (knobs or {}).items()]
    return [*command, *options, *sets]


def start_cell(
    out, knobs: dict | None = None, *options: str, cell=None, **popen
) -> subprocess.Popen:
    """The cell running in a process of its own (subprocess.Popen's keywords in `popen`), to signal,
    kill or watch."""
    return subprocess.Popen(cell_command(out, knobs, *options, cell=cell), **popen)


def run_cell_process(
    out, knobs: dict | None = None, *options: str, cell=None, timeout: float = 300, **run
) -> subprocess.CompletedProcess:
    """The cell run to its end in a process of its own, its output captured as text."""
    command = cell_command(out, knobs, *options, cell=cell)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **run)


# A cell labelled as the bench rule labels it (experiment, cell, repeat), for the records of lost
# and moved cells (tests/plan/test_slurm_plugin.py, test_job.py, tests/workflow/test_attempts.py).
LABELLED = tiny_mlp_base(
    steps=3,
    warmup_steps=1,
    device="cpu",
    experiment="nodefail",
    cell="seed-1",
    repeat=1,
    baseline=True,
)
