"""The target: the node a cluster job will run on, named in the config's `target:` block, and its
GPU's figures.

    target:
      gpu: H100            # a name of the table core/gpus.yaml (peak FLOP/s per dtype, memory and link bandwidth)
      cores_per_gpu: 16    # the CPU cores Slurm gives each GPU's rank and its loader workers
      cpu_speed: 1.0       # one core of the target against one core here (a loader cell's samples/s there / here),
                           # or the file `python -m feedbench cpu-speed --out FILE` wrote there (core.cpu_speed)
      link_gb_per_s: 25    # optional: the host-to-device bandwidth where it differs from the GPU's default link
      compute: measured    # optional: estimated (the default) or measured there (below)
      partition: gpu       # optional, with compute: measured: the Slurm partition of the target's GPUs

The compute side is estimated (feedbench.core.estimate) unless `compute: measured`: then each
single-process training cell's compute ceiling is planned once more, on a GPU (device cuda), in the
experiment `target-compute` (measured_cells), for a run on the target's partition (docs/target.md);
the section "On <target>" takes a measurement made on the target's GPU (measured_compute) over the
estimate, and says which each cell used. Those cells are jobs of their own rule, MEASURED_RULE
(workflow/rules/bench.smk: rule bench by another name), so that `partition:` sends them, and only
them, to the target's partition (measured_resources) under profiles/slurm.

Every figure the plan needs is checked at plan time, before any job: an unknown GPU names the known
ones, a figure missing from the table (or a dtype the GPU has no rate for) names what is missing, a
target with fewer cores than one rank and one loader worker (core.resources) is refused, and a
cpu_speed file must be a measurement of this feedbench's reference cell (core.cpu_speed). Each is
one ConfigError line.

The roofline turns a step's counted FLOPs and bytes into seconds on the GPU; the copy turns a
batch's bytes into seconds over the link. Plain Python (the plan layer): feedbench.harness.flops
counts, feedbench.core.estimate fits the efficiency that scales the roofline to what a model family
reaches.
"""  # noqa: E501

from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

from .ceilings import ceiling_base, ceiling_cell, ceiling_knobs, trains_alone
from .cpu_speed import is_speed_file, read_speed_file
from .knobs import KNOBS, ConfigError, key_path, shown
from .model_names import model_family
from .planned_cell import PlannedCell, effective, same_key
from .resources import cpus_per_rank
from .result import error_text

TABLE = os.path.join(os.path.dirname(__file__), "gpus.yaml")
DTYPES = ("fp32", "tf32", "fp16", "bf16")
FIGURES = ("peak_tflops", "mem_gb_per_s", "h2d_gb_per_s", "memory_gb")
# The experiment of the compute cells measured on the target's GPU (`compute: measured`).
MEASURED_EXPERIMENT = "target-compute"
# The rule of its jobs (workflow/rules/bench.smk), and what the partition of the target's GPUs may
# be called: one Slurm partition (a list of several, "a,b", would let Slurm run the measurement on
# whichever starts it first).
MEASURED_RULE = "bench_target"
PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# The dtype of the matmuls and convolutions of each `amp` level (no autocast: fp32 storage).
AMP_DTYPES = {"off": "fp32", "fp16": "fp16", "bf16": "bf16"}


@dataclass(frozen=True)
class Gpu:
    """One row of the table: dense peak TFLOP/s per dtype (None: no such rate), GB/s of memory and
    of its link, GB of memory, and its chip (the row's own name, or that of the chip's SXM row for a
    PCIe card: H100 for H100-PCIe)."""

    name: str
    title: str
    peak_tflops: dict[str, float | None]
    mem_gb_per_s: float
    h2d_gb_per_s: float
    sources: dict[str, str]
    memory_gb: float
    chip: str


@dataclass(frozen=True)
class Target:
    gpu: Gpu
    cores_per_gpu: int
    # None: measured, from cpu_speed_file there and the same reference here (rule target)
    cpu_speed: float | None
    link_gb_per_s: float  # the GPU's default link unless the config gives its own
    # a cpu-speed file measured on the target (core.cpu_speed), checked
    cpu_speed_file: str | None = None


