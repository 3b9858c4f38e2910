"""What each GPU achieves per math path, from public kernel-level measurements
(core/kernels.yaml), and a step's counted operations priced at it.

Each counted operation (feedbench.harness.flops: its class, FLOPs, bytes moved and how many) is
priced on its own: a matmul, convolution or recurrent layer at its FLOPs over the GPU's peak in the
operation's math path times the achieved share the table gives for that path and class (or its
bytes at the achieved bandwidth, the longer); every other operation (elementwise, normalisation,
reductions, the optimizer's update) at its bytes over the achieved bandwidth, the datasheet's
times a measured streaming share. The math path follows the knobs as PyTorch does on CUDA:
autocast's dtype for its matmuls, convolutions and recurrent layers; without it, convolutions and
cuDNN's recurrent layers on TF32 tensor cores where the GPU has them
(torch.backends.cudnn.allow_tf32 is on by default) and matmuls on them only where
`matmul_precision` allows it (the knob: torch.set_float32_matmul_precision; "highest", PyTorch's
default, keeps them on CUDA cores). A convolution on tensor cores whose activations are NCHW (no
`channels_last`) pays cuDNN's transposes to NHWC and back (NCHW_PASSES): "the NCHW tensor must be
transposed to NHWC before the convolution and transposed back after" (MosaicML Composer, Channels
Last,
https://docs.mosaicml.com/projects/composer/en/stable/method_cards/channels_last.html;
cuDNN's own guide: it "may use padding, folding, and NCHW-to-NHWC transformations to call the
Tensor Core operations", https://docs.nvidia.com/deeplearning/cudnn/developer/legacy-api.html).

Where a GPU lacks a figure, kernel_figure takes the nearest one and says which (the table's header
gives the order). Plain Python: the counts come from the caller.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from functools import lru_cache

import yaml

from .knobs import KNOBS, ConfigError
from .target import AMP_DTYPES, DTYPES, Gpu, gpu_table

KERNELS = os.path.join(os.path.dirname(__file__), "kernels.yaml")
# The operation classes of the count (feedbench.harness.flops.op_class); those priced at a FLOP
# rate, the others at the memory's.
OP_CLASSES = ("matmul", "convolution", "recurrent", "elementwise", "normalisation")
COMPUTE_CLASSES = ("matmul", "convolution", "recurrent")
TENSOR_DTYPES = ("tf32", "fp16", "bf16")
# The GPU whose classes were measured in both paths, whose ratio of a class to its matmuls a GPU
# with only a matmul figure borrows (rule 4 of kernels.yaml), and its dtype per path.
RATIO_GPU, RATIO_DTYPES = "V100", {"fp32": "fp32", "tensor": "fp16"}
# cuDNN's transposes of a convolution's NCHW activations to NHWC and back: each reads and writes the
# bytes the convolution moves once more (its input before, its output after).
NCHW_PASSES = 2


@dataclass(frozen=True)
class Figure:
    efficiency: float  # achieved over the peak of its dtype on the GPU
    how: str  # "measured", or the rule of kernels.yaml that gave it, in words


def _refuse(where: str, what: str) -> None:
    raise ConfigError(f"{where}: {what}")


def _checked(figure, where: str, value_key: str = "efficiency") -> float:
    """A figure's value, refused in one line without its source or shapes or outside (0, 1]."""
    figure = figure if isinstance(figure, dict) else {value_key: figure}
    for needed in ("source", "shapes"):
        if not figure.get(needed):
            _refuse(
                where,
                f"{value_key} without its {needed}; allowed: a figure with its public source and "
                "the kernel shapes it is derived from",
            )
    value = figure.get(value_key)
    if not isinstance(value, (int, float)) or not 0 < value <= 1:
        _refuse(where, f"{value_key} {value!r}; allowed: a share of the peak in (0, 1]")
    return float(value)


