"""The input pipeline: dataset registry, per-sample delay and the DataLoader of a cell."""

from __future__ import annotations

import os
import time
from typing import Callable

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, TensorDataset, default_collate

from ..plan.cell import Cell
from ..plan.knobs import KnobError
from ..plan.model_names import input_kind
from ..plan.plugins import expect
from .stages import TimedCollate, stage

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CIFAR_MEAN, CIFAR_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


def sample_shape(cell: Cell) -> tuple[int, ...]:
    return (cell.input_size,) if input_kind(cell.model) == "vector" else (3, cell.image_size, cell.image_size)


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


class SyntheticDataset(Dataset):
    """Tensors made in __getitem__, deterministically from (seed, index): CPU work per sample."""

    def __init__(self, num_samples: int, shape: tuple[int, ...], num_classes: int | None, seed: int):
        self.num_samples, self.shape, self.num_classes, self.seed = num_samples, shape, num_classes, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int):
        g = _generator(self.seed, index)
        x = torch.randn(self.shape, generator=g)
        if self.num_classes is None:
            return x, torch.randn((1,), generator=g)
        return x, int(torch.randint(self.num_classes, (), generator=g))


class TokenDataset(Dataset):
    """Variable-length token sequences (next-token targets); lengths fixed per index."""

    def __init__(self, num_samples: int, seq_len: int, spread: float, vocab_size: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        low, high = max(2, round(seq_len * (1 - spread))), max(2, round(seq_len * (1 + spread)))
        self.lengths = torch.randint(low, high + 1, (num_samples,), generator=g)
        self.vocab_size, self.seed = vocab_size, seed

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int):
        seq = torch.randint(1, self.vocab_size, (int(self.lengths[index]) + 1,), generator=_generator(self.seed, index))
        return seq[:-1], seq[1:]


def pad_tokens(samples: list[tuple[torch.Tensor, torch.Tensor]]):
    """Collate token sequences: (inputs [B, T], targets [B, T], true lengths [B]), padded with 0."""
    inputs = torch.nn.utils.rnn.pad_sequence([s[0] for s in samples], batch_first=True)
    targets = torch.nn.utils.rnn.pad_sequence([s[1] for s in samples], batch_first=True)
    return inputs, targets, torch.tensor([len(s[0]) for s in samples])


class Delayed(Dataset):
    """Adds a fixed cost to every __getitem__: sleeps until delay_ms after the call began."""

    def __init__(self, dataset: Dataset, delay_ms: float):
        self.dataset, self.delay_s = dataset, delay_ms / 1000

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        deadline = time.perf_counter() + self.delay_s
        sample = self.dataset[index]
        remaining = deadline - time.perf_counter()
        if remaining > 0:
            with stage("sample_delay"):
                time.sleep(remaining)
        return sample


def _need_dir(cell: Cell, how: str) -> str:
    path = cell.data_dir
    if not path or not os.path.isdir(path):
        raise KnobError(
            f"knob 'data_dir': dataset '{cell.dataset}' needs an existing folder, {path!r} is not one; {how}"
        )
    return path


def load_image(path: str):
    """torchvision's PIL loader, timed as the stages `read` and `decode`, whose errors name the file (PIL's 'image
    file is truncated' does not)."""
    import io

    from PIL import Image

    try:
        with stage("read"):
            with open(path, "rb") as f:
                data = f.read()
        with stage("decode"):
            return Image.open(io.BytesIO(data)).convert("RGB")
    except OSError as error:  # the same type (UnidentifiedImageError stays itself), the message prefixed with the file
        try:
            named = type(error)(f"{path}: {error}")
        except TypeError:  # a subclass whose constructor takes other arguments
            named = OSError(f"{path}: {error}")
        raise named from error