def _key(name: str) -> str:
    return re.sub(r"[\s_-]+", "", str(name)).lower()


def _gpu(name: str, row: Any, where: str) -> Gpu:
    """A table row as a Gpu, or ConfigError naming the figure (or its source) the row lacks."""
    row = row if isinstance(row, dict) else {}
    sources = row.get("sources") or {}
    for figure in FIGURES:
        if row.get(figure) is None:
            raise ConfigError(
                f"{where}: GPU {name} has no {figure} in {TABLE}; allowed: a row with "
                f"{', '.join(FIGURES)}"
            )
        if not sources.get(figure):
            raise ConfigError(
                f"{where}: GPU {name} has no source for {figure} in {TABLE}; "
                "allowed: a public source"
            )
    peaks = row["peak_tflops"]
    if not isinstance(peaks, dict) or set(peaks) != set(DTYPES):
        raise ConfigError(
            f"{where}: GPU {name} gives peak_tflops for {shown(peaks)}; allowed: "
            f"{', '.join(DTYPES)} (null: no such rate)"
        )
    if peaks["fp32"] is None:
        raise ConfigError(
            f"{where}: GPU {name} has no fp32 peak_tflops in {TABLE}; allowed: a number"
        )
    return Gpu(
        name,
        row.get("title", name),
        {d: None if peaks[d] is None else float(peaks[d]) for d in DTYPES},
        float(row["mem_gb_per_s"]),
        float(row["h2d_gb_per_s"]),
        dict(sources),
        float(row["memory_gb"]),
        str(row.get("chip") or name),
    )


@lru_cache(maxsize=4)
def gpu_table(path: str = TABLE) -> dict[str, dict]:
    """The table's rows by name, as written (checked when a target names one: find_gpu)."""
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def find_gpu(name: Any, where: str = "target.gpu", table: dict | None = None) -> Gpu:
    """The GPU a config names, matched ignoring case, spaces, dashes and underscores; ConfigError
    naming the known."""
    table = gpu_table() if table is None else table
    by_key = {_key(known): known for known in table}
    if is_mig(name):
        raise ConfigError(
            f"{where}: {shown(name)} is a MIG slice, a fraction of a GPU whose figures the table "
            f"does not hold; allowed: a whole GPU, one of {', '.join(table)}"
        )
    known = by_key.get(_key(name)) or _by_form(name, table, where)
    return _gpu(known, table[known], where)


def _forms(table: dict) -> dict[str, dict[str | None, str]]:
    """chip -> {form factor -> row}: a row's form is the one its title names (None: a title that
    names none)."""
    forms: dict[str, dict[str | None, str]] = {}
    for name, row in table.items():
        row = row if isinstance(row, dict) else {}
        forms.setdefault(str(row.get("chip") or name), {})[form_factor(row.get("title"))] = name
    return forms


def _by_form(name: Any, table: dict, where: str) -> str:
    """The row a name of a chip and a form factor gives ("H100-SXM" is the H100 row, "V100 PCIe" the
    V100-PCIe one), or ConfigError: a form the table does not hold for that chip names the ones it
    holds, any other name the GPUs."""
    key = _key(name)
    for chip, rows in _forms(table).items():
        rest = key[len(_key(chip)) :] if key.startswith(_key(chip)) else None
        if rest not in FORMS:
            continue
        if FORMS[rest] in rows:
            return rows[FORMS[rest]]
        known = ", ".join(f"{row} ({form})" if form else row for form, row in rows.items())
        raise ConfigError(
            f"{where}: {shown(name)}: the table holds no {FORMS[rest]} card of the {chip}; "
            f"allowed: {known}"
        )
    raise ConfigError(f"{where}: unknown GPU {shown(name)}; allowed: {', '.join(table)}")


