"""A user's input pipeline, as it would be without feedbench: WebDataset-format tar shards of JPEGs
(`<key>.jpg` + `<key>.cls`), read as an IterableDataset that splits its shards over ranks and loader
workers, its own augmentation, and a collate that returns a dict batch."""

from __future__ import annotations

import io
import os
import random
import tarfile

import torch
from PIL import Image, ImageDraw
from torch.utils.data import IterableDataset, get_worker_info


def make_shards(
    root: str, shards: int, count: int, size: int, classes: int, seed: int = 0
) -> list[str]:
    """Write `count` JPEGs of coloured shapes into `shards` tar files, deterministically; return
    their paths.

    Written to a temporary folder and renamed, so concurrent jobs asking for the same shards never
    see half of them.
    """
    folder = os.path.join(root, f"shards-{shards}-n{count}-s{size}-c{classes}-seed{seed}")
    if not os.path.isdir(folder):
        tmp = f"{folder}.tmp{os.getpid()}"
        os.makedirs(tmp)
        rng = random.Random(seed)
        tars = [tarfile.open(os.path.join(tmp, f"shard-{i:05d}.tar"), "w") for i in range(shards)]
        for index in range(count):
            label = index % classes
            image = Image.new("RGB", (size, size), tuple(rng.randrange(256) for _ in range(3)))
            x0, y0 = rng.randrange(size // 2), rng.randrange(size // 2)
            ImageDraw.Draw(image).ellipse(
                (x0, y0, x0 + size // 3 + label, y0 + size // 3), fill=(255 - label * 20, 40, 90)
            )
            jpeg = io.BytesIO()
            image.save(jpeg, "JPEG", quality=90)
            for ext, payload in (("jpg", jpeg.getvalue()), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{index:08d}.{ext}")
                info.size = len(payload)
                tars[index % shards].addfile(info, io.BytesIO(payload))
        for tar in tars:
            tar.close()
        try:
            os.rename(tmp, folder)
        except OSError:  # another job got there first: its shards are the same bytes
            pass
    return sorted(
        os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".tar")
    )


def augment(image: Image.Image, crop: int, rng: random.Random) -> torch.Tensor:
    """Random crop, horizontal flip and a brightness jitter, then a CHW float tensor in [0, 1]."""
    left, top = rng.randrange(image.width - crop + 1), rng.randrange(image.height - crop + 1)
    image = image.crop((left, top, left + crop, top + crop))
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(crop, crop, 3)
    return (pixels.permute(2, 0, 1).float() / 255 * rng.uniform(0.8, 1.2)).clamp_(0, 1)


class ShardStream(IterableDataset):
    """Samples of the shards this rank and this loader worker own: shard i goes to reader i mod
    (ranks x workers).

    With fewer shards than readers some readers get none: the pain of shards vs workers
    (webdataset#152).
    """

    def __init__(self, shards: list[str], crop: int, rank: int, world_size: int, seed: int):
        self.shards, self.crop, self.rank, self.world_size, self.seed = (
            shards,
            crop,
            rank,
            world_size,
            seed,
        )
        self.epoch = 0

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        reader, readers = self.rank * workers + worker, self.world_size * workers
        rng = random.Random(hash((self.seed, self.epoch, reader)))
        self.epoch += 1
        for path in self.shards[reader::readers]:
            with tarfile.open(path) as tar:
                members = {}
                for member in tar:
                    key, _, ext = member.name.partition(".")
                    members.setdefault(key, {})[ext] = tar.extractfile(member).read()
                    if len(members[key]) == 2:
                        sample = members.pop(key)
                        image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
                        yield augment(image, self.crop, rng), int(sample["cls"])


def build_dataset(
    ctx,
    root: str = "results/data/shapes",
    shards: int = 4,
    count: int = 512,
    size: int = 64,
    crop: int = 56,
    classes: int = 10,
) -> ShardStream:
    """The factory feedbench calls as build_dataset(ctx, **dataset_args)."""
    paths = make_shards(root, shards, count, size, classes, seed=0)
    return ShardStream(paths, crop, ctx.rank, ctx.world_size, ctx.seed)


def collate(samples: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
    return {
        "image": torch.stack([s[0] for s in samples]),
        "label": torch.tensor([s[1] for s in samples]),
    }
