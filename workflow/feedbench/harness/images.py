"""make-images: a deterministic folder of real JPEG files in the ImageNet layout.

DIR/train/<class>/<class>_<index>.JPEG. Each image is a smooth random field
plus noise, so it compresses and decodes like a photograph rather than a flat
colour; the same arguments give the same pixels.
"""

from __future__ import annotations

import os

import numpy as np
from PIL import Image


def class_name(k: int) -> str:
    return f"n{k:08d}"


def _image(rng: np.random.Generator, size: int) -> Image.Image:
    coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((size, size), Image.BICUBIC), dtype=np.int16)
    noise = rng.integers(-24, 25, (size, size, 3), dtype=np.int16)
    return Image.fromarray(np.clip(smooth + noise, 0, 255).astype(np.uint8))


def make_images(
    root: str, count: int, size: int, classes: int, seed: int = 0, quality: int = 90
) -> int:
    """Write `count` JPEGs of size x size over `classes` classes; return how many were written."""
    if count < 1 or size < 8 or classes < 1:
        raise ValueError("count >= 1, size >= 8 and classes >= 1 are required")
    for k in range(classes):
        os.makedirs(os.path.join(root, "train", class_name(k)), exist_ok=True)
    for i in range(count):
        k = i % classes
        path = os.path.join(root, "train", class_name(k), f"{class_name(k)}_{i:07d}.JPEG")
        _image(np.random.default_rng([seed, i]), size).save(path, "JPEG", quality=quality)
    return count