def read_target(spec: dict, table: dict | None = None) -> Target:
    """The config's `target:` block (schema-checked: gpu, cores_per_gpu, cpu_speed given) as a
    Target."""
    for figure in ("gpu", "cores_per_gpu", "cpu_speed"):
        if spec.get(figure) is None:
            raise ConfigError(
                f"target.{figure}: missing; allowed: a target with gpu, cores_per_gpu and cpu_speed"
            )
    gpu = find_gpu(spec["gpu"], table=table)
    needed = cpus_per_rank({"num_workers": 1})
    if spec["cores_per_gpu"] < needed:
        raise ConfigError(
            f"target.cores_per_gpu: value {shown(spec['cores_per_gpu'])} gives a rank fewer "
            f"cores than itself and one loader worker; allowed: at least {needed}"
        )
    check_partition(spec)
    link = float(spec.get("link_gb_per_s") or gpu.h2d_gb_per_s)
    if is_speed_file(spec["cpu_speed"]):
        read_speed_file(spec["cpu_speed"])  # there, checked now; here is measured by rule target
        return Target(gpu, int(spec["cores_per_gpu"]), None, link, spec["cpu_speed"])
    return Target(gpu, int(spec["cores_per_gpu"]), float(spec["cpu_speed"]), link)


def check_partition(spec: dict) -> None:
    """A target's `partition` (optional) names one Slurm partition, and only beside `compute:
    measured`, whose cells are all it routes; else one ConfigError line."""
    partition = spec.get("partition")
    if partition is None:
        return
    if not PARTITION.fullmatch(str(partition)):
        raise ConfigError(
            f"target.partition: value {shown(partition)} is no Slurm partition name; allowed: "
            "one name of letters, digits, _, . and - (not first), as `sinfo -s` lists it"
        )
    if compute_side(spec) != "measured":
        raise ConfigError(
            f"target.partition: given with target.compute {compute_side(spec)}; allowed: a "
            "partition only with compute: measured (it runs the compute cells measured there)"
        )


def compute_side(spec: dict) -> str:
    """How a target's compute is had: `measured` there, or `estimated` (the default)."""
    return spec.get("compute") or "estimated"


def measured_resources(config: dict) -> dict[str, str]:
    """The resources rule MEASURED_RULE adds to rule bench's: the target's partition as
    `slurm_partition` where the config names one, else none (the profile's default-resources then
    choose, as for every other cell)."""
    partition = (config.get("target") or {}).get("partition")
    return {"slurm_partition": str(partition)} if partition else {}


def dtype(knobs: dict, gpu: Gpu) -> str:
    """The dtype whose peak serves a cell's step as a whole (the family estimate's roofline; the
    per-operation estimate takes each class's own, core.kernels.op_dtype): its autocast dtype, else
    tf32 on a GPU that has it for a CNN (PyTorch lets cuDNN's convolutions use TF32 by default,
    torch.backends.cudnn.allow_tf32) or where `matmul_precision` lets float32 matmuls use it, else
    fp32."""
    amp = AMP_DTYPES[knobs.get("amp", KNOBS["amp"].default)]
    if amp != "fp32" or gpu.peak_tflops["tf32"] is None:
        return amp
    cnn = model_family(knobs.get("model", KNOBS["model"].default)) == "cnn"
    tf32 = knobs.get("matmul_precision", KNOBS["matmul_precision"].default) != "highest"
    return "tf32" if cnn or tf32 else "fp32"


def check_cells(target: Target, cells: list) -> None:
    """Every training or compute cell's dtype has a peak on the target's GPU; else one line naming
    the cell and the GPUs that have one."""
    for cell in cells:
        if cell.knobs.get("scenario", KNOBS["scenario"].default) not in ("train", "compute"):
            continue
        wanted = dtype(cell.knobs, target.gpu)
        if target.gpu.peak_tflops[wanted] is None:
            having = [
                name
                for name, row in gpu_table().items()
                if (row.get("peak_tflops") or {}).get(wanted)
            ]
            raise ConfigError(
                f"{key_path('experiments', cell.experiment)}: cell '{cell.id}' computes in "
                f"{wanted}, for which target.gpu {target.gpu.name} has no peak_tflops; allowed: "
                f"a GPU with one ({', '.join(having)}) or another amp"
            )


def roofline_seconds(flops: float, bytes_moved: float, gpu: Gpu, kind: str) -> float:
    """The least time of a step on `gpu`: its FLOPs at the dtype's peak or its bytes at the
    memory's, the longer."""
    peak = gpu.peak_tflops[kind]
    if peak is None:
        raise ValueError(f"{gpu.name} has no {kind} peak")
    return max(flops / (peak * 1e12), bytes_moved / (gpu.mem_gb_per_s * 1e9))


