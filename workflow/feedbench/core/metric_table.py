"""The metric table: every figure of a result that the summary carries, declared once, as core.knobs
declares knobs.

From it come the summary's metric columns (core.columns), the flattening of a result into a summary
row (`row_of`, for analysis.aggregate), the leaves of the result schema's `metrics` that its file
leaves out (`with_metrics`, which core.result.schema applies) and the table in docs/result-schema.md
(`python -m feedbench metrics --markdown`). A new metric is its `Metric` here and the harness line
that measures it. Plain Python: the Snakefile's parse imports core.columns, so never torch or
pandas.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .metrics import PHASES

# The version of feedbench a metric first appears in: a result written before it lacks the value,
# and its column is empty there. Every metric of the first table is as old as the package's version
# 0.1.0.
FIRST = "0.1.0"


def _pinning(item: dict) -> str:
    return "pinned" if item.get("pinned") else "pageable"


@dataclass(frozen=True)
class Expansion:
    """A level of the result with one entry per phase, stage, probed size...: a metric under it is
    one column each.

    `keys`: the entries every row has a column for (the phases), else those the result holds;
    `key_of`: where the level is a list, an item's key (a transfer probe's `by_size`).
    """

    name: str  # the placeholder in a metric's path and column: {phase}
    keys: tuple[str, ...] | None = None
    key_of: Callable[[dict], str] | None = None


PHASE = Expansion("phase", keys=PHASES)
STAGE = Expansion("stage")
SIZE = Expansion("size", key_of=lambda item: f"{_pinning(item)}_{item.get('size_bytes')}")
PINNING = Expansion("pinning", key_of=_pinning)
SERIES = Expansion("series")
EXPANSIONS = (PHASE, STAGE, SIZE, PINNING, SERIES)

# The JSON types a metric's value may have.
TYPES = ("number", "integer", "string", "boolean", "array")


@dataclass(frozen=True)
class Metric:
    """One figure of result.json and its summary column.

    path: dotted, from the result's top (`metrics.step_ms.median`), with its expansion's placeholder
    where it has one (`metrics.phases.{phase}.median_ms`). type: the JSON type of the value there;
    nullable: whether it may be null. column: the summary's, with the same placeholder; None for a
    figure the summary leaves out. convert: the column's value from the result's where they differ
    (a list joined, bytes as MiB). sparse: the column only in rows whose result has the value's
    parent (a transfer probe's columns).
    """

    name: str
    path: str
    type: str
    unit: str
    help: str
    nullable: bool = True
    minimum: float | None = None
    maximum: float | None = None
    column: str | None = ""  # "": the name
    expand: Expansion | None = None
    convert: Callable[[Any], Any] | None = None
    sparse: bool = False
    since: str = FIRST

    def __post_init__(self):
        """A declaration that cannot work fails at import, in one line."""
        if self.type not in TYPES:
            raise ValueError(
                f"metric '{self.name}': type {self.type!r} is not allowed; "
                f"allowed: {', '.join(TYPES)}"
            )
        placeholder = "{" + self.expand.name + "}" if self.expand else None
        if placeholder and (
            placeholder not in self.parts or self.column and placeholder not in self.column
        ):
            raise ValueError(
                f"metric '{self.name}': its path and column need the placeholder {placeholder}"
            )

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))

    @property
    def summary_column(self) -> str | None:
        return self.name if self.column == "" else self.column

    def _split(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the path up to the expanded level, the path under one of its entries); the first alone
        without one."""
        if self.expand is None:
            return self.parts, ()
        at = self.parts.index("{" + self.expand.name + "}")
        return self.parts[:at], self.parts[at + 1 :]

    def at(self, result: dict) -> Any:
        """The value at the metric's path in a result, as it holds it; None where a level is missing
        (an older result). For a metric without an expansion."""
        return _at(result, self.parts)

    def value(self, node: Any) -> Any:
        """The column's value from the node at the metric's path (converted where the metric
        says)."""
        return self.convert(node) if self.convert is not None and node is not None else node


def _joined(separator: str) -> Callable[[list], str | None]:
    return lambda values: separator.join(values) or None


def _profile_text(functions: list[dict]) -> str | None:
    """The `stage_profile` column: the functions the profile named as JSON text, [[name, share, ms],
    ...]."""
    return json.dumps([[f["name"], f["share"], f["ms"]] for f in functions]) if functions else None


RATE = {"minimum": 0}
_STAGE = "metrics.stages.stages.{stage}"
_MEMORY = "monitor.memory"
# In the summary's order: a row's columns come in this order, the entries of an expansion together
# (all of one phase's columns, then the next phase's).
METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "samples_per_s",
            "metrics.samples_per_s",
            "number",
            "samples/s",
            "samples / window_s",
            **RATE,
        ),
        Metric(
            "samples",
            "metrics.samples",
            "integer",
            "samples",
            "samples in the measured steps",
            nullable=False,
            column=None,
            **RATE,
        ),
        Metric(
            "tokens_per_s",
            "metrics.tokens_per_s",
            "number",
            "tokens/s",
            "dataset tokens: true input tokens / window_s",
            **RATE,
        ),
        Metric(
            "step_ms_median",
            "metrics.step_ms.median",
            "number",
            "ms",
            "median step time (host clock between iteration starts)",
            nullable=False,
            **RATE,
        ),
        Metric(
            "step_ms_p10",
            "metrics.step_ms.p10",
            "number",
            "ms",
            "10th percentile of the step time",
            nullable=False,
            **RATE,
        ),
        Metric(
            "step_ms_p90",
            "metrics.step_ms.p90",
            "number",
            "ms",
            "90th percentile of the step time",
            nullable=False,
            **RATE,
        ),
        Metric(
            "stall_pct",
            "metrics.stall_pct",
            "number",
            "%",
            "the data stall as the accelerator sees it: gpu_idle (events timing on a GPU), else "
            "wait, over the steps",
            minimum=0,
            maximum=100,
        ),
        Metric(
            "h2d_gb_per_s",
            "metrics.h2d_gb_per_s",
            "number",
            "GB/s",
            "bytes the h2d phase copied to the device / its time (device_stages' copy, made in "
            "device_prep, is not in it)",
            **RATE,
        ),
        Metric(
            "h2d_bytes",
            "metrics.h2d_bytes",
            "integer",
            "bytes",
            "what the measured steps of a training cell copied to the device, every tensor of "
            "each batch (device_stages' copy of the samples, made in device_prep, included)",
            nullable=False,
            column=None,
            **RATE,
        ),
        Metric(
            "time_to_first_batch_s",
            "metrics.time_to_first_batch_s",
            "number",
            "s",
            "from creating the loader iterator (workers start) to the first batch",
            **RATE,
        ),
        Metric(
            "wait_ms_p50",
            "metrics.wait_ms.p50",
            "number",
            "ms",
            "median data wait over the measured steps",
            nullable=False,
            **RATE,
        ),
        Metric(
            "wait_ms_p90",
            "metrics.wait_ms.p90",
            "number",
            "ms",
            "90th percentile of the data wait",
            nullable=False,
            **RATE,
        ),
        Metric(
            "wait_ms_p99",
            "metrics.wait_ms.p99",
            "number",
            "ms",
            "99th percentile of the data wait (fewer than 100 steps: between the two slowest)",
            nullable=False,
            **RATE,
        ),
        Metric(
            "epoch_stall_ms",
            "metrics.epoch_boundaries.median_ms",
            "number",
            "ms",
            "median wait of the steps that began a later epoch",
            nullable=False,
            **RATE,
        ),
        Metric(
            "epoch_stall_ms_max",
            "metrics.epoch_boundaries.max_ms",
            "number",
            "ms",
            "longest wait of a step that began a later epoch",
            nullable=False,
            **RATE,
        ),
        Metric(
            "epoch_stall_s",
            "metrics.epoch_boundaries.excess_s",
            "number",
            "s",
            "what the epoch boundaries waited beyond the median wait, summed",
            nullable=False,
            **RATE,
        ),
        Metric(
            "epoch_boundaries",
            "metrics.epoch_boundaries.count",
            "integer",
            "",
            "measured steps that began a later epoch",
            nullable=False,
            minimum=1,
        ),
        Metric(
            "workers_uss_growth_mb_per_1k",
            f"{_MEMORY}.workers_growth_mb_per_1k",
            "number",
            "MB per 1,000 samples",
            "the loader workers' USS growth, fitted and summed",
        ),
        Metric(
            "workers_uss_grown_mb",
            f"{_MEMORY}.workers_grown_mb",
            "number",
            "MB",
            "what the workers' USS grew over their lives, summed",
        ),
        Metric(
            "workers_uss_growth_r2", f"{_MEMORY}.workers_r2", "number", "", "r2 of the workers' fit"
        ),
        Metric(
            "trainer_uss_growth_mb_per_1k",
            f"{_MEMORY}.main.growth_mb_per_1k",
            "number",
            "MB per 1,000 samples",
            "the training process's USS growth, fitted",
        ),
        Metric(
            "memory_used_mb",
            f"{_MEMORY}.used_mb",
            "number",
            "MB",
            "the main process's PSS and the workers' at the last sample",
        ),
        Metric(
            "memory_limit_mb",
            f"{_MEMORY}.limit.limit_mb",
            "number",
            "MB",
            "the smallest of RAM, the cgroup's memory.max and Slurm's allocation",
            minimum=0,
        ),
        Metric(
            "memory_limit_by",
            f"{_MEMORY}.limit.bound_by",
            "string",
            "",
            "which gave memory_limit_mb: ram, cgroup or slurm",
        ),
        Metric(
            "samples_to_memory_limit",
            f"{_MEMORY}.samples_to_limit",
            "integer",
            "samples",
            "samples until the growth reaches the limit; empty without growth",
            minimum=0,
        ),
        Metric(
            "workers_start_method",
            f"{_MEMORY}.start_method",
            "string",
            "",
            "the loader workers' start method; empty without workers",
        ),
        Metric(
            "cuda_init_s",
            "metrics.cuda_init_s",
            "number",
            "s",
            "CUDA context creation, before anything else; empty on CPU",
            **RATE,
        ),
        Metric(
            "gc_collections",
            "metrics.gc.collections",
            "integer",
            "",
            "Python's collections in the trainer during the window",
            nullable=False,
            **RATE,
        ),
        Metric(
            "gc_pause_ms",
            "metrics.gc.pause_ms",
            "number",
            "ms",
            "their pauses, summed",
            nullable=False,
            **RATE,
        ),
        Metric(
            "original_fwd_samples_per_s",
            "metrics.original_estimators.fwd_samples_per_s",
            "number",
            "samples/s",
            "pytorch_throughput's forward estimator: mean of per-step rates after the first",
        ),
        Metric(
            "original_bwd_samples_per_s",
            "metrics.original_estimators.bwd_samples_per_s",
            "number",
            "samples/s",
            "its backward + optimizer estimator",
        ),
        Metric(
            "original_samples_per_s",
            "metrics.original_estimators.samples_per_s",
            "number",
            "samples/s",
            "its samples / host time without a final synchronisation",
        ),
        Metric(
            "first_batch_profiled_ms",
            "metrics.first_batch_profile.data_load_ms",
            "number",
            "ms",
            "knob profile_first_batch: CPU total of the notebook's data_load window",
        ),
        Metric(
            "measured_steps",
            "metrics.steps",
            "integer",
            "",
            "measured steps (warm-up excluded)",
            nullable=False,
            **RATE,
        ),
        Metric(
            "window_s",
            "metrics.window_s",
            "number",
            "s",
            "host time from the first measured step's start to the window's end",
            nullable=False,
            **RATE,
        ),
        Metric(
            "page_cache_effective",
            "page_cache.effective",
            "string",
            "",
            "the page cache's state achieved at the start: asis, warm or cold",
            nullable=False,
        ),
        Metric(
            "page_cache_resident",
            "page_cache.resident_fraction",
            "number",
            "",
            "share of the dataset's pages in the page cache after warming or evicting",
        ),
        Metric(
            "world_size",
            "metrics.world_size",
            "integer",
            "",
            "ranks of a multi-process cell",
            nullable=False,
            minimum=1,
        ),
        Metric(
            "comm_share",
            "metrics.comm_share",
            "number",
            "",
            "ddp: 1 - step time without gradient sync / with it (slowest rank)",
        ),
        Metric(
            "timing_effective",
            "timing.effective",
            "string",
            "",
            "the timing mode used: events, sync, naive on a GPU, wall on CPU",
        ),
        Metric(
            "duration_s",
            "duration_s",
            "number",
            "s",
            "the whole run, wall clock",
            nullable=False,
            minimum=0,
        ),
        Metric(
            "phase_ms",
            "metrics.phases.{phase}.median_ms",
            "number",
            "ms",
            "median ms of the phase per step",
            nullable=False,
            column="{phase}_ms",
            expand=PHASE,
            **RATE,
        ),
        Metric(
            "phase_share",
            "metrics.phases.{phase}.share",
            "number",
            "",
            "the phase's sum over the steps' sum",
            column="{phase}_share",
            expand=PHASE,
            **RATE,
        ),
        Metric(
            "stage_worker_ms",
            "metrics.stages.worker_ms_per_sample",
            "number",
            "ms",
            "knob stage_timing: a sample's mean time in the loader's worker",
            nullable=False,
            **RATE,
        ),
        Metric(
            "stage_order",
            "metrics.stages.order",
            "array",
            "",
            "the stages a what-if may name, in the pipeline's order, joined by ' > '",
            nullable=False,
            convert=_joined(" > "),
        ),
        Metric(
            "stage_decorated",
            "metrics.stages.functions",
            "array",
            "",
            "the @feedbench.stage functions a sample ran, joined by ' > '",
            nullable=False,
            convert=_joined(" > "),
        ),
        Metric(
            "stage_on_device",
            "metrics.stages.on_device",
            "array",
            "",
            "the stages device_stages may start at, joined by ' > '",
            convert=_joined(" > "),
        ),
        Metric(
            "stage_profile",
            "metrics.stages.profile.functions",
            "array",
            "",
            "the costliest functions of the warm-up's profile, JSON [[module:qualname, share, ms]]",
            nullable=False,
            convert=_profile_text,
        ),
        Metric(
            "stage_random",
            "metrics.stages.profile.random",
            "array",
            "",
            "the stages found random in the warm-up's samples (their output on the same input "
            "differed between two calls), joined by ' > '",
            nullable=False,
            convert=_joined(" > "),
        ),
        Metric(
            "whatif_trades",
            "metrics.whatif.trades",
            "array",
            "",
            "what the cell's stage what-if traded, joined by '; '",
            nullable=False,
            convert=_joined("; "),
        ),
        Metric(
            "whatif_frozen",
            "metrics.whatif.frozen",
            "array",
            "",
            "cache_after: the cached stages its first pass found random, whose draws the cache "
            "froze, joined by ' > '",
            nullable=False,
            convert=_joined(" > "),
        ),
        Metric(
            "whatif_cache_mb",
            "metrics.whatif.cache.bytes",
            "integer",
            "MiB",
            "cache_after: the cache's size (bytes in the result)",
            nullable=False,
            convert=lambda b: b / 2**20,
            **RATE,
        ),
        Metric(
            "whatif_device_ms",
            "metrics.whatif.device_ms_per_batch",
            "number",
            "ms",
            "device_stages: the moved stages' median ms per batch in the training process",
            **RATE,
        ),
        Metric(
            "other_load_cores",
            "monitor.cpu_offered.other_cores",
            "number",
            "cores",
            "other work on the cell's CPUs over the window (their busy time less the cell's own: "
            "other processes, the kernel's threads and interrupts, steal), in cores",
            minimum=0,
        ),
        Metric(
            "affinity_cores",
            "monitor.cpu_offered.cores",
            "integer",
            "cores",
            "the CPUs of the cell's affinity mask, which other_load_cores is read on",
            minimum=1,
        ),
        # A command cell's (knob command: harness.command).
        Metric(
            "training_loader",
            "command.loader.built_at",
            "string",
            "",
            "command: where its script built the loader it trains on (the one whose batches a "
            "backward pass follows)",
        ),
        Metric(
            "asked_num_workers",
            "command.loader.asked.num_workers",
            "integer",
            "workers",
            "command: the num_workers its script asked of its training loader (num_workers: what "
            "ran)",
            minimum=0,
        ),
        Metric(
            "workers_in_window",
            "command.workers_in_window",
            "integer",
            "workers",
            "command: the training loader's worker processes that made the window's batches",
            minimum=0,
        ),
        Metric(
            "instrument_ms_per_step",
            "command.instrument_ms_per_step",
            "number",
            "ms",
            "command: the instrument's own time in each measured step of the script's loop (its "
            "hooks, less the loader's and backward's own work)",
            minimum=0,
        ),
        Metric(
            "fidelity_ratio",
            "command.fidelity.ratio",
            "number",
            "x",
            "command, its experiment's baseline (first repeat): the instrumented command's whole "
            "run's time over the plain one's, run alone just before (1.02: 2 % slower)",
            minimum=0,
        ),
        Metric(
            "plain_wall_s",
            "command.fidelity.plain_wall_s",
            "number",
            "s",
            "command, baseline: the command alone with no instrument, from its start to its end",
            **RATE,
        ),
        Metric(
            "plain_samples_per_s",
            "command.fidelity.plain_samples_per_s",
            "number",
            "samples/s",
            "command, baseline: the command alone with no instrument, its training samples over "
            "its whole run's time",
            **RATE,
        ),
        Metric(
            "instrumented_samples_per_s",
            "command.fidelity.instrumented_samples_per_s",
            "number",
            "samples/s",
            "command, baseline: the same samples over the instrumented whole run's time",
            **RATE,
        ),
        Metric(
            "fidelity_note",
            "command.fidelity.note",
            "string",
            "",
            "command, baseline: why the two runs were not compared",
        ),
        Metric(
            "stage_ms",
            f"{_STAGE}.median_ms",
            "number",
            "ms",
            "median ms of the stage per sample",
            nullable=False,
            column="stage_{stage}_ms",
            expand=STAGE,
        ),
        Metric(
            "stage_mean_ms",
            f"{_STAGE}.mean_ms",
            "number",
            "ms",
            "mean ms of the stage per sample",
            nullable=False,
            column="stage_{stage}_mean_ms",
            expand=STAGE,
        ),
        Metric(
            "stage_p90_ms",
            f"{_STAGE}.p90_ms",
            "number",
            "ms",
            "90th percentile",
            nullable=False,
            column="stage_{stage}_p90_ms",
            expand=STAGE,
        ),
        Metric(
            "stage_p99_ms",
            f"{_STAGE}.p99_ms",
            "number",
            "ms",
            "99th percentile",
            nullable=False,
            column="stage_{stage}_p99_ms",
            expand=STAGE,
        ),
        Metric(
            "stage_share",
            f"{_STAGE}.share",
            "number",
            "",
            "the stage's share of the worker's time",
            column="stage_{stage}_share",
            expand=STAGE,
        ),
        Metric(
            "stage_calls",
            f"{_STAGE}.calls",
            "integer",
            "",
            "the stage's calls",
            nullable=False,
            column="stage_{stage}_calls",
            expand=STAGE,
            **RATE,
        ),
        Metric(
            "transfer_method",
            "metrics.transfer.method",
            "string",
            "",
            "scenario transfer: how the probe copied",
            nullable=False,
            sparse=True,
        ),
        Metric(
            "transfer_peak_gb_per_s_pinned",
            "metrics.transfer.peak_gb_per_s_pinned",
            "number",
            "GB/s",
            "the probe's best median, pinned",
            sparse=True,
            **RATE,
        ),
        Metric(
            "transfer_peak_gb_per_s_pageable",
            "metrics.transfer.peak_gb_per_s_pageable",
            "number",
            "GB/s",
            "the probe's best median, pageable",
            sparse=True,
            **RATE,
        ),
        Metric(
            "transfer_gb_per_s",
            "metrics.transfer.by_size.{size}.median_gb_per_s",
            "number",
            "GB/s",
            "median copy rate at one probed size ({size}: pinned or pageable, then bytes)",
            **RATE,
            column="transfer_gb_per_s_{size}",
            expand=SIZE,
        ),
        Metric(
            "transfer_user_batch_bytes",
            "metrics.transfer.user_batch.by_pinning.{pinning}.bytes",
            "integer",
            "bytes",
            "a real batch of the user's pipeline: its bytes",
            nullable=False,
            column="transfer_user_batch_bytes_{pinning}",
            expand=PINNING,
        ),
        Metric(
            "transfer_user_batch_ms",
            "metrics.transfer.user_batch.by_pinning.{pinning}.batch_median_ms",
            "number",
            "ms",
            "its median copy time",
            nullable=False,
            column="transfer_user_batch_ms_{pinning}",
            expand=PINNING,
        ),
        Metric(
            "series_mean",
            "monitor.stats.{series}.mean",
            "number",
            "",
            "the monitor's mean of one series (host_cpu_pct, trainer_uss_mb, ...)",
            column="{series}_mean",
            expand=SERIES,
        ),
    )
}