@lru_cache(maxsize=4)
def _rows(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def gpu_figures(gpu: str, kind: str, name: str, path: str = KERNELS) -> dict:
    """One figure of the table as written: its efficiency, source and shapes."""
    return _rows(path)["figures"][gpu][kind][name]


@lru_cache(maxsize=4)
def kernel_table(path: str = KERNELS) -> dict[tuple[str, str], dict[str, float]]:
    """(GPU, dtype) -> {class: efficiency} of the table's measured figures, checked: ConfigError in
    one line for a figure without its source or shapes, a GPU, dtype or class the estimate does not
    know (an elementwise or normalisation figure among them: those are priced at the bandwidth), or
    an efficiency outside (0, 1]."""
    gpus, table = gpu_table(), {}
    for gpu, kinds in (_rows(path).get("figures") or {}).items():
        if gpu not in gpus:
            _refuse(f"{path}: {gpu}", f"unknown GPU; allowed: {', '.join(gpus)}")
        for kind, classes in (kinds or {}).items():
            if kind not in DTYPES:
                _refuse(f"{path}: {gpu}.{kind}", f"unknown dtype; allowed: {', '.join(DTYPES)}")
            for name, figure in (classes or {}).items():
                where = f"{path}: {gpu}.{kind}.{name}"
                if name not in COMPUTE_CLASSES:
                    _refuse(
                        where,
                        "unknown operation class; allowed: "
                        f"{', '.join(COMPUTE_CLASSES)} (memory-bound operations take `bandwidth`)",
                    )
                table.setdefault((str(gpu), kind), {})[name] = _checked(figure, where)
    return table


@lru_cache(maxsize=4)
def bandwidth_share(path: str = KERNELS) -> float:
    """The share of a GPU's datasheet memory bandwidth a streaming kernel reaches (the table's
    `bandwidth`), checked as a figure is."""
    return _checked(_rows(path).get("bandwidth"), f"{path}: bandwidth", "share")


def same_chip(gpu: str, path: str = KERNELS) -> str | None:
    """The row whose figures a GPU of the same chip borrows (the table's `same_chip`), or None."""
    return (_rows(path).get("same_chip") or {}).get(gpu)


def _group(kind: str) -> str:
    return "tensor" if kind in TENSOR_DTYPES else "fp32"


def _aliases(kind: str) -> tuple[str, ...]:
    """The dtype, then the other 16-bit one, then the other tensor-core ones (rules 1 and 2)."""
    if kind == "fp32":
        return ("fp32",)
    halves = ("fp16", "bf16") if kind != "bf16" else ("bf16", "fp16")
    return tuple(dict.fromkeys((kind, *halves, "tf32")))


def _own(gpu: str, kind: str, op_class: str, path: str) -> Figure | None:
    """Rules 1 to 3: the GPU's own figure in the dtype or its aliases, else its chip's row's."""
    table = kernel_table(path)
    for name in (gpu, same_chip(gpu, path)):
        for alias in _aliases(kind):
            value = table.get((name, alias), {}).get(op_class)
            if value is None:
                continue
            if name == gpu and alias == kind:
                return Figure(value, "measured")
            where = name if name == gpu else f"{name}'s (the same chip)"
            return Figure(value, f"{where} {alias}")
    return None


def kernel_figure(gpu: str, kind: str, op_class: str, path: str = KERNELS) -> Figure:
    """The achieved share of `gpu`'s `kind` peak for `op_class`: its own figure, or the nearest one
    by the rules of kernels.yaml, with how it was found."""
    found = _own(gpu, kind, op_class, path)
    if found is not None:
        return found
    matmul = _own(gpu, kind, "matmul", path) if op_class != "matmul" else None
    if matmul is not None:
        ratio_kind = RATIO_DTYPES[_group(kind)]
        ratio = kernel_table(path)[(RATIO_GPU, ratio_kind)]
        return Figure(
            matmul.efficiency * ratio[op_class] / ratio["matmul"],
            f"its matmul figure x the {RATIO_GPU}'s {op_class}/matmul ratio ({ratio_kind})",
        )
    measured = [
        classes[op_class]
        for (_, k), classes in kernel_table(path).items()
        if _group(k) == _group(kind) and op_class in classes
    ]
    return Figure(
        statistics.median(measured),
        f"the median of the {len(measured)} {_group(kind)} figures measured on other GPUs",
    )


def op_dtype(op_class: str, knobs: dict, gpu: Gpu) -> str:
    """The math path of one operation class of a cell's step on `gpu` (module docstring):
    autocast's dtype; else TF32 for convolutions and recurrent layers where the GPU has it and for
    matmuls where `matmul_precision` allows it too; else fp32 (CUDA cores). Memory-bound classes:
    fp32."""
    amp = AMP_DTYPES[knobs.get("amp", KNOBS["amp"].default)]
    if op_class not in COMPUTE_CLASSES:
        return "fp32"
    if amp != "fp32":
        return amp
    if gpu.peak_tflops["tf32"] is None:
        return "fp32"
    if op_class != "matmul":
        return "tf32"
    precision = knobs.get("matmul_precision", KNOBS["matmul_precision"].default)
    return "fp32" if precision == "highest" else "tf32"


def kernel_seconds(work, knobs: dict, gpu: Gpu, path: str = KERNELS) -> dict[str, float]:
    """Seconds of the step's counted operations on `gpu`, summed per class (module docstring)."""
    bandwidth = gpu.mem_gb_per_s * 1e9 * bandwidth_share(path)
    nchw = not knobs.get("channels_last", KNOBS["channels_last"].default)
    seconds = dict.fromkeys(OP_CLASSES, 0.0)
    for op_class, flops, moved, count in work.ops:
        kind = op_dtype(op_class, knobs, gpu)
        rate = gpu.peak_tflops[kind] * 1e12
        if op_class in COMPUTE_CLASSES:
            rate *= kernel_figure(gpu.name, kind, op_class, path).efficiency
        each = max(flops / rate, moved / bandwidth)
        if op_class == "convolution" and kind in TENSOR_DTYPES and nchw:
            each += NCHW_PASSES * moved / bandwidth
        seconds[op_class] += count * each
    return seconds
