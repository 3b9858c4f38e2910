"""What the study presets set, full size and small (issue 13), read through the matrix expansion."""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers.plans import PRESETS
from helpers.plans import preset_cells as cells


def knob(cell, name, default=None):
    return cell.knobs.get(name, default)


@pytest.mark.parametrize("size", ["full", "small"])
def test_prefetch_builds_the_ray_benchmarks_model(size):
    assert {knob(c, "mlp_style") for c in cells("prefetch", size)} == {"ray"}


@pytest.mark.parametrize("size", ["full", "small"])
def test_datastall_train_cells_pin_and_copy_asynchronously(size):
    train = [c for c in cells("datastall", size) if knob(c, "scenario") == "train"]
    assert train and all(
        knob(c, "pin_memory") is True and knob(c, "non_blocking") is True for c in train
    )


def test_breakdown_has_the_posts_q1_case_at_full_size_only():
    q1 = [c for c in cells("breakdown", "full") if knob(c, "batch_size") == 256]
    assert {(knob(c, "model"), knob(c, "gpus_per_node"), knob(c, "timing")) for c in q1} == {
        (m, g, t) for m in ("resnet18", "resnet50") for g in (1, 4) for t in ("naive", "events")
    }
    assert all(knob(c, "pin_memory") and knob(c, "non_blocking") for c in q1)
    assert not [c for c in cells("breakdown", "small") if knob(c, "batch_size") == 256]


def test_every_preset_cites_docs_studies():
    for name in os.listdir(PRESETS):
        with open(os.path.join(PRESETS, name)) as f:
            assert "docs/studies.md" in f.read(), name


def test_nothing_in_the_repository_cites_a_path_outside_it():
    """The studies' sources are in docs/studies.md; the notes the project started from are not in
    the repository."""
    root = os.path.dirname(PRESETS.rstrip(os.sep).rsplit(os.sep, 1)[0])
    outside = ["shared" + "/", "STUDIES" + ".md", "seeds" + "/"]
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = []
    for name in files:
        if name == "docs/studies.md" or not os.path.isfile(os.path.join(root, name)):
            continue
        with open(os.path.join(root, name), errors="replace") as f:
            text = f.read()
        found += [f"{name}: {word}" for word in outside if word in text]
    assert found == []


@pytest.mark.parametrize("size", ["full", "small"])
def test_workers_repeats_the_notebooks_window_in_every_cell(size):
    assert {knob(c, "profile_first_batch") for c in cells("workers", size)} == {True}
