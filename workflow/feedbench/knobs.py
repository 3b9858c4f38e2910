"""The knobs of one cell: names, types, defaults and allowed values.

One table serves the command line, the validation of a cell and the
documentation, so the three cannot drift apart.
"""

from __future__ import annotations

import math
import re
import reprlib
from dataclasses import dataclass
from typing import Any

# How much of a value an error message shows: a config may hold a list of a million levels.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxdict, _SHOWN.maxlist, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 3, 6, 6, 60, 60, 40


def shown(value: Any) -> str:
    """repr(value), bounded in length, for one-line error messages."""
    return _SHOWN.repr(value)


# `package.module:attribute`: a knob that takes user code (Knob.plugin) names it so (feedbench.plugins imports it).
IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class KnobError(ValueError):
    """A bad knob value: the message is one line naming knob, value and choices."""


def _number(bound: float) -> str:
    """1000000 rather than 1e+06: a bound as people write it."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


@dataclass(frozen=True)
class Knob:
    name: str
    type: type | tuple[type, ...]
    default: Any
    help: str
    choices: tuple | None = None
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    plugin: bool = False  # also takes an import path `package.module:attribute` (user code)

    def allowed(self) -> str:
        if self.choices is not None:
            text = ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in self.choices)
            return text + (" or package.module:attribute" if self.plugin else "")
        if self.plugin:
            return "package.module:attribute" + (" or null" if self.nullable else "")
        kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping"}.get(
            self.type if isinstance(self.type, type) else float, "a number"
        )
        if self.type is list:
            kind = "a list"
        bounds = []
        if self.minimum is not None:
            bounds.append(f">= {_number(self.minimum)}")
        if self.maximum is not None:
            bounds.append(f"<= {_number(self.maximum)}")
        text = kind + (" " + " and ".join(bounds) if bounds else "")
        return text + (" or null" if self.nullable else "")

    def check(self, value: Any) -> Any:
        """Return the value, normalised, or raise KnobError."""
        if value is None:
            if self.nullable:
                return None
            raise KnobError(f"knob '{self.name}': value null is not allowed; allowed: {self.allowed()}")
        expected = self.type
        ok = isinstance(value, expected) and not (isinstance(value, bool) and expected in (int, float, (int, float)))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > 2**1023:  # beyond any float
                raise KnobError(f"knob '{self.name}': value {shown(value)} is out of range; allowed: {self.allowed()}")
            value, ok = float(value), True
        if not ok:
            raise KnobError(f"knob '{self.name}': value {shown(value)} has the wrong type; allowed: {self.allowed()}")
        if self.plugin and IMPORT_PATH.fullmatch(value):
            return value
        if self.plugin and self.choices is None:
            raise KnobError(
                f"knob '{self.name}': value {shown(value)} is not an import path; allowed: {self.allowed()}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise KnobError(f"knob '{self.name}': value {value!r} is not a finite number; allowed: {self.allowed()}")
        if self.choices is not None and value not in self.choices:
            raise KnobError(f"knob '{self.name}': value {shown(value)} is not allowed; allowed: {self.allowed()}")
        if self.minimum is not None and value < self.minimum or self.maximum is not None and value > self.maximum:
            raise KnobError(f"knob '{self.name}': value {shown(value)} is out of range; allowed: {self.allowed()}")
        return value


SCENARIOS = ("train", "loader", "compute", "transfer")
DATASETS = ("synthetic", "memory", "images", "cifar10", "cifar100", "tokens", "webdataset", "parquet")
TIMINGS = ("events", "sync", "naive")
AMP = ("off", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
DEVICE_PREFETCH = ("none", "stream")
MP_CONTEXTS = ("fork", "spawn", "forkserver")
LSTM_IMPLS = ("fused", "cell")
PARALLEL = ("none", "dp", "ddp", "independent")
PAGE_CACHE = ("asis", "warm", "cold")
MLP_STYLES = ("relu", "ray")

# 64 KiB .. 256 MiB in powers of four: the sizes of the transfer probe.
DEFAULT_TRANSFER_SIZES = [64 * 1024 * 4**i for i in range(7)]

KNOBS: dict[str, Knob] = {
    k.name: k
    for k in [
        # What runs.
        Knob(
            "scenario",
            str,
            "train",
            "train | loader (loader alone) | compute (data resident on the device) | transfer (H2D GB/s)",
            SCENARIOS,
        ),
        Knob("device", str, "auto", "auto picks cuda when available", DEVICES),
        Knob("steps", int, 50, "measured steps (ignored when epochs is set)", minimum=1, maximum=1_000_000),
        Knob(
            "epochs",
            int,
            None,
            "measured epochs; overrides steps with epochs x batches per epoch",
            minimum=1,
            maximum=10_000,
            nullable=True,
        ),
        Knob(
            "warmup_steps",
            int,
            5,
            "steps run before the measured window, excluded from every metric",
            minimum=0,
            maximum=100_000,
        ),
        Knob("seed", int, 0, "seed of data generation, shuffling and model init", minimum=0, maximum=2**32 - 1),
        # Data.
        Knob(
            "dataset",
            str,
            "synthetic",
            "where samples come from; user code: a factory called as f(ctx, **dataset_args)",
            DATASETS,
            plugin=True,
        ),
        Knob("dataset_args", dict, {}, "keyword arguments of a user dataset factory (axis: dataset_args.<name>)"),
        Knob(
            "data_dir",
            str,
            None,
            "root of images (ImageNet layout), CIFAR, or of make-shards (webdataset, parquet)",
            nullable=True,
        ),
        Knob(
            "shards",
            int,
            8,
            "webdataset, parquet: the shard set data_dir/shards-<N> (python -m feedbench make-shards --shards N)",
            minimum=1,
            maximum=1_000_000,
        ),
        Knob("download", bool, False, "let torchvision download CIFAR into data_dir"),
        Knob(
            "num_samples", int, 2048, "dataset length for synthetic, memory and tokens", minimum=1, maximum=100_000_000
        ),
        Knob("image_size", int, 224, "side of generated or cropped images", minimum=8, maximum=4096),
        Knob("input_size", int, 4096, "features per sample for the mlp", minimum=1, maximum=1_048_576),
        Knob("num_classes", int, 1000, "classes of generated labels and classifiers", minimum=1, maximum=1_000_000),
        Knob(
            "page_cache",
            str,
            "asis",
            "files of images/cifar: asis | warm (read them all first: fully cached) | cold (evict them first: "
            "drop_caches as root, else posix_fadvise)",
            PAGE_CACHE,
        ),
        Knob("sample_delay_ms", float, 0.0, "extra cost per sample in __getitem__", minimum=0, maximum=60_000),
        Knob("seq_len", int, 100, "mean sequence length of tokens", minimum=2, maximum=1_000_000),
        Knob(
            "seq_len_spread",
            float,
            0.5,
            "tokens: lengths are uniform in seq_len x (1 +- spread)",
            minimum=0,
            maximum=0.95,
        ),
        Knob("vocab_size", int, 1000, "tokens and lstm vocabulary", minimum=4, maximum=10_000_000),
        # Loader.
        Knob("batch_size", int, 64, "samples per step", minimum=1, maximum=1_048_576),
        Knob("num_workers", int, 0, "DataLoader worker processes", minimum=0, maximum=256),
        Knob("pin_memory", bool, False, "DataLoader pins batches in page-locked memory"),
        Knob("non_blocking", bool, False, "asynchronous host-to-device copies"),
        Knob(
            "prefetch_factor",
            int,
            None,
            "batches loaded ahead per worker (needs workers)",
            minimum=1,
            maximum=1024,
            nullable=True,
        ),
        Knob("persistent_workers", bool, False, "keep workers alive across epochs (needs workers)"),
        Knob("multiprocessing_context", str, None, "how workers start (needs workers)", MP_CONTEXTS, nullable=True),
        Knob("in_order", bool, True, "deliver batches in order (False lets fast workers go first)"),
        Knob("shuffle", bool, True, "shuffle the dataset every epoch"),
        Knob("device_prefetch", str, "none", "none | stream: copy the next batches on a side stream", DEVICE_PREFETCH),
        Knob("prefetch_depth", int, 1, "batches the stream prefetcher keeps in flight", minimum=1, maximum=64),
        Knob(
            "resident_batches",
            int,
            8,
            "compute: real batches of the loader copied to the device once and replayed",
            minimum=1,
            maximum=1024,
        ),
        # Parallelism.
        Knob(
            "parallel",
            str,
            "none",
            "none | dp (nn.DataParallel) | ddp (DistributedDataParallel) | independent "
            "(replicas, no gradient exchange)",
            PARALLEL,
        ),
        Knob(
            "gpus_per_node",
            int,
            1,
            "GPUs per node (processes on gloo without GPUs); batch_size is per GPU",
            minimum=1,
            maximum=64,
        ),
        Knob("nodes", int, 1, "nodes (ddp, independent); emulated on localhost outside Slurm", minimum=1, maximum=4096),
        Knob(
            "comm_probe_steps",
            int,
            10,
            "ddp: steps with and without gradient sync after the window, for the communication share (0: off)",
            minimum=0,
            maximum=100_000,
        ),
        # Model and step.
        Knob(
            "model",
            str,
            "mlp",
            "none, mlp, sleep, lstm, a torchvision classification model (resnet18, resnet50, ...) or user code: "
            "package.module:attribute called as f(ctx, **model_args)",
        ),
        Knob("model_args", dict, {}, "keyword arguments of a user model factory (axis: model_args.<name>)"),
        Knob("collate", str, None, "user collate_fn of the DataLoader", nullable=True, plugin=True),
        Knob(
            "to_device",
            str,
            None,
            "user f(batch, device, non_blocking) moving a custom batch",
            nullable=True,
            plugin=True,
        ),
        Knob(
            "step",
            str,
            None,
            "user f(model, batch, ctx) -> loss (None: it did backward and the optimizer itself)",
            nullable=True,
            plugin=True,
        ),
        Knob(
            "python_path",
            list,
            [],
            "folders put first on sys.path before user code is imported (the config's python_path)",
        ),
        Knob("hidden_layers", int, 1, "mlp: hidden Linear+ReLU layers", minimum=0, maximum=1000),
        Knob("width", int, 4096, "mlp: width of hidden layers", minimum=1, maximum=1_048_576),
        Knob("compute_ms", float, 10.0, "sleep: compute time per step", minimum=0, maximum=3_600_000),
        Knob("lstm_impl", str, "fused", "lstm: fused nn.LSTM or a step-by-step LSTMCell loop", LSTM_IMPLS),
        Knob("lstm_layers", int, 2, "lstm: layers", minimum=1, maximum=100),
        Knob("embedding_dim", int, 128, "lstm: embedding size", minimum=1, maximum=1_048_576),
        Knob("hidden_size", int, 128, "lstm: hidden units", minimum=1, maximum=1_048_576),
        Knob("lr", float, 0.01, "SGD learning rate", minimum=0),
        Knob("momentum", float, 0.0, "SGD momentum", minimum=0, maximum=1),
        Knob("amp", str, "off", "autocast dtype of forward", AMP),
        Knob("channels_last", bool, False, "channels-last memory format for image models"),
        # Measurement.
        Knob(
            "timing",
            str,
            "events",
            "events (CUDA events, no host sync) | sync (sync per phase) | naive (no sync)",
            TIMINGS,
        ),
        Knob("profile", bool, False, "write a torch.profiler Chrome trace of profile_steps extra steps"),
        Knob("profile_steps", int, 5, "steps traced when profile is on", minimum=1, maximum=10_000),
        Knob(
            "torch_threads",
            int,
            1,
            "intra-op CPU threads of the trainer (torch.set_num_threads), 1 as torchrun's ranks get; "
            "null: PyTorch's default",
            minimum=1,
            maximum=1024,
            nullable=True,
        ),
        Knob(
            "monitor_interval_s",
            float,
            0.5,
            "sampling period of the GPU/CPU/memory monitor",
            minimum=0.01,
            maximum=3600,
        ),
        Knob("transfer_sizes", list, DEFAULT_TRANSFER_SIZES, "transfer: bytes per copy"),
        # Added for the studies' own models and optimisers (docs/studies.md).
        Knob(
            "mlp_style",
            str,
            "relu",
            "mlp: relu (input Linear+ReLU, hidden Linear+ReLU) | "
            "ray (hidden_layers square Linear, no activation: Ray's benchmark)",
            MLP_STYLES,
        ),
        Knob("weight_decay", float, 0.0, "SGD weight decay", minimum=0),
        Knob(
            "profile_first_batch",
            bool,
            False,
            "loader: before the window, time next() + .to() of a fresh loader's "
            "first batch under torch.profiler, as the CIFAR-100 notebook did",
        ),
    ]
}

# Keys a cell may carry that only name it (set by the workflow, unused by the harness):
# where it belongs, whether it is its experiment's baseline (feedbench.matrix marks it),
# and which attempt at it this is (see workflow/rules/common.smk).
# `code` is the fingerprint of the user's python_path folders (feedbench.plugins.content_hash): it reruns their cells.
LABELS = ("experiment", "cell", "repeat", "baseline", "attempt", "code")


# Every knob's default, and the knobs whose default is a list or a mapping (copied for each caller).
_DEFAULTS = {name: k.default for name, k in KNOBS.items()}
_MUTABLE_DEFAULTS = tuple(name for name, default in _DEFAULTS.items() if isinstance(default, (list, dict)))


def defaults() -> dict[str, Any]:
    """Every knob at its default, in a new dict whose lists and mappings are copies.

    Built from a table made once: the workflow parses every cell of the matrix with it (feedbench.cell.parse_cell),
    and a dict of a hundred knobs rebuilt per cell cost a tenth of a second at 10,000 cells.
    """
    values = dict(_DEFAULTS)
    for name in _MUTABLE_DEFAULTS:
        values[name] = type(values[name])(values[name])
    return values


def markdown_table() -> str:
    """The knob reference as a Markdown table (docs/harness.md embeds it; a test keeps them equal)."""
    lines = ["| knob | default | allowed | meaning |", "|---|---|---|---|"]
    for k in KNOBS.values():
        default = (
            "null" if k.default is None else str(k.default).lower() if isinstance(k.default, bool) else str(k.default)
        )
        lines.append(f"| `{k.name}` | `{default}` | {k.allowed()} | {k.help.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
