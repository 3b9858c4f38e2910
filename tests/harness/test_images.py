"""make-images writes real, decodable JPEG files in the ImageNet layout, the same bytes every
time."""

from __future__ import annotations

import hashlib

import pytest
from conftest import cli
from feedbench.harness.images import make_images
from helpers.cells import TINY_LOADER
from PIL import Image
from torchvision.datasets import ImageFolder


def _digest(root) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.JPEG")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def test_layout_decoding_and_determinism(tmp_path):
    make_images(str(tmp_path / "a"), count=12, size=48, classes=3, seed=5)
    make_images(str(tmp_path / "b"), count=12, size=48, classes=3, seed=5)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    make_images(str(tmp_path / "c"), count=12, size=48, classes=3, seed=6)
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")
    folder = ImageFolder(str(tmp_path / "a" / "train"))
    assert len(folder) == 12 and folder.classes == ["n00000000", "n00000001", "n00000002"]
    with Image.open(folder.samples[0][0]) as image:
        assert image.format == "JPEG" and image.size == (48, 48)


def test_cli_make_images_and_bad_arguments(tmp_path):
    proc = cli(
        "make-images", str(tmp_path / "imgs"), "--count", "4", "--size", "16", "--classes", "2"
    )
    assert proc.returncode == 0 and "wrote 4 JPEG files" in proc.stdout
    bad = cli("make-images", str(tmp_path / "x"), "--count", "0")
    assert bad.returncode == 2
    assert (
        bad.stderr.strip() == "feedbench: error: make-images: count >= 1, size >= 8 and "
        "classes >= 1 are required"
    )


@pytest.mark.parametrize("decoder", ["pil", "torchvision"])
def test_a_truncated_jpeg_fails_the_cell_naming_the_file(run_cell, tmp_path, decoder):
    """Neither decoder says which file it could not read: the cell's error names the file (PIL's
    words follow it)."""
    make_images(str(tmp_path / "imgs"), count=4, size=32, classes=1)
    victim = min((tmp_path / "imgs").rglob("*.JPEG"))
    with open(victim, "r+b") as f:
        f.truncate(100)
    knobs = dict(TINY_LOADER, dataset="images", data_dir=str(tmp_path / "imgs"), batch_size=2)
    code, result = run_cell(**knobs, decoder=decoder, shuffle=False)
    assert code == 1 and result["status"] == "failed"
    message = result["error"]["message"]
    assert message.startswith(f"{victim}: "), message
    if decoder == "pil":
        assert (
            result["error"]["type"] == "OSError"
            and "truncated" in message[len(str(victim)) :].lower()
        ), message
