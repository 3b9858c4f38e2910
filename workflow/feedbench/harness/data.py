"""The input pipeline: dataset registry, per-sample delay and the DataLoader of a cell."""

from __future__ import annotations

import functools
import gc
import io
import os
import time
from typing import Callable

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    TensorDataset,
    default_collate,
)

from ..core.cell import Cell
from ..core.knobs import JPEG_DATASETS, KnobError
from ..core.model_names import input_kind
from ..core.plugins import call_factory
from .collector import worker_init
from .stages import StagedBatch, TimedCollate, make_stages, named, stage
from .timing import device_work

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CIFAR_MEAN, CIFAR_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


def sample_shape(cell: Cell) -> tuple[int, ...]:
    return (
        (cell.input_size,)
        if input_kind(cell.model) == "vector"
        else (3, cell.image_size, cell.image_size)
    )


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


class SyntheticDataset(Dataset):
    """Tensors made in __getitem__, deterministically from (seed, index): CPU work per sample."""

    def __init__(
        self, num_samples: int, shape: tuple[int, ...], num_classes: int | None, seed: int
    ):
        self.num_samples, self.shape, self.num_classes, self.seed = (
            num_samples,
            shape,
            num_classes,
            seed,
        )

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
        seq = torch.randint(
            1,
            self.vocab_size,
            (int(self.lengths[index]) + 1,),
            generator=_generator(self.seed, index),
        )
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
            f"knob 'data_dir': dataset '{cell.dataset}' needs an existing folder, {path!r} is "
            f"not one; {how}"
        )
    return path


def decode(data: bytes, decoder: str):
    """One JPEG's bytes as the cell's decoder hands them to the transforms (knob `decoder`): an RGB
    PIL image (pil), a uint8 3 x H x W tensor (torchvision), or, for torchvision-cuda, the bytes as
    a uint8 tensor that DeviceDecoded decodes on the GPU a batch at a time."""
    with stage("decode"):
        if decoder == "pil":
            from PIL import Image

            return Image.open(io.BytesIO(data)).convert("RGB")
        # a copy: frombuffer warns on read-only bytes
        encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if decoder == "torchvision-cuda":
            return encoded
        from torchvision.io import ImageReadMode, decode_jpeg

        return decode_jpeg(encoded, mode=ImageReadMode.RGB)


def load_image(path: str, decoder: str = "pil"):
    """The file decoded by `decode`, with errors that name the file (PIL's 'image file is truncated'
    does not)."""
    try:
        with stage("read"):
            with open(path, "rb") as f:
                data = f.read()
        return decode(data, decoder)
    # the same type (UnidentifiedImageError stays itself), named
    except (OSError, RuntimeError) as error:
        raise named(error, f"{path}: {error}", OSError) from error


def _images(cell: Cell) -> Dataset:
    import torchvision

    root = _need_dir(
        cell, f"make one with: python -m feedbench make-images {cell.data_dir or 'DIR'}"
    )
    if os.path.isdir(os.path.join(root, "train")):
        root = os.path.join(root, "train")
    loader = functools.partial(load_image, decoder=cell.decoder)
    try:
        return torchvision.datasets.ImageFolder(
            root, transform=_sample_transform(cell), loader=loader
        )
    except FileNotFoundError as error:
        raise KnobError(
            f"knob 'data_dir': {error}; make one with: python -m feedbench make-images DIR"
        ) from None


def _cifar(cell: Cell) -> Dataset:
    import torchvision
    from torchvision import transforms as T

    if cell.download:
        os.makedirs(cell.data_dir, exist_ok=True)
    root = _need_dir(cell, "point it at a CIFAR root or set download: true")
    cls = (
        torchvision.datasets.CIFAR10 if cell.dataset == "cifar10" else torchvision.datasets.CIFAR100
    )
    transform = T.Compose([T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD)])
    try:
        return cls(root=root, train=True, download=cell.download, transform=transform)
    # torchvision: "Dataset not found or corrupted. You can use download=True ..."
    except RuntimeError as error:
        raise KnobError(
            f"knob 'data_dir': {cell.dataset} not found in {root!r} ({error}); set download: "
            "true or fix the path"
        ) from None