# The share of a PCIe link's peak (the table's h2d_gb_per_s, or the target's link_gb_per_s) a
# host-to-device copy reaches, measured by others with CUDA's bandwidthTest-style copies of large
# buffers:
#   pinned    11.7 GB/s on a Tesla P100 over PCIe 3.0 x16 (15.75 GB/s): Microway, 'NVIDIA Tesla P100
#             PCI-E 16GB GPU Accelerator (Pascal GP100) Up Close'
#             (https://www.microway.com/hpc-tech-tips/nvidia-tesla-p100-pci-e-16gb-
#             gpu-accelerator-pascal-gp100-close/), bandwidthTest host to device, pinned
#   pageable  8.33 GB/s for copies of 64 MB to 1 GB from pageable memory: NVIDIA Developer Forums,
#             'How to understand CPU memory transfer data to GPU memory speed problem'
#             (https://forums.developer.nvidia.com/t/how-to-
#             understand-cpu-memory-transfer-data-to-gpu-memory-speed-problem/56270). The thread
#             does not name its link: its 11.4 GB/s at 16 MB is above what PCIe 2.0 x16 carries (8
#             GB/s), so PCIe 3.0 x16 is taken. Copies of 8 to 32 MB there reached 10.9 to 11.4 GB/s,
#             near the pinned figure: the share is the low end.
# The driver stages a pageable copy through a pinned buffer (CUDA C Best Practices Guide), hence
# less.
PINNED_SHARE = 11.7 / 15.75
PAGEABLE_SHARE = 8.33 / 15.75


def copy_gb_per_s(link_gb_per_s: float, pinned: bool) -> float:
    """The GB/s a batch's copy reaches over a link of `link_gb_per_s` peak: its pinned or its
    pageable share."""
    return link_gb_per_s * (PINNED_SHARE if pinned else PAGEABLE_SHARE)


def pinned(knobs: dict) -> bool:
    """Whether a cell's batches are copied from pinned memory (knob pin_memory)."""
    return bool(knobs.get("pin_memory", KNOBS["pin_memory"].default))


def copy_seconds(batch_bytes: float | None, target: Target, from_pinned: bool = True) -> float:
    """Seconds to copy a batch of `batch_bytes` to the target's GPU over its link, at the share of
    its peak a pinned (or pageable) copy reaches; 0 when the bytes are unknown."""
    return link_seconds(batch_bytes, copy_gb_per_s(target.link_gb_per_s, from_pinned))


def link_seconds(batch_bytes: float | None, gb_per_s: float) -> float:
    """Seconds of `batch_bytes` at `gb_per_s` (results/target.json keeps each cell's copy rate as
    that figure)."""
    return (batch_bytes or 0) / (gb_per_s * 1e9)


def measured_cells(config: dict, cells: list[PlannedCell]) -> dict[str, PlannedCell]:
    """With `target: {compute: measured}`: `<experiment>/<cell>` of every single-process training
    cell -> its compute ceiling on a GPU (device cuda) in the experiment MEASURED_EXPERIMENT, each
    distinct one planned once. Empty without a target or when its compute is estimated."""
    if compute_side(config.get("target") or {}) != "measured":
        return {}
    if MEASURED_EXPERIMENT in (config.get("experiments") or {}):
        raise ConfigError(
            f"experiments: name {MEASURED_EXPERIMENT!r} is the target's own (target.compute: "
            "measured); allowed: another name"
        )
    base, planned, found = ceiling_base(config), {}, {}
    for cell in cells:
        if cell.experiment == MEASURED_EXPERIMENT or not trains_alone({**base, **cell.knobs}):
            continue
        knobs = {**ceiling_knobs(cell.knobs, "compute"), "device": "cuda"}
        key = same_key(effective(knobs))
        if key not in planned:
            planned[key] = ceiling_cell("compute", knobs, base, cell, MEASURED_EXPERIMENT)
        found[f"{cell.experiment}/{cell.id}"] = planned[key]
    return found