def _images(cell: Cell) -> Dataset:
    import torchvision
    from torchvision import transforms as T

    root = _need_dir(cell, f"make one with: python -m feedbench make-images {cell.data_dir or 'DIR'}")
    if os.path.isdir(os.path.join(root, "train")):
        root = os.path.join(root, "train")
    transform = T.Compose(
        [
            T.RandomResizedCrop(cell.image_size),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    try:
        return torchvision.datasets.ImageFolder(root, transform=transform, loader=load_image)
    except FileNotFoundError as error:
        raise KnobError(f"knob 'data_dir': {error}; make one with: python -m feedbench make-images DIR") from None


def _cifar(cell: Cell) -> Dataset:
    import torchvision
    from torchvision import transforms as T

    if cell.download:
        os.makedirs(cell.data_dir, exist_ok=True)
    root = _need_dir(cell, "point it at a CIFAR root or set download: true")
    cls = torchvision.datasets.CIFAR10 if cell.dataset == "cifar10" else torchvision.datasets.CIFAR100
    transform = T.Compose([T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD)])
    try:
        return cls(root=root, train=True, download=cell.download, transform=transform)
    except RuntimeError as error:  # torchvision: "Dataset not found or corrupted. You can use download=True ..."
        raise KnobError(
            f"knob 'data_dir': {cell.dataset} not found in {root!r} ({error}); set download: true or fix the path"
        ) from None


def _image_transform(cell: Cell):
    from torchvision import transforms as T

    return T.Compose(
        [
            T.RandomResizedCrop(cell.image_size),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def _shard_files(cell: Cell, fmt: str, ext: str) -> list[str]:
    from .shards import shard_dir

    root = _need_dir(cell, "make one with: python -m feedbench make-shards IMAGES DIR")
    folder = os.path.join(shard_dir(root, cell.shards), fmt)
    files = (
        sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(ext)) if os.path.isdir(folder) else []
    )
    if not files:
        raise KnobError(
            f"knob 'shards': no {fmt} shards in {folder!r}; allowed: a count written by "
            f"python -m feedbench make-shards IMAGES {root} --shards {cell.shards}"
        )
    return files


def _webdataset(cell: Cell) -> Dataset:
    """WebDataset tar shards, split over ranks (split_by_node) and loader workers (split_by_worker)."""
    import webdataset as wds

    transform = _image_transform(cell)
    return (
        wds.WebDataset(
            _shard_files(cell, "webdataset", ".tar"),
            shardshuffle=False,
            empty_check=False,
            nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker,
        )
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(transform, int)
    )


class ParquetImages(Dataset):
    """Parquet files of JPEG bytes (columns jpg, cls), read with pyarrow once; decoded in __getitem__."""

    def __init__(self, files: list[str], transform):
        import pyarrow.parquet as pq

        tables = [pq.read_table(f, columns=["jpg", "cls"]) for f in files]
        self.jpegs = [b for t in tables for b in t.column("jpg").to_pylist()]
        self.labels = [c for t in tables for c in t.column("cls").to_pylist()]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        import io

        from PIL import Image

        with stage("decode"):
            image = Image.open(io.BytesIO(self.jpegs[index])).convert("RGB")
        return self.transform(image), self.labels[index]


def _parquet(cell: Cell) -> Dataset:
    return ParquetImages(_shard_files(cell, "parquet", ".parquet"), _image_transform(cell))


def _synthetic(cell: Cell) -> Dataset:
    classes = None if input_kind(cell.model) == "vector" else cell.num_classes
    return SyntheticDataset(cell.num_samples, sample_shape(cell), classes, cell.seed)


def _memory(cell: Cell) -> Dataset:
    """All samples made up front and kept in RAM, as in the prefetch study."""
    g = torch.Generator().manual_seed(cell.seed)
    x = torch.randn((cell.num_samples, *sample_shape(cell)), generator=g)
    if input_kind(cell.model) == "vector":
        return TensorDataset(x, torch.randn((cell.num_samples, 1), generator=g))
    return TensorDataset(x, torch.randint(cell.num_classes, (cell.num_samples,), generator=g))


def _tokens(cell: Cell) -> Dataset:
    return TokenDataset(cell.num_samples, cell.seq_len, cell.seq_len_spread, cell.vocab_size, cell.seed)


DATASETS: dict[str, Callable] = {
    "synthetic": _synthetic,
    "memory": _memory,
    "images": _images,
    "cifar10": _cifar,
    "cifar100": _cifar,
    "tokens": _tokens,
    "webdataset": _webdataset,
    "parquet": _parquet,
}


def build_dataset(cell: Cell, user: dict | None = None, ctx=None) -> Dataset:
    """The cell's dataset; `user` maps knobs to the user's imported callables (feedbench.plan.plugins.resolve_all)."""
    if user and "dataset" in user:
        dataset = expect(
            user["dataset"](ctx, **cell.dataset_args),
            (Dataset, IterableDataset),
            "a torch.utils.data.Dataset or IterableDataset",
            cell.dataset,
            "dataset",
        )
        if cell.sample_delay_ms > 0 and isinstance(dataset, IterableDataset):
            raise KnobError("knob 'sample_delay_ms': an IterableDataset has no __getitem__ to delay; allowed: 0")
    else:
        dataset = DATASETS[cell.dataset](cell)
    return Delayed(dataset, cell.sample_delay_ms) if cell.sample_delay_ms > 0 else dataset


def batch_size_of(cell: Cell) -> int:
    """Samples per batch the cell asks of its loader: dp feeds all of its GPUs from one loader."""
    return cell.batch_size * (cell.gpus_per_node if cell.parallel == "dp" else 1)


def short_batch_note(cell: Cell, samples: list[int]) -> str | None:
    """The adjustment to record when every measured batch was smaller than asked: a dataset smaller than one batch.

    build_loader keeps the last, short batch (drop_last off) only then, rather than
    measure nothing; `samples` are this process's measured batch sizes.
    """
    if not samples or max(samples) >= batch_size_of(cell):
        return None
    per_rank = " per rank" if cell.parallel in ("ddp", "independent") else ""
    return (
        f"batch_size={cell.batch_size} ran as batches of {max(samples)}: "
        f"the dataset has fewer samples than one batch{per_rank}"
    )


def build_loader(
    cell: Cell, dataset: Dataset, rank: int = 0, world_size: int = 1, collate=None, timed: bool = False
) -> DataLoader:
    """The cell's DataLoader; knobs PyTorch refuses without workers were already neutralised by resolve().

    With several ranks each reads its own shard (DistributedSampler); with dp
    one process feeds all GPUs, so its batch is batch_size x gpus_per_node.
    An IterableDataset shards itself (ctx and torch.utils.data.get_worker_info):
    no sampler, no shuffle, and its last short batch is kept.
    `timed`: collate is timed and returns each batch with its stage timings (harness.stages).
    """
    sampler = None
    iterable = isinstance(dataset, IterableDataset)
    if world_size > 1 and not iterable:
        sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=cell.shuffle, seed=cell.seed, drop_last=True
        )
    batch_size = batch_size_of(cell)
    collate = collate or (pad_tokens if cell.dataset == "tokens" else None)
    if timed:
        collate = TimedCollate(collate or default_collate)
    options = {}
    if cell.num_workers > 0:
        options = dict(
            prefetch_factor=cell.prefetch_factor,
            persistent_workers=cell.persistent_workers,
            multiprocessing_context=cell.multiprocessing_context,
            in_order=cell.in_order,
        )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=cell.shuffle if sampler is None and not iterable else False,
        sampler=sampler,
        num_workers=cell.num_workers,
        pin_memory=cell.pin_memory,
        drop_last=not iterable and len(dataset) >= batch_size * world_size,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(cell.seed),
        **options,
    )