def _image_transform(cell: Cell):
    """Crop, flip, to float and normalise a decoded JPEG: a PIL image (pil) or a uint8 tensor (the
    torchvision decoders), into the same float32 3 x image_size x image_size."""
    from torchvision import transforms as T

    return T.Compose(
        [
            T.RandomResizedCrop(cell.image_size),
            T.RandomHorizontalFlip(),
            T.ToTensor() if cell.decoder == "pil" else T.ConvertImageDtype(torch.float32),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def _sample_transform(cell: Cell):
    """What a JPEG dataset's worker applies after decode: none for torchvision-cuda (DeviceDecoded
    does it)."""
    return None if cell.decoder == "torchvision-cuda" else _image_transform(cell)


def jpeg_sample(data: bytes, decoder: str, transform):
    """A sample of JPEG bytes: decoded, then transformed where the worker transforms
    (_sample_transform)."""
    image = decode(data, decoder)
    return image if transform is None else transform(image)


def _shard_files(cell: Cell, fmt: str, ext: str) -> list[str]:
    from .shards import shard_dir

    root = _need_dir(cell, "make one with: python -m feedbench make-shards IMAGES DIR")
    folder = os.path.join(shard_dir(root, cell.shards), fmt)
    files = (
        sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(ext))
        if os.path.isdir(folder)
        else []
    )
    if not files:
        raise KnobError(
            f"knob 'shards': no {fmt} shards in {folder!r}; allowed: a count written by "
            f"python -m feedbench make-shards IMAGES {root} --shards {cell.shards}"
        )
    return files


def _webdataset(cell: Cell) -> Dataset:
    """WebDataset tar shards, split over ranks (split_by_node) and loader workers
    (split_by_worker)."""
    import webdataset as wds

    sample = functools.partial(jpeg_sample, decoder=cell.decoder, transform=_sample_transform(cell))
    return (
        wds.WebDataset(
            _shard_files(cell, "webdataset", ".tar"),
            shardshuffle=False,
            empty_check=False,
            nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker,
        )
        .to_tuple("jpg", "cls")
        .map_tuple(sample, int)
    )


class ParquetImages(Dataset):
    """Parquet files of JPEG bytes (columns jpg, cls), read with pyarrow once; decoded in
    __getitem__."""

    def __init__(self, files: list[str], sample: Callable):
        import pyarrow.parquet as pq

        tables = [pq.read_table(f, columns=["jpg", "cls"]) for f in files]
        self.jpegs = [b for t in tables for b in t.column("jpg").to_pylist()]
        self.labels = [c for t in tables for c in t.column("cls").to_pylist()]
        self.sample = sample

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.sample(self.jpegs[index]), self.labels[index]


def _parquet(cell: Cell) -> Dataset:
    sample = functools.partial(jpeg_sample, decoder=cell.decoder, transform=_sample_transform(cell))
    return ParquetImages(_shard_files(cell, "parquet", ".parquet"), sample)


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
    return TokenDataset(
        cell.num_samples, cell.seq_len, cell.seq_len_spread, cell.vocab_size, cell.seed
    )


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


class Stream(IterableDataset):
    """A user's dataset that is only iterable (`__iter__`, no `__getitem__` with `__len__`), as a
    torch IterableDataset: the DataLoader, and feedbench's stream paths after it (no sampler, no
    index to cache by), take it as the stream it is. Its `dataset` is the user's object, where the
    stage timing looks for its transforms."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)


# What a dataset factory may return, in words: what torch.utils.data.DataLoader takes.
DATASET_KINDS = (
    "what torch.utils.data.DataLoader takes: an object with __getitem__ and __len__ (a "
    "torch Dataset, a Hugging Face datasets.Dataset, a list) or with __iter__ (an "
    "IterableDataset, a stream)"
)


def as_dataset(value, target: str):
    """What the user's dataset factory returned, as the DataLoader takes it: a torch Dataset or
    IterableDataset, or any other object with __getitem__ and __len__ (map-style, as the DataLoader
    reads every object that is no IterableDataset), as it is; an object with __iter__ alone as a
    Stream; anything else one KnobError saying what came back."""
    if isinstance(value, (Dataset, IterableDataset)):
        return value
    kind = type(value)
    if callable(getattr(kind, "__getitem__", None)) and callable(getattr(kind, "__len__", None)):
        return value
    if callable(getattr(kind, "__iter__", None)):
        return Stream(value)
    has = " (it has __getitem__ but no __len__)" if hasattr(kind, "__getitem__") else ""
    raise KnobError(
        f"knob 'dataset': '{target}' returned {kind.__module__}.{kind.__qualname__}{has}; "
        f"allowed: {DATASET_KINDS}"
    )


def build_dataset(cell: Cell, user: dict | None = None, ctx=None) -> Dataset:
    """The cell's dataset; `user` maps knobs to the user's imported callables
    (feedbench.core.plugins.resolve_all)."""
    if user and "dataset" in user:
        dataset = as_dataset(call_factory(user["dataset"], ctx, cell.dataset_args), cell.dataset)
        if cell.sample_delay_ms > 0 and isinstance(dataset, IterableDataset):
            raise KnobError(
                "knob 'sample_delay_ms': an IterableDataset has no __getitem__ to delay; allowed: 0"
            )
    else:
        dataset = DATASETS[cell.dataset](cell)
    return Delayed(dataset, cell.sample_delay_ms) if cell.sample_delay_ms > 0 else dataset


def batch_fetch_note(built, loaded) -> str | None:
    """The adjustment when the dataset as built fetches a batch in one call (`__getitems__`, as a
    Hugging Face datasets.Dataset does, which the DataLoader then calls) and the dataset the loader
    reads, wrapped by feedbench (stage timing, a what-if, a delay), fetches sample by sample."""
    if getattr(built, "__getitems__", None) is None or getattr(loaded, "__getitems__", None):
        return None
    return (
        f"the dataset's {type(built).__name__}.__getitems__ (a batch fetched in one call) was "
        "not called: feedbench's stage timing, what-if or delay reads it sample by sample "
        "through __getitem__"
    )


def batch_size_of(cell: Cell) -> int:
    """Samples per batch the cell asks of its loader: dp feeds all of its GPUs from one loader."""
    return cell.batch_size * (cell.gpus_per_node if cell.parallel == "dp" else 1)


def short_batch_note(cell: Cell, samples: list[int]) -> str | None:
    """The adjustment to record when every measured batch was smaller than asked: a dataset smaller
    than one batch.

    build_loader keeps the last, short batch (drop_last off) only then, rather than
    measure nothing; `samples` are this process's measured batch sizes.
    """
    if not samples or not max(samples) or max(samples) >= batch_size_of(cell):
        return None  # no sample counted at all: the cell failed, saying why (batches.uncounted)
    per_rank = " per rank" if cell.parallel in ("ddp", "independent") else ""
    return (
        f"batch_size={cell.batch_size} ran as batches of {max(samples)}: "
        f"the dataset has fewer samples than one batch{per_rank}"
    )


def collate_jpegs(samples: list) -> tuple[list[torch.Tensor], torch.Tensor]:
    """torchvision-cuda: a batch of undecoded JPEGs (uint8 tensors of different lengths, kept as a
    list) and labels."""
    return [jpeg for jpeg, _ in samples], torch.tensor([label for _, label in samples])


def worker_start(cell: Cell) -> Callable | None:
    """What each loader worker runs as it starts, where the cell needs it: its collector on (gc:
    disable turns the trainer's off during the window, when a new epoch's workers may fork), and the
    stage_functions made stages again (a spawned worker imports the user's modules afresh; a forked
    one has them already, made stages is idempotent)."""
    if cell.gc != "disable" and not cell.stage_functions:
        return None
    return functools.partial(_worker_start, tuple(cell.stage_functions or ()))


def _worker_start(stage_functions: tuple[str, ...], worker_id: int) -> None:
    worker_init(worker_id)
    make_stages(list(stage_functions))


class DeviceDecoded:
    """torchvision-cuda: the loader's batches of JPEG bytes decoded together on this process's GPU
    (one batched decode_jpeg), then cropped, flipped and normalised there image by image, in the
    training process.

    The rest of the loader (len, sampler) is the DataLoader's. A loader cell waits for the decode to
    finish: it has no step for the GPU's work to overlap with, and its batch is not ready before.

    torchvision's batched decode writes its outputs from a stream of its own that does not wait for
    the caller's (pytorch/vision#9606: corrupted images in 199 of 200 runs on an H100 with work
    queued on the caller's stream), and here the caller's stream has work queued: the host runs
    ahead of the GPU under `timing: events`, and the stream prefetcher decodes on its side stream.
    So the decode runs on a stream of ours that first waits for the caller's, the caller's waits for
    it, and the images are recorded on the caller's stream, as that issue prescribes.
    """

    def __init__(self, loader: DataLoader, cell: Cell, device: torch.device):
        self.loader, self.transform, self.device = loader, _image_transform(cell), device
        self.sync = cell.scenario == "loader"
        self.decode_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        if name == "loader":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self):
        from torchvision.io import ImageReadMode, decode_jpeg

        for item in self.loader:
            # stage timing on: decode the batch, keep its timings
            staged = isinstance(item, StagedBatch)
            jpegs, labels = item.batch if staged else item
            # the trainer's time, not the loader's: a training step's device_prep (harness.timing)
            with device_work():
                images = self._decode(decode_jpeg, jpegs, ImageReadMode.RGB)
                batch = torch.stack([self.transform(image) for image in images])
            if self.sync:
                torch.cuda.synchronize(self.device)
            yield StagedBatch((batch, labels), item.timings) if staged else (batch, labels)

    def _decode(self, decode_jpeg, jpegs, mode) -> list[torch.Tensor]:
        """The batch decoded on our stream, ordered both ways against the caller's (the class's
        docstring)."""
        if self.decode_stream is None:
            return decode_jpeg(jpegs, mode=mode, device=self.device)
        caller = torch.cuda.current_stream(self.device)
        self.decode_stream.wait_stream(caller)
        with torch.cuda.stream(self.decode_stream):
            images = decode_jpeg(jpegs, mode=mode, device=self.device)
        caller.wait_stream(self.decode_stream)
        # made on our stream, used on the caller's: the allocator must not reuse them before
        for image in images:
            image.record_stream(caller)
        return images


def decode_device() -> torch.device:
    """Where torchvision-cuda decodes: this process's GPU (distributed.init sets each rank's)."""
    return torch.device("cuda", torch.cuda.current_device())


def decoder_facts(cell: Cell) -> dict | None:
    """The JPEG decoder of a cell that decodes JPEG, and its library: result.json's `decoder`; None
    otherwise (a transfer cell times copies of made-up tensors)."""
    if cell.dataset not in JPEG_DATASETS or cell.scenario == "transfer":
        return None
    if cell.decoder == "pil":
        import PIL
        from PIL import features

        turbo = features.version("libjpeg_turbo")
        library = f"libjpeg-turbo {turbo}" if turbo else f"libjpeg {features.version('jpg')}"
        return {"name": "pil", "library": f"{library} (Pillow {PIL.__version__})"}
    import importlib.metadata

    version = importlib.metadata.version("torchvision")
    if cell.decoder == "torchvision-cuda":
        return {
            "name": cell.decoder,
            "library": f"nvJPEG of CUDA {torch.version.cuda} (torchvision {version})",
        }
    return {"name": cell.decoder, "library": f"{_torchvision_libjpeg()} (torchvision {version})"}


def _torchvision_libjpeg() -> str:
    """What torchvision says of the libjpeg it was built with: turbo or not, and the libjpeg API
    version (its own ops, private; torchvision exposes no release number of it)."""
    import torchvision.io  # noqa: F401  (registers torch.ops.image)

    try:
        api = int(torch.ops.image._jpeg_version())
        turbo = bool(torch.ops.image._is_compiled_against_turbo())
    except (AttributeError, RuntimeError):
        return "libjpeg (version not exposed)"
    return f"{'libjpeg-turbo' if turbo else 'libjpeg'}, libjpeg API {api // 10}.{api % 10}"


def build_loader(
    cell: Cell,
    dataset: Dataset,
    rank: int = 0,
    world_size: int = 1,
    collate=None,
    timed: bool = False,
) -> DataLoader:
    """The cell's DataLoader; knobs PyTorch refuses without workers were already neutralised by
    resolve().

    With several ranks each reads its own shard (DistributedSampler); with dp one process feeds all
    GPUs, so its batch is batch_size x gpus_per_node. An IterableDataset shards itself (ctx and
    torch.utils.data.get_worker_info): no sampler, no shuffle, and its last short batch is kept.
    With decoder torchvision-cuda it yields JPEG bytes, decoded on the GPU by DeviceDecoded, which
    wraps it. `timed`: collate is timed and returns each batch with its stage timings
    (harness.stages).
    """
    sampler = None
    iterable = isinstance(dataset, IterableDataset)
    if world_size > 1 and not iterable:
        sampler = DistributedSampler(
            dataset,
            num_replicas=world_size,
            rank=rank,
            shuffle=cell.shuffle,
            seed=cell.seed,
            drop_last=True,
        )
    if cell.num_workers and torch.cuda.is_initialized():
        # Forked workers inherit this process's garbage; a CUDA object in it (an event of an earlier
        # cell run in this process, whatever this cell's device) destroyed by the collector in a
        # worker aborts it: "CUDA error: initialization error". Collect it here, where CUDA still
        # works: every loader of a cell is built here.
        gc.collect()
    batch_size = batch_size_of(cell)
    on_device = cell.decoder == "torchvision-cuda"
    collate = collate or (
        pad_tokens if cell.dataset == "tokens" else collate_jpegs if on_device else None
    )
    if timed:
        collate = TimedCollate(collate or default_collate)
    options = {}
    if cell.num_workers > 0:
        options = dict(
            prefetch_factor=cell.prefetch_factor,
            persistent_workers=cell.persistent_workers,
            multiprocessing_context=cell.multiprocessing_context,
            in_order=cell.in_order,
            worker_init_fn=worker_start(cell),
        )
    loader = DataLoader(
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
    return DeviceDecoded(loader, cell, decode_device()) if on_device else loader