def _at(node: Any, parts: tuple[str, ...]) -> Any:
    """The value at `parts` under `node`; None where a level is missing or not a mapping (an older
    result)."""
    for part in parts:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _entries(node: Any, expansion: Expansion) -> list[tuple[str, Any]]:
    """(key, entry) of each entry of an expanded level."""
    if expansion.key_of is not None:
        return (
            [(expansion.key_of(item), item) for item in node if isinstance(item, dict)]
            if isinstance(node, list)
            else []
        )
    node = node if isinstance(node, dict) else {}
    return [
        (key, node.get(key)) for key in (expansion.keys if expansion.keys is not None else node)
    ]


def _group(metric: Metric) -> tuple:
    """Metrics that expand the same level are flattened together, one entry's columns at a time."""
    return (metric.expand.name, metric._split()[0]) if metric.expand else (None,)


def row_of(result: dict) -> dict:
    """The summary's metric columns of one result, in the table's order. A result written before a
    metric existed has no value there, and its column is empty (None); an expanded level it lacks
    gives no columns, a sparse metric none without its parent."""
    row: dict = {}
    summarized = (m for m in METRICS.values() if m.summary_column is not None)
    for _, group in itertools.groupby(summarized, key=_group):
        group = list(group)
        expansion = group[0].expand
        if expansion is None:
            for m in group:
                if not m.sparse or _at(result, m.parts[:-1]):
                    row[m.summary_column] = m.value(_at(result, m.parts))
            continue
        for key, entry in _entries(_at(result, group[0]._split()[0]), expansion):
            for m in group:
                row[m.summary_column.format(**{expansion.name: key})] = m.value(
                    _at(entry, m._split()[1])
                )
    return row