# A card's form factor, by the words that name it in a CUDA device name or a table title: the same
# chip has another power limit, clocks and memory as an SXM module, a PCIe card or an NVL pair (an
# H100 PCIe: 756 dense TFLOP/s in bf16 against the SXM's 989). An SXM H100 names none ("NVIDIA H100
# 80GB HBM3"): a name without one is not refused.
FORMS = {"sxm": "SXM", "sxm2": "SXM", "sxm4": "SXM", "sxm5": "SXM", "pcie": "PCIe", "nvl": "NVL"}


def _words(name: str | None) -> list[str]:
    """The name's words, lower case: split at anything but letters, digits and dots ("1g.5gb",
    "pcie)")."""
    return [w for w in re.split(r"[^a-z0-9.]+", str(name or "").lower()) if w]


def form_factor(name: str | None) -> str | None:
    """SXM, PCIe or NVL where the name says which, else None."""
    return next((FORMS[w] for w in _words(name) if w in FORMS), None)


def is_mig(name: str | None) -> bool:
    """A MIG slice ("NVIDIA A100-SXM4-40GB MIG 1g.5gb"): a fraction of the GPU's compute and
    memory."""
    return "mig" in _words(name)


def same_gpu(name: str | None, gpu: Gpu) -> bool:
    """Whether a GPU as CUDA names it is the table's `gpu`: some run of the name's consecutive words
    is its name ("NVIDIA H100 80GB HBM3" is an H100, "NVIDIA GeForce RTX 2080 Ti" an RTX2080Ti;
    "NVIDIA L40S" is no L4), it is not a MIG slice of one, and its form factor (SXM, PCIe, NVL),
    where it names one, is the table's."""
    words = _words(name)
    wanted = _key(gpu.chip)
    if is_mig(name) or _form_named(name, gpu) not in (None, form_factor(gpu.title)):
        return False
    return any(
        "".join(words[i:j]) == wanted
        for i in range(len(words))
        for j in range(i + 1, len(words) + 1)
    )


def _form_named(name: str | None, gpu: Gpu) -> str | None:
    """The form factor a CUDA name says; a chip the table holds in several forms names its SXM
    module with none ("NVIDIA H100 80GB HBM3"), so there a name without one is the SXM module, not
    the PCIe card."""
    form = form_factor(name)
    if form is None and len(_forms(gpu_table()).get(gpu.chip, {})) > 1:
        return "SXM"
    return form


def not_same_gpu(name: str | None, gpu: Gpu) -> str:
    """Why a measurement on the GPU `name` is not one on the target's `gpu`."""
    if is_mig(name):
        return f"ran on {name}, a MIG slice: a fraction of a {gpu.name}"
    form = _form_named(name, gpu)
    if name and form is not None and form_factor(gpu.title) not in (None, form):
        article = "an" if form in ("NVL", "SXM") else "a"
        return (
            f"ran on {name}, {article} {form} card: the table's {gpu.name} is the "
            f"{form_factor(gpu.title)} one"
        )
    return f"ran on {name or 'no GPU'}, not on a {gpu.name}"


def measured_compute(results: list[dict], gpu: Gpu, batch_size: int) -> tuple[float | None, str]:
    """(seconds of a step, where) from the results of a cell's compute ceiling measured for the
    target: the median samples/s over its repeats that ran on the target's GPU; None and why not
    where none did."""
    rates, seen, cards = [], [], []
    for result in results:
        if result.get("status") != "ok":
            seen.append(f"failed: {error_text(result) or 'no error recorded'}")
            continue
        name = (result.get("provenance") or {}).get("gpu")
        if not same_gpu(name, gpu):
            seen.append(not_same_gpu(name, gpu))
            continue
        rates.append(float(result["metrics"]["samples_per_s"]))
        cards.append(name)
    if not rates:
        return None, "; ".join(dict.fromkeys(seen)) or "not run yet"
    card = " and ".join(dict.fromkeys(cards))
    return batch_size / statistics.median(
        rates
    ), f"measured there, on {card} ({len(rates)} repeat{'s' if len(rates) > 1 else ''})"
