"""The knobs of one cell, and the built-in datasets: every fact about each, declared once.

A knob's declaration says its type, default, bounds and help,
whether it takes user code, whether it needs loader workers, and which
ceilings keep it. Everything else is derived from it: the command line, the
validation of a cell, the documentation, the `Cell` type (feedbench.core.cell),
and the knobs each ceiling keeps
(feedbench.core.ceilings). So adding a knob is one declaration here plus the code
that reads it. Torch- and pandas-free: the Snakefile plans with it.
"""

from __future__ import annotations

import math
import re
import reprlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .model_names import model_error

# How much of a value an error message shows: a config may hold a list of a million levels.
_SHOWN = reprlib.Repr()
(
    _SHOWN.maxlevel,
    _SHOWN.maxdict,
    _SHOWN.maxlist,
    _SHOWN.maxstring,
    _SHOWN.maxother,
    _SHOWN.maxlong,
) = 3, 6, 6, 60, 60, 40


def shown(value: Any) -> str:
    """repr(value), bounded in length, for one-line error messages."""
    return _SHOWN.repr(value)


# `package.module:attribute`: a knob that takes user code (Knob.user_code) names it so (core.plugins
# imports it).
IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class KnobError(ValueError):
    """A bad knob value: the message is one line naming knob, value and choices."""


class ConfigError(ValueError):
    """A bad config: the message is one line naming the key path, the value and what is allowed."""


