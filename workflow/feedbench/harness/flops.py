"""A training step's work counted on the CPU, without running it: FLOPs, bytes and kernel launches.

The model is built on PyTorch's meta device (shapes, no data), so ResNet-50 at batch 32 counts in
about a second and needs no memory. FLOPs: torch.utils.flop_counter.FlopCounterMode (matmuls and
convolutions, forward and backward). Bytes: every tensor an operator writes (views write nothing),
counted twice (written, then read once), plus the parameters' traffic of a step (PARAMETER_PASSES).
feedbench.core.target's roofline turns both into time.

Kernels: the operators dispatched below autograd (TorchDispatchMode) in forward, loss and backward,
and in one steady-state step of the cell's SGD (the second; the first also creates the momentum
buffers), counted one launch each. Left out: views (no kernel: they share their input's storage) and
allocations (empty, empty_strided: no kernel). What the count does not see: an operator that
launches several kernels (cuDNN's convolution backward, a foreach optimizer operator over many
tensors) or none (a CPU-side op), autocast's cast kernels and the GradScaler of `amp` (its bytes are
counted: _Dispatched), and the copy of the batch. A fused nn.LSTM runs PyTorch's step-by-step
fallback on the meta device, so it counts as many launches as the LSTMCell loop (748 and 778 for 2
layers over 10 tokens), where cuDNN launches far fewer: an overcount for it. The SGD step is counted
with foreach=True, what PyTorch picks for CUDA tensors (on the meta device its default would loop
over the parameters). core.estimate.compute_seconds turns the count into the host's time for the
step (core.estimate.HOST_SECONDS a kernel), its floor.

Operations: each kernel's class (op_class: matmul, convolution, recurrent, normalisation,
elementwise), its FLOPs (what FlopCounterMode, the mode below, added over it) and the bytes it
wrote, merged by kind (StepCount.ops): what core.kernels prices, each at what the GPU achieves for
its class in its math path, or at the memory's achieved bandwidth. count_module counts any module a
caller builds the same way (benchmarks/prediction_error.py's BERT-large).

The user's own model (`model: package.module:attribute`) is counted the same way on a real batch:
one batch drawn here on the CPU from the cell's own dataset and collate (drawn_batch), moved to the
meta device, the model built there by its factory, and the step the loop runs for it (the user's
step, else call_model and default_loss) run under the counters. A model that cannot be built or
stepped there (weights loaded from a file, a `.item()` in its forward) gets one line saying so, and
the target's `compute: measured` instead. The copy of such a cell is priced from that batch's bytes
(docs/target.md, "The copy").
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.module_tracker import ModuleTracker

from ..core.ceilings import batch_bytes, ceiling_knobs
from ..core.cell import parse_cell
from ..core.estimate import (
    HOST_SECONDS,
    MEASURE_OVER,
    Prediction,
    beside_published,
    compute_range,
    compute_seconds,
    fit_efficiencies,
    host_bound,
    host_seconds,
    leave_one_study_out,
    published_cells,
    summarize,
)
from ..core.kernels import kernel_seconds
from ..core.knobs import KNOBS, user_batch, user_code
from ..core.model_names import input_kind, model_family
from ..core.plugins import resolve_all
from ..core.result import atomic_write, results_by_cell
from ..core.target import (
    Gpu,
    Target,
    compute_side,
    copy_gb_per_s,
    copy_seconds,
    dtype,
    gpu_table,
    measured_compute,
    pinned,
    read_target,
    roofline_seconds,
)
from . import batches
from .cpu_speed import target_speed
from .loop import context, first_batches
from .models import BUILT_IN_OPTIMIZERS, build_loss, build_model, build_optimizer, loss_function

# Reads and writes of each parameter element in a step with SGD and momentum: read in forward, read
# in backward, its gradient written; then the optimizer reads weight, gradient and momentum and
# writes weight and momentum.
PARAMETER_PASSES = 8
# An activation is written once and read at least once.
ACTIVATION_PASSES = 2


# Where a step feedbench cannot count goes instead: its compute measured on the target's GPU
# (docs/target.md).
MEASURED_THERE = "the compute measured on the target's GPU: target: {compute: measured}"

# Operators that allocate and launch no kernel.
ALLOCATIONS = frozenset(
    {"aten.empty.memory_format", "aten.empty_strided.default", "aten.new_empty.default"}
)


@dataclass(frozen=True)
class StepCount:
    flops: float  # forward + loss + backward
    bytes: float  # activations and parameters moved through GPU memory, a lower bound
    parameters: int
    family: str | None
    # operators launched: forward, loss, backward and the SGD step (module docstring)
    kernels: int = 0
    memory_bytes: float = 0.0  # held on the GPU at the step's peak, a lower bound: resident_bytes
    # Each distinct operation of forward, loss and backward as (class, FLOPs, bytes moved, how
    # many), and the parameters' traffic as one elementwise entry: what core.estimate's
    # per-operation estimate sums (op_class).
    ops: tuple = ()


# The operation classes of the per-operation estimate (core.kernels.OP_CLASSES), by the aten
# operator's name; any other kernel is elementwise. Every operation inside a fused RNN layer
# (nn.LSTM, nn.GRU, nn.RNN: cuDNN's one kernel per layer on a GPU, what DeepBench's RNN benchmark
# times) is recurrent; an LSTMCell loop is its matmuls and pointwise operations, each its own
# kernel.
MATMUL_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "addr", "mv", "matmul",
     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention"}
)  # fmt: skip
CONVOLUTION_OPS = frozenset(
    {"convolution", "_convolution", "convolution_backward", "cudnn_convolution"}
)
NORMALISATION_OPS = frozenset(
    {"native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
     "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training", "cudnn_batch_norm",  # noqa: E501
     "cudnn_batch_norm_backward", "batch_norm_backward",
     "native_layer_norm", "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward"}  # noqa: E501
)  # fmt: skip


def op_class(name: str, in_recurrent: bool) -> str:
    """The class of an aten operator (its overload packet's name) for the per-operation estimate."""
    if in_recurrent:
        return "recurrent"
    if name in MATMUL_OPS:
        return "matmul"
    if name in CONVOLUTION_OPS:
        return "convolution"
    return "normalisation" if name in NORMALISATION_OPS else "elementwise"


def _recurrent_names(model) -> frozenset[str]:
    """The names torch.utils.module_tracker.ModuleTracker gives the model's fused RNN layers (its
    class name, then the attribute path)."""
    top = type(model).__name__
    return frozenset(
        f"{top}.{name}" for name, m in model.named_modules() if isinstance(m, torch.nn.RNNBase)
    )


# Autocast on CUDA (torch.amp's documented op lists, "CUDA Ops that can autocast to float16" and "to
# float32"), by the aten operator's name as the dispatcher sees it (linear and matmul arrive as mm,
# addmm, bmm; an LSTM cell as its matmuls and pointwise ops). Autocast itself cannot run here: it is
# off without CUDA and never sees a meta tensor.
AUTOCAST_LOW = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "addr", "mv", "matmul", "convolution", "_convolution",  # noqa: E501
     "convolution_backward", "cudnn_convolution", "conv1d", "conv2d", "conv3d", "prelu",
     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention"}
)  # fmt: skip
AUTOCAST_FP32 = frozenset(
    {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "nll_loss_forward",  # noqa: E501
     "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "mse_loss", "mse_loss_backward",  # noqa: E501
     "binary_cross_entropy_with_logits", "native_layer_norm", "native_layer_norm_backward", "native_group_norm",  # noqa: E501
     "native_group_norm_backward", "sum", "prod", "cumsum", "exp", "log", "pow", "rsqrt", "reciprocal", "norm",  # noqa: E501
     "logsumexp", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div"}
)  # fmt: skip


class _Dispatched(TorchDispatchMode):
    """Counts the kernels the dispatched operators launch and sums the bytes of every tensor they
    return; views are left out of both (they share their input's storage), allocations out of the
    kernels.

    Under `amp` (fp16 or bf16) the bytes are those autocast's step writes: AUTOCAST_LOW's operators
    write their outputs in 2-byte floats (and a 2-byte copy of each parameter they take, once a
    step: autocast caches the casts of leaf weights), AUTOCAST_FP32's in 4, and any other floating
    operator in the widest dtype of its activations' inputs (a parameter's dtype does not widen it:
    a batch norm's fp32 weights leave its fp16 input fp16)."""

    def __init__(
        self,
        amp: str = "off",
        parameters=(),
        flops: FlopCounterMode | None = None,
        recurrent=frozenset(),
    ):
        super().__init__()
        self.bytes = 0
        self.kernels = 0
        # the counter below this mode, whose growth over an operator is that operator's FLOPs
        self.flops = flops
        self.recurrent = recurrent  # the fused RNN layers' names (_recurrent_names)
        self.tracker = ModuleTracker()
        # (class, FLOPs, bytes written) -> how many
        self.ops: dict[tuple[str, float, float], int] = {}
        self.amp = amp != "off"
        self.low: set[int] = set()  # storages written in 2-byte floats
        self.parameters = {p.untyped_storage()._cdata for p in parameters}
        self.cast: set[int] = set()  # parameters autocast has cast this step

    def __enter__(self):
        self.tracker.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        return self.tracker.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.flops.get_total_flops() if self.flops is not None else 0
        out = func(*args, **(kwargs or {}))
        # the profiler's record_function markers are no kernels
        if func.is_view or func.namespace != "aten":
            return out
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        name = func.overloadpacket.__name__
        if self.amp:
            written = self._autocast(name, tree_leaves((args, kwargs)), outputs)
        else:
            written = sum(t.numel() * t.element_size() for t in outputs)
        self.bytes += written
        if str(func) not in ALLOCATIONS:
            self.kernels += 1
            flops = self.flops.get_total_flops() - before if self.flops is not None else 0
            key = (
                op_class(name, bool(self.recurrent & self.tracker.parents)),
                float(flops),
                float(written),
            )
            self.ops[key] = self.ops.get(key, 0) + 1
        return out

    def operations(self, parameters: int) -> tuple:
        """StepCount.ops: each distinct operation with its bytes moved (ACTIVATION_PASSES), and the
        parameters' traffic (PARAMETER_PASSES) as one elementwise entry."""
        ops = [(c, f, ACTIVATION_PASSES * b, n) for (c, f, b), n in sorted(self.ops.items())]
        return (*ops, ("elementwise", 0.0, float(PARAMETER_PASSES * 4 * parameters), 1))

    def _autocast(self, name: str, inputs: list, outputs: list) -> int:
        """The bytes an operator writes under autocast (class docstring); its outputs' storages
        marked low or not."""
        floats = [
            t
            for t in inputs
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() > 0
        ]
        activations = [t for t in floats if t.untyped_storage()._cdata not in self.parameters]
        if name in AUTOCAST_LOW:
            low, cast = True, [t for t in floats if t.untyped_storage()._cdata in self.parameters]
        else:
            low, cast = name not in AUTOCAST_FP32 and bool(activations), []
            low = low and all(t.untyped_storage()._cdata in self.low for t in activations)
        written = 0
        for weight in cast:
            if weight.untyped_storage()._cdata not in self.cast:
                self.cast.add(weight.untyped_storage()._cdata)
                written += 2 * weight.numel()
        for t in outputs:
            key = t.untyped_storage()._cdata
            if low and t.is_floating_point():
                self.low.add(key)
                written += 2 * t.numel()
            else:
                self.low.discard(key)
                written += t.numel() * t.element_size()
        return written


class _Saved:
    """The activations autograd keeps for backward (saved_tensors_hooks): the bytes of each distinct
    storage saved, once however many views of it are saved, the parameters' own left out (they are
    counted as parameters)."""

    def __init__(self, model):
        self.parameters = {p.untyped_storage()._cdata for p in model.parameters()}
        self.storages: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in self.parameters:
            self.storages[storage._cdata] = storage.nbytes()
        return tensor

    def __enter__(self):
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self.hooks.__exit__(*exc)


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def resident_bytes(model, optimizer, saved: _Saved, low: set[int] = frozenset()) -> float:
    """What a training step holds on its GPU at least, at the end of its forward: the parameters,
    their gradients, the optimizer's state (momentum, Adam's moments: counted after its steps) and
    the activations saved for backward. A lower bound: the allocator's rounding, cuDNN's workspaces,
    temporaries and the CUDA context come on top. `low`: the storages autocast writes in 2-byte
    floats (_Dispatched.low), counted so."""
    parameters = list(model.parameters())
    gradients = [p for p in parameters if p.requires_grad]
    state = [t for entry in optimizer.state.values() for t in entry.values()]
    held = _tensor_bytes(parameters) + _tensor_bytes(gradients) + _tensor_bytes(state)
    return float(held + sum(n // 2 if key in low else n for key, n in saved.storages.items()))


def _batch(cell) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the cell's shape on the meta device: inputs and targets as the model's loss takes
    them."""
    meta, size = torch.device("meta"), cell.batch_size
    kind = input_kind(cell.model)
    if kind == "tokens":
        tokens = torch.zeros(size, cell.seq_len, dtype=torch.long, device=meta)
        return tokens, tokens
    if kind == "vector":
        return torch.empty(size, cell.input_size, device=meta), torch.empty(size, 1, device=meta)
    images = torch.empty(size, 3, cell.image_size, cell.image_size, device=meta)
    return images, torch.zeros(size, dtype=torch.long, device=meta)


def count_step(knobs: dict, batch=None) -> StepCount:
    """FLOPs and bytes of one training step of a cell's model at its batch: feedbench's own and
    torchvision's models on a batch of the cell's shape, the user's own model on `batch` (by default
    one drawn from the cell's pipeline: drawn_batch). ValueError in one line for none and sleep,
    whose work is not theirs to count here, and for a user's model that cannot be counted on the
    meta device."""
    cell = parse_cell({k: v for k, v in knobs.items() if k != "scenario"})
    if user_code("model", cell.model):
        return _count_user(cell, drawn_batch(cell) if batch is None else batch)
    if model_family(cell.model) is None:
        raise ValueError(
            f"model {cell.model!r}: no compute estimate (its FLOPs are not counted here); "
            "allowed: feedbench's mlp, lstm or torchvision's, a model of your own "
            f"(package.module:attribute), or {MEASURED_THERE}"
        )
    return _count(cell)


def drawn_batch(cell):
    """One batch of the cell's own pipeline, drawn here on the CPU: its dataset and collate as the
    loop builds them (harness.loop.first_batches), in this process (no workers) and unpinned."""
    cell = dataclasses.replace(cell, device="cpu", num_workers=0, pin_memory=False)
    return first_batches(cell, torch.device("cpu"), resolve_all(cell))(False)


def _count_user(cell, batch) -> StepCount:
    """count_step's count of the user's model: built on the meta device by its factory, `batch`
    moved there, the step the loop runs for it (harness.loop.TrainStep.loss: the user's step, else
    call_model and default_loss) run under the counters, then backward. ValueError in one line,
    naming what failed there and the way around it."""
    meta, user = torch.device("meta"), resolve_all(cell)
    ctx = context(cell, meta)
    with meta:
        try:
            model = build_model(cell, user, ctx)
        except Exception as error:  # the user's constructor: whatever it raises means the same here
            raise ValueError(
                _not_counted(cell.model, "it cannot be built on the meta device", error)
            ) from None
        on_meta = batches.move_batch(batch, meta, False)
        flops = FlopCounterMode(display=False)
        step = _Dispatched(
            cell.amp, [*model.parameters(), *model.buffers()], flops, _recurrent_names(model)
        )
        try:
            ctx.optimizer = build_optimizer(cell, model.parameters(), user)
            with flops, step, _Saved(model) as saved:
                if "step" in user:
                    loss = user["step"](model, on_meta, ctx)
                else:
                    output = batches.call_model(model, on_meta, cell.forward_keys)
                    loss = batches.default_loss(
                        output, on_meta, cell.label_key, cell.loss, build_loss(cell, user, meta)
                    )[0]
                # None: the user's step ran backward (and its optimizer) itself
                if loss is not None:
                    loss.backward()
            # None: the user's step ran its optimizer, counted above
            kernels, optimizer = (
                _optimizer_step(model, cell) if loss is not None else (0, ctx.optimizer)
            )
        except Exception as error:  # the user's forward and step
            raise ValueError(
                _not_counted(cell.model, "its step fails on the meta device", error)
            ) from None
    parameters = sum(p.numel() for p in model.parameters())
    moved = ACTIVATION_PASSES * step.bytes + PARAMETER_PASSES * 4 * parameters
    memory = resident_bytes(model, optimizer, saved, step.low)
    return StepCount(
        float(flops.get_total_flops()), float(moved), parameters, None, step.kernels + kernels, memory,  # noqa: E501
        step.operations(parameters),
    )  # fmt: skip


def _not_counted(model: str, what: str, error: BaseException) -> str:
    """The one line of a user's model that cannot be counted here: what failed, the error's type and
    first line."""
    return (
        f"model {model!r}: no compute estimate: {what} ({_reason(error)}); allowed: a model "
        f"whose factory and step run on PyTorch's meta device, or {MEASURED_THERE}"
    )


def _reason(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _count(cell) -> StepCount:
    """count_step's count: the cell's model built on the meta device, one step run under the
    counters."""
    return count_module(
        cell,
        lambda: build_model(cell),
        _batch(cell),
        loss_function(cell.model),
        model_family(cell.model),
    )


def count_module(cell, build, batch: tuple, loss, family: str | None) -> StepCount:
    """One training step of the model `build()` makes on the meta device, on `batch` (inputs,
    targets, on the meta device) with `loss(output, batch)`, under the counters, then a step of the
    cell's optimizer: count_step's count of feedbench's own models, and of any module a caller
    builds (benchmarks/prediction_error.py's BERT), of the model family `family`."""
    with torch.device("meta"):
        model = build()
    flops = FlopCounterMode(display=False)
    step = _Dispatched(
        cell.amp, [*model.parameters(), *model.buffers()], flops, _recurrent_names(model)
    )
    with flops, step, _Saved(model) as saved:
        loss(model(batch[0]), batch).backward()
    parameters = sum(p.numel() for p in model.parameters())
    moved = ACTIVATION_PASSES * step.bytes + PARAMETER_PASSES * 4 * parameters
    kernels, optimizer = _optimizer_step(model, cell)
    memory = resident_bytes(model, optimizer, saved, step.low)
    return StepCount(
        float(flops.get_total_flops()), float(moved), parameters, family, step.kernels + kernels, memory,  # noqa: E501
        step.operations(parameters),
    )  # fmt: skip


def _optimizer_step(model, cell) -> tuple[int, torch.optim.Optimizer]:
    """Kernels of a steady-state step of the cell's optimizer (harness.models.build_optimizer, as
    the loop builds it), a built-in one with foreach as on CUDA: the second step is counted, the
    first creates its state (momentum buffers, Adam's moments). Its bytes are PARAMETER_PASSES'
    (SGD's: Adam's moments move more). With the optimizer, whose state then is what a step holds
    (resident_bytes)."""
    # the user's own optimizer
    user = resolve_all(cell) if cell.optimizer not in BUILT_IN_OPTIMIZERS else None
    optimizer = build_optimizer(cell, model.parameters(), user, foreach=True)
    optimizer.step()
    counted = _Dispatched()
    with counted:
        optimizer.step()
    return counted.kernels, optimizer


@lru_cache(maxsize=64)
def _counted(key: str) -> StepCount:
    return count_step(json.loads(key))


# The count of every published cell (core.estimate.published_cells), as count_step gives it: every
# run with a `target:` fits its efficiencies to them, and counting the nmt study's LSTMs on the meta
# device takes about 10 s of CPU. tests/core/test_estimate.py counts them afresh and holds this file
# to it; benchmarks/prediction_error.py --write-counts rewrites it.
PUBLISHED_COUNTS = os.path.join(os.path.dirname(__file__), "published_counts.json")


def _knobs_key(knobs: dict) -> str:
    return json.dumps(knobs, sort_keys=True)


@lru_cache(maxsize=1)
def stored_counts() -> dict[str, StepCount]:
    """PUBLISHED_COUNTS by each cell's knobs (as JSON, keys sorted)."""
    with open(PUBLISHED_COUNTS, encoding="utf-8") as f:
        stored = json.load(f)
    return {
        key: StepCount(**{**fields, "ops": tuple(tuple(op) for op in fields["ops"])})
        for key, fields in stored.items()
    }


def checkout_cells(root: str) -> list:
    """core.estimate.published_cells of the checkout at `root` (its config/presets/ and
    report/references/)."""
    return published_cells(
        os.path.join(root, "config", "presets"), os.path.join(root, "report", "references")
    )


def write_published_counts(root: str, path: str = PUBLISHED_COUNTS) -> dict[str, StepCount]:
    """Count every published cell afresh and write them to `path`; the counts, by knobs."""
    # a distinct count per distinct knobs: many published rows share them
    keys = {_knobs_key(cell.knobs) for cell in checkout_cells(root)}
    counts = {key: count_step(json.loads(key)) for key in keys}
    counts = dict(sorted(counts.items()))
    text = json.dumps({k: dataclasses.asdict(c) for k, c in counts.items()}, indent=1)
    atomic_write(path, text + "\n")
    return counts


def count_once(knobs: dict) -> StepCount:
    """count_step, each distinct set of knobs counted once per process, and a published cell's read
    from PUBLISHED_COUNTS (an LSTM of the nmt study takes seconds)."""
    key = _knobs_key(knobs)
    return stored_counts().get(key) or _counted(key)


def published_error(root: str, per_op: bool = False) -> tuple[list[Prediction], dict[str, float]]:
    """The compute estimate against every published GPU throughput, leave one study out, and the
    efficiencies fitted to all studies (what a target's prediction uses):
    docs/results/prediction-error.md. `root`: the checkout, whose config/presets/ and
    report/references/ are read. `per_op`: the per-operation estimate (core.estimate)."""
    cells = checkout_cells(root)
    return leave_one_study_out(cells, count_once, per_op), fit_efficiencies(cells, count_once)


@lru_cache(maxsize=16)
def _own_batch(key: str):
    """drawn_batch of a cell, by its compute ceiling's knobs as JSON (the model and the batch it
    steps): drawn once per process for the cells that differ only in how the loader delivers it
    (workers, pinning)."""
    return drawn_batch(parse_cell({k: v for k, v in json.loads(key).items() if k != "scenario"}))


def _work(knobs: dict) -> tuple[StepCount | None, str | None, int | None, str]:
    """(the counted step or None, why not, the bytes of one batch, where they come from) of a
    training cell. Where the model or the batch is the user's, a batch drawn from its own pipeline
    gives the bytes (`drawn`) and the user's model its input; else the knobs' batch does (`knobs`:
    core.ceilings.batch_bytes, what feedbench's datasets make)."""
    own_model, batch, size, source = (
        user_code("model", knobs.get("model")),
        None,
        batch_bytes(knobs),
        "knobs",
    )
    if own_model or user_batch(knobs):
        try:
            batch = _own_batch(json.dumps(ceiling_knobs(knobs, "compute"), sort_keys=True))
            size, source = batches.batch_bytes(batch), "drawn"
        # the user's dataset and collate: whatever they raise means the same here
        except Exception as error:
            why = "no batch could be drawn from its pipeline"
            size, source = None, f"unknown: {why} ({_reason(error)})"
            if own_model:
                return None, _not_counted(knobs["model"], why, error), size, source
    try:
        return (count_step(knobs, batch) if own_model else count_once(knobs)), None, size, source
    except ValueError as error:
        return None, str(error), size, source


def too_big(knobs: dict, work: StepCount, gpu: Gpu) -> str | None:
    """Why a cell's counted step plainly does not fit the GPU's memory (its resident_bytes, a lower
    bound, over the table's memory_gb), in a few words naming what to change; None where it may
    fit."""
    if work.memory_bytes <= gpu.memory_gb * 1e9:
        return None
    fits = [
        name
        for name, row in gpu_table().items()
        if (row.get("memory_gb") or 0) * 1e9 >= work.memory_bytes
    ]
    return (
        f"holds at least {work.memory_bytes / 1e9:.1f} GB on the GPU (parameters, gradients, "
        "optimizer state and the activations saved for backward, counted on the meta device at "
        f"batch_size {knobs.get('batch_size')}), more than the {gpu.memory_gb:g} GB of "
        f"target.gpu {gpu.name}; allowed: a smaller batch_size or model, or a GPU with more "
        f"memory ({', '.join(fits) or 'none in the table'})"
    )


def memory_error(spec: dict, cells: dict[str, dict]) -> str | None:
    """The plan's one line for the first training cell (`<experiment>/<cell>` -> knobs) that plainly
    does not fit the target's GPU memory (too_big), or None. Each model and batch is counted once
    (its compute ceiling's knobs); a model feedbench cannot count here is passed over (the section
    "On <target>" says why it has no estimate)."""
    gpu = read_target(spec).gpu
    for key, knobs in cells.items():
        try:
            work = count_once(ceiling_knobs(knobs, "compute"))
        except ValueError:
            continue
        why = too_big(knobs, work, gpu)
        if why:
            experiment, cell = key.split("/", 1)
            return f"bad config: experiments.{experiment}: cell '{cell}' {why}"
    return None


def estimate_cell(knobs: dict, target: Target) -> dict:
    """One training cell on the target (an entry of results/target.json's cells): its counted step
    (_work), the estimated compute seconds (core.estimate.compute_seconds: each operation at the
    GPU's public kernel figures, core.kernels; the host's time when longer), their split per
    operation class, the host's time and whether the cell is host-bound, the share of the roofline
    the estimate comes to; the copy's seconds over the target's link for its batch's bytes and where
    they come from; `error` instead of the compute for a model whose work is not counted."""
    work, error, size, source = _work(knobs)
    copy = {
        "batch_size": int(knobs.get("batch_size", KNOBS["batch_size"].default)),
        "num_workers": int(knobs.get("num_workers", KNOBS["num_workers"].default)),
        "stream_prefetch": knobs.get("device_prefetch", KNOBS["device_prefetch"].default)
        == "stream",
        "batch_bytes": size,
        "batch_bytes_from": source,
        "copy_s": copy_seconds(size, target, pinned(knobs)),
        "copy_gb_per_s": copy_gb_per_s(target.link_gb_per_s, pinned(knobs)),
        "knobs": knobs,
    }
    if work is None:
        return {**copy, "error": error}
    seconds, source = compute_seconds(work, knobs, target.gpu, {}, per_op=True)
    kind = dtype(knobs, target.gpu)
    return {
        **copy,
        "flops": work.flops,
        "bytes": work.bytes,
        "parameters": work.parameters,
        "kernels": work.kernels,
        "family": work.family,
        "dtype": kind,
        "efficiency": roofline_seconds(work.flops, work.bytes, target.gpu, kind) / seconds,
        "efficiency_from": source,
        "kernel_s": kernel_seconds(work, knobs, target.gpu),
        "host_s": host_seconds(work),
        "host_bound": host_bound(work, seconds),
        "compute_s": seconds,
        "memory_bytes": work.memory_bytes,
        "fits": too_big(knobs, work, target.gpu)
        or "may fit: the counted lower bound is within the GPU's memory",
    }


def _with_measured(entry: dict, cell: str, results: list[dict], target: Target) -> dict:
    """A cell's estimate with its compute measured on the target's GPU where `cell` (its compute
    ceiling, planned by core.target.measured_cells) ran there: `compute_from` says which, `measured`
    how it went."""
    seconds, where = measured_compute(results, target.gpu, entry["batch_size"])
    entry = {**entry, "measured_cell": cell, "measured": where}
    if seconds is None:
        return entry
    entry.pop("error", None)  # a model feedbench cannot count is measured there all the same
    # the estimate's, not this
    for estimated in ("compute_range_s", "range_from", "range_span", "measure_there"):
        entry.pop(estimated, None)
    return {
        **entry,
        "estimated_s": entry.get("compute_s"),
        "compute_s": seconds,
        "compute_from": "measured",
    }


def estimate_range(entry: dict, predictions: list[Prediction]) -> dict:
    """A cell's estimated compute as a range (core.estimate.compute_range: the method's error on the
    published cells of several studies), its span and whether it is too wide to plan on
    (MEASURE_OVER: then measure there). A host-bound cell (core.estimate.host_bound) keeps the fast
    end and is open above: its host's time per kernel varies with the CPU and the code more than any
    published cell tells. Empty for a cell with no estimate."""
    if "compute_s" not in entry:
        return {}
    seconds = entry["compute_s"]
    found = compute_range(predictions, entry["family"])
    if entry["host_bound"]:
        return {
            "compute_range_s": [seconds * found.low, None],
            "range_from": (
                f"host-bound: the host's {1e6 * HOST_SECONDS:.0f} us a kernel x "
                f"{entry['kernels']} kernels is at least half the estimate, so it is open above "
                f"(the fast end: {found.source})"
            ),
            "range_span": None,
            "measure_there": True,
        }
    return {
        "compute_range_s": [seconds * found.low, seconds * found.high],
        "range_from": found.source,
        "range_span": found.span,
        "measure_there": found.span > MEASURE_OVER,
    }


def target_estimates(
    cells: dict[str, dict],
    spec: dict,
    root: str,
    measured: dict[str, str] | None = None,
    paths: list[str] = (),
) -> dict:
    """results/target.json: every training cell (`<experiment>/<cell>` -> knobs) estimated on the
    config's target (`spec`: its `target:` block) by the per-operation estimate (public kernel
    figures, fitted to no published throughput), its error on the published cells of the studies
    (what docs/results/prediction-error.md shows), every published cell of the studies predicted
    beside its figure (core.estimate.beside_published, for the study views), and the target's CPU
    speed: given, or measured (the reference there from its file, and here, run now:
    harness.cpu_speed.target_speed)."""
    target = read_target(spec)
    speed = target_speed(target)
    predictions, _ = published_error(root, per_op=True)
    error = summarize(predictions)
    one_gpu = summarize([p for p in predictions if p.cell.gpus == 1])
    found = {
        "target": {
            "gpu": target.gpu.name,
            "title": target.gpu.title,
            "cores_per_gpu": target.cores_per_gpu,
            **speed,
            "link_gb_per_s": target.link_gb_per_s,
            "default_cpus_per_gpu": spec.get("default_cpus_per_gpu"),
            "compute": compute_side(spec),
        },
        "published_error": {
            "cells": error.cells,
            "median_error": error.median_error,
            "worst_error": error.worst_error,
            "bounds_right": error.bounds_right,
            "median_factor": error.median_factor,
            "worst_factor": error.worst_factor,
            "worst_too_fast": error.worst_too_fast,
            "one_gpu": {
                "cells": one_gpu.cells,
                "median_factor": one_gpu.median_factor,
                "worst_factor": one_gpu.worst_factor,
            },
        },
        "measure_over": MEASURE_OVER,
        "published": beside_published(predictions, target, {}, count_once, per_op=True),
        "cells": {},
    }
    measured, results = measured or {}, results_by_cell(list(paths))
    for key, knobs in cells.items():
        entry = {**estimate_cell(knobs, target), "compute_from": "estimated"}
        entry.update(estimate_range(entry, predictions))
        if key in measured:
            entry = _with_measured(entry, measured[key], results.get(measured[key], []), target)
        found["cells"][key] = entry
    return found


def write_target_estimates(
    path: str,
    cells: dict[str, dict],
    spec: dict,
    root: str,
    measured: dict[str, str] | None = None,
    paths=(),
) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    found = target_estimates(cells, spec, root, measured, paths)
    atomic_write(path, json.dumps(found, indent=1, sort_keys=True) + "\n")
