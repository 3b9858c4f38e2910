"""make-shards: the generated JPEG set as WebDataset tar shards and as Parquet files,
deterministically.

DIR/shards-<N>/webdataset/shard-<i>.tar holds `<key>.jpg` and `<key>.cls`
members; DIR/shards-<N>/parquet/part-<i>.parquet holds columns `key`, `jpg`
(the JPEG bytes) and `cls`. Sample i goes to shard i mod N, in the sorted order
of the JPEG files, and tar headers carry no time or owner, so the same input
gives the same bytes.
"""

from __future__ import annotations

import io
import os
import tarfile


def jpeg_files(images_dir: str) -> list[tuple[str, int]]:
    """(path, class index) of every JPEG of an ImageNet-layout folder (its train/ when there is
    one), sorted."""
    root = (
        os.path.join(images_dir, "train")
        if os.path.isdir(os.path.join(images_dir, "train"))
        else images_dir
    )
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    files = [
        (os.path.join(root, c, name), k)
        for k, c in enumerate(classes)
        for name in sorted(os.listdir(os.path.join(root, c)))
    ]
    if not files:
        raise ValueError(
            f"no JPEG files under {root}; make them with: python -m feedbench make-images DIR"
        )
    return sorted(files)


def shard_dir(root: str, shards: int) -> str:
    return os.path.join(root, f"shards-{shards}")


def make_shards(images_dir: str, out_dir: str, shards: int) -> str:
    """Write both formats of `shards` shards; return their folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if shards < 1:
        raise ValueError("shards >= 1 is required")
    files = jpeg_files(images_dir)
    folder = shard_dir(out_dir, shards)
    os.makedirs(os.path.join(folder, "webdataset"), exist_ok=True)
    os.makedirs(os.path.join(folder, "parquet"), exist_ok=True)
    for i in range(shards):
        members = [(f"{n:08d}", path, k) for n, (path, k) in enumerate(files) if n % shards == i]
        rows = {"key": [], "jpg": [], "cls": []}
        with tarfile.open(
            os.path.join(folder, "webdataset", f"shard-{i:05d}.tar"),
            "w",
            format=tarfile.USTAR_FORMAT,
        ) as tar:
            for key, path, k in members:
                with open(path, "rb") as f:
                    jpeg = f.read()
                for ext, payload in (("jpg", jpeg), ("cls", str(k).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime, info.mode = len(payload), 0, 0o644
                    tar.addfile(info, io.BytesIO(payload))
                rows["key"].append(key)
                rows["jpg"].append(jpeg)
                rows["cls"].append(k)
        table = pa.table(
            {
                "key": pa.array(rows["key"], pa.string()),
                "jpg": pa.array(rows["jpg"], pa.binary()),
                "cls": pa.array(rows["cls"], pa.int64()),
            }
        )
        pq.write_table(table, os.path.join(folder, "parquet", f"part-{i:05d}.parquet"))
    return folder