def undeclared(result: dict) -> list[str]:
    """The keys of a result's `metrics` that no metric of the table lies under: a figure measured
    but not declared."""
    declared = {m.parts[1] for m in METRICS.values() if m.parts[0] == "metrics"}
    return sorted(set(result.get("metrics") or {}) - declared)


def columns() -> list[str]:
    """The metric columns every row has, in the summary's order: those of a result that holds
    nothing. Expansions with fixed keys (the phases) give theirs; those that vary (stages, probed
    sizes, monitor series) and sparse metrics none."""
    return list(row_of({}))


def sparse_columns() -> list[str]:
    """The columns only some rows have, not expanded: a transfer probe's."""
    return [m.summary_column for m in METRICS.values() if m.sparse]


def expanded(expansion: Expansion) -> list[Metric]:
    """The metrics under an expanded level, in the table's order."""
    return [m for m in METRICS.values() if m.expand is expansion]


def _json_types(metric: Metric) -> list[str]:
    return [metric.type, "null"] if metric.nullable else [metric.type]


def leaf_schema(metric: Metric) -> dict:
    """The JSON schema of a metric's value, as the table declares it."""
    leaf: dict = {
        "type": _json_types(metric),
        "description": metric.help + (f" ({metric.unit})" if metric.unit else ""),
    }
    leaf.update(
        {
            k: v
            for k, v in (("minimum", metric.minimum), ("maximum", metric.maximum))
            if v is not None
        }
    )
    return leaf