def key_path(*parts: Any) -> str:
    """A config key path as errors name it: `experiments.e.matrix[0]`."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


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
    # Also takes the user's code, named by an import path `package.module:attribute` (see
    # user_code).
    user_code: bool = False
    # Checks a value that is not user code where the names allowed are too many for `choices`
    # (model).
    names: Callable[[str], None] | None = None
    # Means nothing without loader workers: a cell with num_workers 0 resets it to its default
    # (core.fit.fit, which the harness's fit.resolve runs).
    needs_workers: bool = False
    # The ceilings whose cells keep this knob of the training cell they bound (core.ceilings):
    # loader (the loader alone), compute (data resident on the device), transfer (the probe timing a
    # real batch of the user's pipeline). A ceiling resets the knobs it does not keep to their
    # defaults, so cells that differ only there share it.
    ceilings: tuple[str, ...] = ("loader", "compute")
    # A stage what-if (harness.whatif runs it; analysis.predict predicts it from the baseline's
    # stage profile): what it does to a stage, in the words of the report's what-if table. No
    # ceiling keeps it: a what-if cell shares its baseline's ceilings.
    whatif: str | None = None
    # The stage what-if this knob only tunes (cache_limit_mb, cache_in: cache_after): a cell that
    # differs from another in it and the what-if alone has that cell as its what-if's baseline
    # (analysis.aggregate).
    tunes: str | None = None
    # (label, the value that is on): the verdict's recommendation says whether it pays for itself
    # where the experiment varies it (analysis.verdict.pays_off).
    pays_off: tuple[str, Any] | None = None
    # An axis `search` may walk (feedbench.core.search).
    searchable: bool = False
    # What a command cell (knob `command`: the user's own script, harness.command) does with it:
    # "loader", set on the script's DataLoader from outside (harness.inloop); "process", set in the
    # script's process; "stages", on the training loader's dataset; "run", how the command is run
    # and measured. None: the script decides it, and a command cell refuses it.
    in_command: str | None = None

    def allowed(self) -> str:
        if self.choices is not None:
            text = ", ".join(
                str(c).lower() if isinstance(c, bool) else str(c) for c in self.choices
            )
            return text + (" or package.module:attribute" if self.user_code else "")
        if self.user_code:
            named = "a name or " if self.names else ""
            return named + "package.module:attribute" + (" or null" if self.nullable else "")
        kind = {
            int: "an integer",
            float: "a number",
            bool: "true or false",
            str: "a string",
            dict: "a mapping",
        }.get(self.type if isinstance(self.type, type) else float, "a number")
        if self.type is list:
            kind = "a list"
        bounds = []
        if self.minimum is not None:
            bounds.append(f">= {_number(self.minimum)}")
        if self.maximum is not None:
            bounds.append(f"<= {_number(self.maximum)}")
        text = kind + (" " + " and ".join(bounds) if bounds else "")
        return text + (" or null" if self.nullable else "")

    def as_written(self, value: Any) -> Any:
        """A value as the config's author wrote it, where YAML read it otherwise: a boolean as the
        knob's word (YAML 1.1 reads `amp: off` as false, `on` as true), `none` as null for a stage
        what-if (`cache_after: [none, Normalize]`: no cache); the value itself otherwise."""
        if isinstance(value, bool) and self.type is str and self.choices:
            word = "on" if value else "off"
            return word if word in self.choices else value
        if self.whatif and self.nullable and isinstance(value, str) and value.lower() == "none":
            return None
        return value

    def check(self, value: Any) -> Any:
        """Return the value, normalised, or raise KnobError."""
        value = self.as_written(value)
        if value is None:
            if self.nullable:
                return None
            raise KnobError(
                f"knob '{self.name}': value null is not allowed; allowed: {self.allowed()}"
            )
        expected = self.type
        ok = isinstance(value, expected) and not (
            isinstance(value, bool) and expected in (int, float, (int, float))
        )
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > 2**1023:  # beyond any float
                raise KnobError(
                    f"knob '{self.name}': value {shown(value)} is out of range; "
                    f"allowed: {self.allowed()}"
                )
            value, ok = float(value), True
        if not ok:
            quote = (
                " (YAML reads on, off, yes and no as booleans: quote a word, 'on')"
                if isinstance(value, bool) and self.choices
                else ""
            )
            raise KnobError(
                f"knob '{self.name}': value {shown(value)} has the wrong type; "
                f"allowed: {self.allowed()}{quote}"
            )
        if self.user_code and user_code(self.name, value):
            return value
        if self.names is not None:
            self.names(value)
            return value
        if self.user_code and self.choices is None:
            raise KnobError(
                f"knob '{self.name}': value {shown(value)} is not an import path; allowed: "
                f"{self.allowed()}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise KnobError(
                f"knob '{self.name}': value {value!r} is not a finite number; "
                f"allowed: {self.allowed()}"
            )
        if self.choices is not None and value not in self.choices:
            raise KnobError(
                f"knob '{self.name}': value {shown(value)} is not allowed; "
                f"allowed: {self.allowed()}"
            )
        if (
            self.minimum is not None
            and value < self.minimum
            or self.maximum is not None
            and value > self.maximum
        ):
            raise KnobError(
                f"knob '{self.name}': value {shown(value)} is out of range; "
                f"allowed: {self.allowed()}"
            )
        return value


@dataclass(frozen=True)
class BuiltinDataset:
    """A built-in dataset (feedbench.harness.data.DATASETS builds it): what the workflow knows of it
    without torch."""

    name: str
    # What one sample is, for the bytes of a batch (core.ceilings.batch_bytes): "image" (3 x
    # image_size^2 floats), "model" (what the model takes: input_size floats for the mlp, else an
    # image) or "tokens" (of varying length).
    sample: str
    # How to make or get the folder it reads, when it needs a data_dir: the hint of the error
    # without one.
    data_dir_hint: str | None = None
    # Its samples are JPEG files decoded per sample: the knob `decoder` picks how.
    jpeg: bool = False
    # Its samples pass a torchvision Compose a map-style dataset holds (harness.stages.pipeline
    # finds it): the stage what-ifs (STAGE_WHATIFS) can cache after, skip or move its stages.
    staged: bool = False


_MAKE_SHARDS = "make one with: python -m feedbench make-shards IMAGES DIR"
BUILTIN_DATASETS: dict[str, BuiltinDataset] = {
    d.name: d
    for d in [
        BuiltinDataset("synthetic", "model"),
        BuiltinDataset("memory", "model"),
        BuiltinDataset(
            "images",
            "image",
            "make one with: python -m feedbench make-images DIR",
            jpeg=True,
            staged=True,
        ),
        BuiltinDataset("cifar10", "image", "or download: true", staged=True),
        BuiltinDataset("cifar100", "image", "or download: true", staged=True),
        BuiltinDataset("tokens", "tokens"),
        BuiltinDataset("webdataset", "image", _MAKE_SHARDS, jpeg=True),
        BuiltinDataset("parquet", "image", _MAKE_SHARDS, jpeg=True),
    ]
}
DATASETS = tuple(BUILTIN_DATASETS)
JPEG_DATASETS = tuple(name for name, d in BUILTIN_DATASETS.items() if d.jpeg)
SCENARIOS = ("train", "loader", "compute", "transfer")
TIMINGS = ("events", "sync", "naive")
GC_MODES = (
    "normal",
    "freeze",
    "disable",
    # not on/off: YAML reads those as booleans # the trainer's collector in the window
    # (harness.collector)
)
AMP = ("off", "bf16", "fp16")
# torch.set_float32_matmul_precision: highest keeps float32 matmuls on CUDA cores (PyTorch's
# default), high and medium let them use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32).
MATMUL_PRECISIONS = ("highest", "high", "medium")
# torch.optim's SGD, Adam, AdamW (harness.models.build_optimizer)
OPTIMIZERS = ("sgd", "adam", "adamw")
# A user model's loss without a step (harness.batches.default_loss): auto (the rule for a model that
# says nothing), or torch.nn.functional's loss of that name against the batch's target.
LOSSES = ("auto", "cross_entropy", "mse", "l1", "smooth_l1")
DEVICES = ("auto", "cpu", "cuda")
# torch.multiprocessing.set_sharing_strategy, set in the cell's process before its loader starts
# (harness.runner).
SHARING_STRATEGIES = ("file_descriptor", "file_system")
DEVICE_PREFETCH = ("none", "stream")
MP_CONTEXTS = ("fork", "spawn", "forkserver")
LSTM_IMPLS = ("fused", "cell")
PARALLEL = ("none", "dp", "ddp", "independent")
PAGE_CACHE = ("asis", "warm", "cold")
MLP_STYLES = ("relu", "ray")
DECODERS = ("pil", "torchvision", "torchvision-cuda")
CACHE_IN = ("memory", "file")
# The stages of the built-in images before their Compose: a cache may hold their output; they never
# move to the device.
IMAGE_STAGES = ("read", "decode")

# The ceilings of a knob that makes the batch: all of them, the probe timing a real batch of the
# user's included.
MAKES_BATCH = ("loader", "compute", "transfer")

# 64 KiB .. 256 MiB in powers of four: the sizes of the transfer probe.
DEFAULT_TRANSFER_SIZES = [64 * 1024 * 4**i for i in range(7)]


def _model_name(name: str) -> None:
    """A model a cell can train by name: feedbench.core.model_names knows them without torch."""
    error = model_error(name)
    if error:
        raise KnobError(error)


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in [
        # What runs.
        Knob(
            "scenario",
            str,
            "train",
            "train | loader (loader alone) | compute (data resident on the device) | transfer "
            "(H2D GB/s)",
            SCENARIOS,
            ceilings=(),  # each ceiling sets its own,
            in_command="run",
        ),
        Knob("device", str, "auto", "auto picks cuda when available", DEVICES, in_command="run"),
        Knob(
            "steps",
            int,
            50,
            "measured steps (ignored when epochs is set)",
            minimum=1,
            maximum=1_000_000,
            in_command="run",
        ),
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
            in_command="run",
        ),
        Knob(
            "seed",
            int,
            0,
            "seed of data generation, shuffling and model init",
            minimum=0,
            maximum=2**32 - 1,
        ),
        # Your own training command, run as it is (harness.command).
        Knob(
            "command",
            str,
            None,
            "your training command as you type it after `python`: a script and its arguments "
            "(train.py --max-steps 40) or -m package.module ...; run unmodified in workdir, its "
            "DataLoader given the cell's loader knobs from outside, its steps timed in its own "
            "loop (docs/own-pipeline.md)",
            nullable=True,
            in_command="run",
        ),
        Knob(
            "python",
            str,
            None,
            "command: the interpreter that runs it, a path or a name on PATH (null: the "
            "workflow's own); its environment needs torch",
            nullable=True,
            in_command="run",
        ),
        Knob(
            "workdir",
            str,
            None,
            "command: the folder it runs in, relative to the config file's folder (null: that "
            "folder)",
            nullable=True,
            in_command="run",
        ),
        Knob(
            "fidelity",
            bool,
            True,
            "command: its experiment's baseline, first repeat, runs the command plain (no "
            "instrument) and then instrumented, both to its own end, so the report can say how "
            "close the instrument stays to the job (false: skipped)",
            ceilings=(),
            in_command="run",
        ),
        # Data.
        Knob(
            "dataset",
            str,
            "synthetic",
            "where samples come from; user code: a class or factory called as f(**dataset_args), "
            "or f(ctx, **dataset_args) when its first parameter is ctx",
            DATASETS,
            user_code=True,
            ceilings=MAKES_BATCH,
        ),
        Knob(
            "dataset_args",
            dict,
            {},
            "keyword arguments of a user dataset factory (axis: dataset_args.<name>)",
            ceilings=MAKES_BATCH,
        ),
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
            "webdataset, parquet: the shard set data_dir/shards-<N> (python -m feedbench "
            "make-shards --shards N)",
            minimum=1,
            maximum=1_000_000,
        ),
        Knob("download", bool, False, "let torchvision download CIFAR into data_dir"),
        Knob(
            "num_samples",
            int,
            2048,
            "dataset length for synthetic, memory and tokens",
            minimum=1,
            maximum=100_000_000,
        ),
        Knob(
            "image_size", int, 224, "side of generated or cropped images", minimum=8, maximum=4096
        ),
        Knob(
            "input_size", int, 4096, "features per sample for the mlp", minimum=1, maximum=1_048_576
        ),
        Knob(
            "num_classes",
            int,
            1000,
            "classes of generated labels and classifiers",
            minimum=1,
            maximum=1_000_000,
        ),
        Knob(
            "page_cache",
            str,
            "asis",
            "files of images/cifar: asis | warm (read them all first: fully cached) | cold "
            "(evict them first: drop_caches as root, else posix_fadvise)",
            PAGE_CACHE,
            ceilings=("loader",),
        ),
        Knob(
            "sample_delay_ms",
            float,
            0.0,
            "extra cost per sample in __getitem__",
            minimum=0,
            maximum=60_000,
            ceilings=("loader",),
        ),
        Knob(
            "decoder",
            str,
            "pil",
            "JPEG decoder of images, webdataset, parquet: pil | torchvision "
            "(torchvision.io.decode_jpeg on the CPU) | torchvision-cuda (decode_jpeg of a batch "
            "on the GPU, in the training process)",
            DECODERS,
            ceilings=("loader",),
        ),
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
        Knob(
            "batch_size",
            int,
            64,
            "samples per step",
            minimum=1,
            maximum=1_048_576,
            ceilings=MAKES_BATCH,
        ),
        Knob(
            "num_workers",
            int,
            0,
            "DataLoader worker processes",
            minimum=0,
            maximum=256,
            ceilings=("loader",),
            searchable=True,
            in_command="loader",
        ),
        Knob(
            "pin_memory",
            bool,
            False,
            "DataLoader pins batches in page-locked memory",
            ceilings=("loader", "transfer"),
            pays_off=("pinning", True),
            in_command="loader",
        ),
        # The copy knobs: the loader alone never copies, and a compute ceiling's data is already on
        # the device.
        Knob("non_blocking", bool, False, "asynchronous host-to-device copies", ceilings=()),
        Knob(
            "prefetch_factor",
            int,
            None,
            "batches loaded ahead per worker (needs workers)",
            minimum=1,
            maximum=1024,
            nullable=True,
            needs_workers=True,
            ceilings=("loader",),
            in_command="loader",
        ),
        Knob(
            "persistent_workers",
            bool,
            False,
            "keep workers alive across epochs (needs workers)",
            needs_workers=True,
            ceilings=("loader",),
            in_command="loader",
        ),
        Knob(
            "stage_timing",
            bool,
            False,
            "time each sample's stages (read, decode, each Compose transform, feedbench.stage "
            "spans, collate) inside the loader; off by default: it cost up to 2 % of a cheap "
            "pipeline's throughput (docs/performance.md)",
            ceilings=("loader",),
            in_command="stages",
        ),
        Knob(
            "stage_functions",
            list,
            [],
            "functions of your code made stages by import path, as if decorated with "
            "@feedbench.stage, with no change to it: package.module:function or "
            "package.module:Class.method (the stage profile names them so); each stage is named "
            "by the function's qualified name (Class.method), which cache_after and skip_stages "
            "take",
            ceilings=("loader",),
            in_command="stages",
        ),
        Knob(
            "cache_after",
            str,
            None,
            "a stage what-if: the samples up to and including this stage of the dataset's "
            "Compose (or read, decode of images) computed once in a first pass, later samples "
            "run only the stages after it (pre-decoded data); or a @feedbench.stage function, "
            "its output kept per sample (not a `with` span)",
            nullable=True,
            ceilings=(),
            whatif="cached after it",
            in_command="stages",
        ),
        Knob(
            "cache_limit_mb",
            float,
            1024.0,
            "cache_after: the most the cache may hold; a larger one fails its cell",
            minimum=0,
            maximum=1_048_576,
            ceilings=(),
            tunes="cache_after",
            in_command="stages",
        ),
        Knob(
            "cache_in",
            str,
            "memory",
            "cache_after: memory (each worker's copy) | file (stage_cache.pt in the cell's "
            "results folder)",
            CACHE_IN,
            ceilings=(),
            tunes="cache_after",
            in_command="stages",
        ),
        Knob(
            "skip_stages",
            list,
            [],
            "a stage what-if, for measurement only (it changes the data): these stages of the "
            "dataset's Compose are dropped; a @feedbench.stage function of one argument returns "
            "it unchanged",
            ceilings=(),
            whatif="costs nothing",
            in_command="stages",
        ),
        Knob(
            "device_stages",
            str,
            None,
            "a stage what-if: from this stage of the dataset's Compose on, its torchvision v2 "
            "transforms run on the batch after the copy, in the training process (on its "
            "device); random ones then draw once per batch",
            nullable=True,
            ceilings=(),
            whatif="on the device",
        ),
        Knob(
            "multiprocessing_context",
            str,
            None,
            "how workers start (needs workers)",
            MP_CONTEXTS,
            nullable=True,
            needs_workers=True,
            ceilings=("loader",),
            in_command="loader",
        ),
        Knob(
            "sharing_strategy",
            str,
            "file_descriptor",
            "how workers pass batches in shared memory: file_descriptor (torch's default) | "
            "file_system (named files, for 'Too many open files'; same bytes in /dev/shm) (needs "
            "workers)",
            SHARING_STRATEGIES,
            needs_workers=True,
            ceilings=("loader",),
            in_command="process",
        ),
        Knob(
            "in_order",
            bool,
            True,
            "deliver batches in order (False lets fast workers go first)",
            needs_workers=True,
            ceilings=("loader",),
            in_command="loader",
        ),
        Knob("shuffle", bool, True, "shuffle the dataset every epoch", ceilings=("loader",)),
        Knob(
            "device_prefetch",
            str,
            "none",
            "none | stream: copy the next batches on a side stream",
            DEVICE_PREFETCH,
            ceilings=(),
            pays_off=("stream prefetch", "stream"),
        ),
        Knob(
            "prefetch_depth",
            int,
            1,
            "batches the stream prefetcher keeps in flight",
            minimum=1,
            maximum=64,
            ceilings=(),
        ),
        Knob(
            "resident_batches",
            int,
            8,
            "compute: real batches of the loader copied to the device once and replayed",
            minimum=1,
            maximum=1024,
            in_command="run",
        ),
        # Parallelism.
        Knob(
            "parallel",
            str,
            "none",
            "none | dp (nn.DataParallel) | ddp (DistributedDataParallel) | independent "
            "(replicas, no gradient exchange)",
            PARALLEL,
            in_command="run",
        ),
        Knob(
            "gpus_per_node",
            int,
            1,
            "GPUs per node (processes on gloo without GPUs); batch_size is per GPU",
            minimum=1,
            maximum=64,
            in_command="run",
        ),
        Knob(
            "nodes",
            int,
            1,
            "nodes (ddp, independent); emulated on localhost outside Slurm",
            minimum=1,
            maximum=4096,
            in_command="run",
        ),
        Knob(
            "comm_probe_steps",
            int,
            10,
            "ddp: steps with and without gradient sync after the window, for the communication "
            "share (0: off)",
            minimum=0,
            maximum=100_000,
            ceilings=(),  # a label of the measurement, not of the work
        ),
        # Model and step.
        Knob(
            "model",
            str,
            "mlp",
            "none, mlp, sleep, lstm, a torchvision classification model (resnet18, resnet50, "
            "...) or user code: package.module:attribute called as f(**model_args), or f(ctx, "
            "**model_args) when its first parameter is ctx",
            user_code=True,
            names=_model_name,
        ),
        Knob(
            "model_args",
            dict,
            {},
            "keyword arguments of a user model factory (axis: model_args.<name>)",
        ),
        Knob(
            "collate",
            str,
            None,
            "user collate_fn of the DataLoader",
            nullable=True,
            user_code=True,
            ceilings=MAKES_BATCH,
        ),
        Knob(
            "to_device",
            str,
            None,
            "user f(batch, device, non_blocking) moving a custom batch",
            nullable=True,
            user_code=True,
            ceilings=MAKES_BATCH,
        ),
        Knob(
            "step",
            str,
            None,
            "user f(model, batch, ctx) -> loss (None: it did backward and the optimizer itself)",
            nullable=True,
            user_code=True,
        ),
        Knob(
            "python_path",
            list,
            [],
            "folders put first on sys.path before user code is imported (the config's python_path)",
            ceilings=MAKES_BATCH,
            in_command="run",
        ),
        # The model's work per batch: a loader ceiling resets it (not `model`, whose kind shapes the
        # samples).
        Knob(
            "hidden_layers",
            int,
            1,
            "mlp: hidden Linear+ReLU layers",
            minimum=0,
            maximum=1000,
            ceilings=("compute",),
        ),
        Knob(
            "width",
            int,
            4096,
            "mlp: width of hidden layers",
            minimum=1,
            maximum=1_048_576,
            ceilings=("compute",),
        ),
        Knob(
            "compute_ms",
            float,
            10.0,
            "sleep: compute time per step",
            minimum=0,
            maximum=3_600_000,
            ceilings=("compute",),
        ),
        Knob(
            "lstm_impl",
            str,
            "fused",
            "lstm: fused nn.LSTM or a step-by-step LSTMCell loop",
            LSTM_IMPLS,
            ceilings=("compute",),
        ),
        Knob("lstm_layers", int, 2, "lstm: layers", minimum=1, maximum=100, ceilings=("compute",)),
        Knob(
            "embedding_dim",
            int,
            128,
            "lstm: embedding size",
            minimum=1,
            maximum=1_048_576,
            ceilings=("compute",),
        ),
        Knob(
            "hidden_size",
            int,
            128,
            "lstm: hidden units",
            minimum=1,
            maximum=1_048_576,
            ceilings=("compute",),
        ),
        Knob(
            "forward_keys",
            list,
            None,
            "a user model without a step: the keys of its dict batch passed to forward by name, "
            "model(**{key: batch[key]}); null: model(batch[0]) of a tuple, else model(batch)",
            nullable=True,
            ceilings=("compute",),
        ),
        Knob(
            "label_key",
            str,
            "label",
            "a user model without a step: the key of its dict batch that cross-entropy is taken "
            "against, where the model's output is not a loss of its own",
            ceilings=("compute",),
        ),
        Knob(
            "loss",
            str,
            "auto",
            "a user model without a step: its loss against batch[1] or batch[label_key]; auto: a "
            "scalar output or the output's own loss, else cross-entropy; cross_entropy, mse, l1, "
            "smooth_l1 (torch.nn.functional's), or user code: a function called as f(output, "
            "target), or a class (torch.nn:CrossEntropyLoss) built as cls(**loss_args), then "
            "called so",
            LOSSES,
            user_code=True,
            ceilings=("compute",),
        ),
        Knob(
            "loss_args",
            dict,
            {},
            "keyword arguments of a loss given as a class (label_smoothing, ...; axis: "
            "loss_args.<name>)",
            ceilings=("compute",),
        ),
        Knob(
            "optimizer",
            str,
            "sgd",
            "the step's optimizer: sgd, adam or adamw (torch.optim's, with lr, weight_decay, "
            "momentum for sgd, and optimizer_args), or user code called as f(params, "
            "**optimizer_args)",
            OPTIMIZERS,
            user_code=True,
            ceilings=("compute",),
        ),
        Knob(
            "optimizer_args",
            dict,
            {},
            "further keyword arguments of the optimizer (betas, eps, ...; axis: "
            "optimizer_args.<name>)",
            ceilings=("compute",),
        ),
        Knob(
            "lr",
            float,
            0.01,
            "learning rate of a built-in optimizer",
            minimum=0,
            ceilings=("compute",),
        ),
        Knob("momentum", float, 0.0, "SGD momentum", minimum=0, maximum=1, ceilings=("compute",)),
        Knob("amp", str, "off", "autocast dtype of forward", AMP, ceilings=("compute",)),
        Knob(
            "matmul_precision",
            str,
            "highest",
            "float32 matmuls: highest (PyTorch's default: CUDA cores) | high or medium (TF32 "
            "tensor cores where the GPU has them: torch.set_float32_matmul_precision, "
            "torch.backends.cuda.matmul.allow_tf32); convolutions use TF32 either way "
            "(torch.backends.cudnn.allow_tf32)",
            MATMUL_PRECISIONS,
            ceilings=("compute",),
        ),
        Knob(
            "channels_last",
            bool,
            False,
            "channels-last memory format for image models",
            ceilings=("compute",),
        ),
        # Measurement.
        Knob(
            "timing",
            str,
            "events",
            "events (CUDA events, no host sync) | sync (sync per phase) | naive (no sync)",
            TIMINGS,
            in_command="run",
        ),
        Knob(
            "gc",
            str,
            "freeze",
            "Python's garbage collector in the trainer during the window, its pauses recorded: "
            "freeze (the heap frozen before the warm-up: the start-up heap is never scanned "
            "again, the step's garbage still is; docs/performance.md) | normal (as a fresh "
            "process runs) | disable (as freeze, and off from the window's start until it "
            "closes, as timeit does)",
            GC_MODES,
            in_command="process",
        ),
        # Labels of the measurement, not of the work: no ceiling depends on them.
        Knob(
            "profile",
            bool,
            False,
            "write a torch.profiler Chrome trace of profile_steps extra steps",
            ceilings=(),
        ),
        Knob(
            "profile_steps",
            int,
            5,
            "steps traced when profile is on",
            minimum=1,
            maximum=10_000,
            ceilings=(),
        ),
        Knob(
            "torch_threads",
            int,
            None,
            "intra-op CPU threads of the trainer (torch.set_num_threads); null: as the launch "
            "gives them, PyTorch's default or OMP_NUM_THREADS in one process, 1 per rank of "
            "several a node as torchrun sets",
            minimum=1,
            maximum=1024,
            nullable=True,
            in_command="process",
        ),
        Knob(
            "monitor_interval_s",
            float,
            0.5,
            "sampling period of the GPU/CPU/memory monitor",
            minimum=0.01,
            maximum=3600,
            ceilings=(),
            in_command="run",
        ),
        Knob(
            "transfer_sizes", list, DEFAULT_TRANSFER_SIZES, "transfer: bytes per copy", ceilings=()
        ),
        # Added for the studies' own models and optimisers (docs/studies.md).
        Knob(
            "mlp_style",
            str,
            "relu",
            "mlp: relu (input Linear+ReLU, hidden Linear+ReLU) | "
            "ray (hidden_layers square Linear, no activation: Ray's benchmark)",
            MLP_STYLES,
        ),
        Knob("weight_decay", float, 0.0, "weight decay of a built-in optimizer", minimum=0),
        Knob(
            "profile_first_batch",
            bool,
            False,
            "loader: before the window, time next() + .to() of a fresh loader's "
            "first batch under torch.profiler, as the CIFAR-100 notebook did",
        ),
    ]
}


# Lists of knobs, each derived from a field of their declarations (tests/core/test_knob_spec.py: no
# such list elsewhere). The knobs that change a cell's loader stages to run a stage what-if
# (Knob.whatif).
STAGE_WHATIFS = tuple(name for name, k in KNOBS.items() if k.whatif)
# A stage what-if's knobs and those that only tune one (Knob.tunes): the cell without them is its
# baseline.
WHATIF_ONLY = (*STAGE_WHATIFS, *(name for name, k in KNOBS.items() if k.tunes in STAGE_WHATIFS))
# Axes a search may walk (Knob.searchable).
SEARCHABLE = tuple(name for name, k in KNOBS.items() if k.searchable)
# (knob, label, its value "on" as text) of the knobs whose gain the recommendation reports
# (Knob.pays_off).
PAYS_OFF = tuple(
    (name, k.pays_off[0], str(k.pays_off[1]).lower()) for name, k in KNOBS.items() if k.pays_off
)


# A command cell's knobs (Knob.in_command): those it sets on the script's DataLoader, and all it
# takes.
COMMAND_LOADER = tuple(name for name, k in KNOBS.items() if k.in_command == "loader")
COMMAND_KNOBS = tuple(name for name, k in KNOBS.items() if k.in_command)


def user_code(knob: str, value: Any) -> bool:
    """Whether knob `knob` set to `value` names the user's code: the one rule for it, wherever it is
    asked.

    True for an import path `package.module:attribute` given to a knob that takes user code
    (Knob.user_code).
    """
    return (
        KNOBS[knob].user_code
        and isinstance(value, str)
        and IMPORT_PATH.fullmatch(value) is not None
    )


def user_code_of(knobs: Mapping[str, Any]) -> dict[str, str]:
    """knob -> import path, for the knobs of a mapping (a cell's, a summary row's) that name user
    code."""
    return {
        name: value for name, value in knobs.items() if name in KNOBS and user_code(name, value)
    }


def user_batch(knobs: Mapping[str, Any]) -> bool:
    """Whether a cell's batch is the user's: a knob that makes the batch (one the transfer probe
    keeps: dataset, collate, to_device) names user code, or the cell runs the user's command. Its
    copy is timed on a real batch: ceilings.batch_bytes cannot size it."""
    return bool(knobs.get("command")) or any(
        "transfer" in KNOBS[name].ceilings for name in user_code_of(knobs)
    )


def dropped_by(ceiling: str) -> tuple[str, ...]:
    """The knobs a `ceiling` (loader, compute, transfer) resets to their defaults: those it does not
    keep."""
    return tuple(name for name, knob in KNOBS.items() if ceiling not in knob.ceilings)


def kept_by(ceiling: str) -> tuple[str, ...]:
    """The knobs a `ceiling` keeps from the training cell it bounds."""
    return tuple(name for name, knob in KNOBS.items() if ceiling in knob.ceilings)


# Keys a cell may carry that only name it (set by the workflow, unused by the harness): where it
# belongs, whether it is its experiment's baseline (feedbench.plan.matrix marks it), and which
# attempt at it this is (see workflow/rules/common.smk). `code` is the fingerprint of the user's
# python_path folders (core.plugins.content_hash): it reruns their cells.
LABELS = ("experiment", "cell", "repeat", "baseline", "attempt", "code")


# Every knob's default, and the knobs whose default is a list or a mapping (copied for each caller).
_DEFAULTS = {name: k.default for name, k in KNOBS.items()}
_MUTABLE_DEFAULTS = tuple(
    name for name, default in _DEFAULTS.items() if isinstance(default, (list, dict))
)


def defaults() -> dict[str, Any]:
    """Every knob at its default, in a new dict whose lists and mappings are copies.

    Built from a table made once: the workflow parses every cell of the matrix with it
    (feedbench.core.cell.parse_cell), and a dict of a hundred knobs rebuilt per cell cost a tenth of
    a second at 10,000 cells.
    """
    values = dict(_DEFAULTS)
    for name in _MUTABLE_DEFAULTS:
        values[name] = type(values[name])(values[name])
    return values


def markdown_table() -> str:
    """The knob reference as a Markdown table (docs/knobs.md embeds it; a test keeps them equal)."""
    lines = ["| knob | default | allowed | meaning |", "|---|---|---|---|"]
    for k in KNOBS.values():
        default = (
            "null"
            if k.default is None
            else str(k.default).lower()
            if isinstance(k.default, bool)
            else str(k.default)
        )
        lines.append(f"| `{k.name}` | `{default}` | {k.allowed()} | {k.help.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