def schema_node(schema: dict, node: dict, part: str, create: bool = False) -> dict | None:
    """The schema of `part` under `node` (a placeholder: any entry of an expanded level), following
    $ref and allOf; with `create`, an empty schema made where the file has none."""
    while "$ref" in node or "allOf" in node and not node.get("properties"):
        ref = node.get("$ref") or next((s["$ref"] for s in node["allOf"] if "$ref" in s), None)
        if ref is None:
            break
        node = schema["$defs"][ref.rsplit("/", 1)[1]]
    if part.startswith("{"):
        key = "items" if node.get("type") == "array" else "additionalProperties"
        if not isinstance(node.get(key), dict):
            node[key] = {} if create else None
        return node[key]
    found = node.get("properties", {}).get(part)
    if found is None and isinstance(node.get("additionalProperties"), dict):
        found = node["additionalProperties"]  # a mapping whose every entry has one schema (step_ms)
    if found is None and create:
        found = node.setdefault("properties", {})[part] = {}
    return found


def with_metrics(schema: dict) -> dict:
    """The result schema with every declared metric's leaf its file leaves out, and each fixed
    expansion's keys (the phases) as the names its level allows: a new metric or phase needs no edit
    of the file."""
    for metric in METRICS.values():
        node = schema
        for part in metric.parts[:-1]:
            node = schema_node(schema, node, part, create=True)
        if schema_node(schema, node, metric.parts[-1]) is None:
            schema_node(schema, node, metric.parts[-1], create=True).update(leaf_schema(metric))
    for expansion in EXPANSIONS:
        if expansion.keys is not None:
            prefix = expanded(expansion)[0]._split()[0]
            node = schema
            for part in prefix:
                node = schema_node(schema, node, part, create=True)
            node["propertyNames"] = {"enum": list(expansion.keys)}
    return schema


def markdown_table() -> str:
    """The summary's metric columns as a Markdown table (docs/result-schema.md embeds it; a test
    keeps them equal)."""
    lines = [
        "| column | in result.json | type | unit | since | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for m in METRICS.values():
        column = f"`{m.summary_column}`" if m.summary_column else "(none)"
        kind = " or ".join(_json_types(m))
        help = m.help.replace("|", "/") + (" (only in rows that have it)" if m.sparse else "")
        lines.append(f"| {column} | `{m.path}` | {kind} | {m.unit} | {m.since} | {help} |")
    return "\n".join(lines) + "\n"
