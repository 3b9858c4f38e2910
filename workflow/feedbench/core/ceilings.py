"""Ceilings: which cells bound a training cell, planned once and written down for the summary.

`ceilings: true` (or a `search`) adds, for every single-process training cell, the cells that
measure what the hardware could do for it (feedbench.analysis.predict turns them into a prediction):

    loader    the loader alone, with the knobs the loader keeps (knobs.Knob.ceilings)
    compute   the model with its data already on the device, with the knobs compute keeps
    transfer  the copy to the device: one probe per device over the batches' sizes (batch_bytes),
              or, for the user's own pipeline (knobs.user_batch), a probe that times a real batch of
              it

Each is measured once: a cell any experiment already has is shared, and a transfer probe that has
every size within SAME_SIZE serves them all. `ceiling_map` writes down which cells bound which
training cell (results/ceilings.json); feedbench.analysis.aggregate joins the summary on it (and
plans the cells of results without it again, by Bounds).

Planning layer: no torch, no pandas (the Snakefile parses with it).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from .knobs import BUILTIN_DATASETS, KNOBS, ConfigError, dropped_by, kept_by, key_path, user_batch
from .model_names import input_kind
from .planned_cell import NOT_KNOBS, PlannedCell, cell_id, effective, same_key, same_value
from .result import atomic_write

# A level of the searched axis whose prediction is within this fraction of the best prediction of
# its combination reaches it: the knee the search runs around (feedbench.core.search.knee).
KNEE_REACHES = 0.95
# A loader ceiling within this fraction of the compute ceiling reaches it: the loader keeps the
# model fed (the fix feedbench.analysis.verdict.recommend names).
LOADER_REACHES = 0.95

# The experiments `ceilings: true` adds, by the scenario of their cells.
CEILING_EXPERIMENTS = {
    "loader": "ceilings-loader",
    "compute": "ceilings-compute",
    "transfer": "ceilings-transfer",
}
# The ceilings derived from a training cell's knobs; the transfer probe is sized from its batch
# instead.
CEILINGS = ("loader", "compute")

# Which ceilings keep each knob is declared with it (feedbench.core.knobs.Knob.ceilings); these are
# derived from that. Knobs that only change how the loader delivers batches (and the copy knobs): a
# compute ceiling resets them.
LOADER_ONLY = dropped_by("compute")
# Knobs that only change the model's work per batch (and the copy knobs the loader alone never
# uses): a loader ceiling resets them. Not `model`, whose kind decides the shape of the samples the
# loader makes (unless the dataset alone shapes them: ceiling_knobs).
MODEL_ONLY = dropped_by("loader")
# Knobs no ceiling keeps: labels of the measurement, not of the work (and the copy knobs).
NEVER = tuple(name for name in LOADER_ONLY if name in MODEL_ONLY)
# The knobs that make a user's batch and move it (harness.transfer.batch_probe): a training cell's
# transfer ceiling times a real batch of its own, so its probe has the same ones.
USER_BATCH_KNOBS = kept_by("transfer")
# The knobs a derived transfer probe takes from the config's defaults: how long and how it measures.
PROBE_LABELS = ("steps", "warmup_steps", "torch_threads", "seed")
# Knobs that say where the user's code lives, not what the cell does: left out of a ceiling's id, so
# a checkout moved elsewhere keeps its ids (and its results).
NOT_IN_IDS = ("python_path", "workdir")
# A probed copy size within this ratio of a batch's bytes measures the batch's copy: the transfer
# ceiling then shares that probe instead of adding its own.
SAME_SIZE = 1.1
# Bytes per element of a sample (float32) and of a label (int64), as feedbench.harness.data makes
# them.
SAMPLE_BYTES, LABEL_BYTES = 4, 8


def ceiling_knobs(knobs: dict[str, Any], scenario: str) -> dict[str, Any]:
    """The knobs of the `scenario` ceiling (loader or compute) a training cell with `knobs` needs. A
    loader ceiling also resets `model` where the dataset's samples do not depend on it (a built-in
    image dataset): the loader alone is then the same cell for every model, measured once (the
    default matrix's `workers` cells serve `decode`)."""
    reset = LOADER_ONLY if scenario == "compute" else MODEL_ONLY
    if scenario == "loader" and not model_shapes_samples(knobs):
        reset = (*reset, "model")
    derived = {k: v for k, v in knobs.items() if k not in reset and k not in NEVER}
    return {**derived, "scenario": scenario}


def model_shapes_samples(knobs: dict[str, Any]) -> bool:
    """Whether the model decides what a sample of the cell's dataset is: a built-in dataset shaped
    for the model (synthetic, memory), or the user's own, whose samples only the user's code
    knows."""
    dataset = BUILTIN_DATASETS.get(knobs.get("dataset", KNOBS["dataset"].default))
    return dataset is None or dataset.sample == "model"


def batch_bytes(knobs: dict[str, Any]) -> int | None:
    """Bytes of one batch copied to the device: float32 samples plus int64 labels; None for tokens
    (variable)."""
    parts = batch_tensor_bytes(knobs)
    return sum(parts) if parts is not None else None


def batch_tensor_bytes(knobs: dict[str, Any]) -> list[int] | None:
    """Bytes of each tensor of one batch, [samples, labels]: each is an allocation of its own
    (pinning rounds each one up: core.shm.pinned_pool); None for tokens (variable)."""

    def get(name: str) -> Any:
        return knobs.get(name, KNOBS[name].default)

    model, dataset = get("model"), get("dataset")
    sample = BUILTIN_DATASETS[dataset].sample if dataset in BUILTIN_DATASETS else "model"
    if sample == "model":  # shaped for the model
        sample = input_kind(model)
    if sample == "tokens":
        return None
    features = get("input_size") if sample == "vector" else 3 * get("image_size") ** 2
    batch = int(get("batch_size"))
    return [batch * int(features) * SAMPLE_BYTES, batch * LABEL_BYTES]


def trainer_seconds(compute: float, copy: float, stream_prefetch: bool) -> float:
    """The trainer's side of a step from its compute and its copy: overlapped (the larger) when a
    side stream prefetches the next batch (device_prefetch stream), else in series (their sum): the
    copy runs on the compute stream, and non_blocking alone overlaps nothing there, since the next
    kernel waits for the copy."""
    return max(compute, copy) if stream_prefetch else compute + copy


def nearest_size(probed: list[int], size: int | None) -> int | None:
    """The probed copy size that stands for a batch of `size` bytes: the nearest by ratio (None
    without either)."""
    if not size or not probed:
        return None
    return min(probed, key=lambda s: abs(math.log(s / size)))


def user_probe_knobs(knobs: dict) -> dict:
    """The transfer probe that times a real batch of a training cell's own pipeline on its
    device."""
    own = {k: knobs[k] for k in USER_BATCH_KNOBS if k in knobs and knobs[k] != KNOBS[k].default}
    return {"scenario": "transfer", "device": knobs["device"], **own}


def ceiling_cells(config: dict, cells: list[PlannedCell]) -> list[PlannedCell]:
    """The ceiling cells of every single-process training cell of an experiment with `ceilings:
    true` or a `search` (which needs them), each once, less those an experiment already has; one
    transfer probe per device covers all batch sizes, none where an experiment's own probe on the
    device has every batch size (within SAME_SIZE). A cell's id names the knobs in which it differs
    from the config's defaults, so it never changes when other cells come or go."""
    experiments = config.get("experiments") or {}
    wanted = [
        name for name, spec in experiments.items() if spec.get("ceilings") or spec.get("search")
    ]
    if not wanted:
        return []
    for name in CEILING_EXPERIMENTS.values():
        if name in experiments:
            raise ConfigError(
                f"experiments: name {name!r} is the ceilings' own (ceilings: true in {wanted[0]});"
                " allowed: another name"
            )
    defaults = _knob_defaults(config)
    base = ceiling_base(config)
    measured = {same_key(effective(c.knobs)) for c in cells}
    derived: dict[str, PlannedCell] = {}
    sizes: dict[str, set[int]] = {}  # device -> batch bytes
    for cell in cells:
        knobs = {**base, **cell.knobs}
        if cell.experiment not in wanted or not trains_alone(knobs):
            continue
        for scenario in CEILINGS:
            ceiling = ceiling_knobs(cell.knobs, scenario)
            key = same_key(effective(ceiling))
            if key in measured:
                continue
            measured.add(key)
            derived[key] = ceiling_cell(scenario, ceiling, base, cell)
        if knobs["device"] == "cpu" or knobs.get("command"):
            # a CPU copies nothing; a command's copy is its own loop's, in its compute ceiling
            continue
        if user_batch(knobs):
            probe = user_probe_knobs(knobs)
            probe.update({k: defaults[k] for k in PROBE_LABELS if k in defaults})
            key = same_key(effective(probe))
            if key not in measured:
                measured.add(key)
                derived[key] = ceiling_cell("transfer", probe, base, cell)
            continue
        size = batch_bytes(knobs)
        if size:
            sizes.setdefault(knobs["device"], set()).add(size)
    for device, device_sizes in sizes.items():
        if any(_probes_sizes(c, device, device_sizes, base) for c in cells):
            # an experiment's own transfer probe already measures these sizes on this device
            continue
        probe = {"scenario": "transfer", "device": device, "transfer_sizes": sorted(device_sizes)}
        probe.update({k: defaults[k] for k in PROBE_LABELS if k in defaults})
        derived[device] = ceiling_cell("transfer", probe, base, None)
    return list(derived.values())


def _knob_defaults(config: dict) -> dict:
    """The config's `defaults` that are knobs (not the run's settings such as repeats)."""
    return {k: v for k, v in (config.get("defaults") or {}).items() if k not in NOT_KNOBS}


def ceiling_base(config: dict) -> dict:
    """Every knob's value where a cell does not set it: the knob spec's default, less the config's
    defaults."""
    return {**{k: knob.default for k, knob in KNOBS.items()}, **_knob_defaults(config)}


def trains_alone(knobs: dict) -> bool:
    """A single-process training cell: the only kind the ceilings predict."""
    return knobs.get("scenario", KNOBS["scenario"].default) == "train" and knobs.get(
        "parallel", KNOBS["parallel"].default
    ) in ("none", None)


def _less_labels(knobs: dict) -> dict:
    return {k: v for k, v in knobs.items() if k not in PROBE_LABELS}


def _probes_sizes(cell: PlannedCell, device: str, wanted: set[int], base: dict) -> bool:
    """Whether `cell` is a transfer probe on `device` with a probed size within SAME_SIZE of every
    wanted size."""
    knobs = {**base, **cell.knobs}
    if knobs["scenario"] != "transfer" or knobs["device"] != device:
        return False
    probed = [int(size) for size in knobs["transfer_sizes"]]
    return all(_same_size(nearest_size(probed, size), size) for size in wanted)


def _same_size(probed: int | None, size: int) -> bool:
    return probed is not None and max(probed, size) / min(probed, size) <= SAME_SIZE


def ceiling_cell(
    scenario: str,
    knobs: dict,
    base: dict,
    source: PlannedCell | None,
    experiment: str | None = None,
) -> PlannedCell:
    """A derived ceiling cell, named by the knobs in which it differs from the defaults (less
    NOT_IN_IDS), in its scenario's ceiling experiment unless another is named."""
    left_out = ("scenario", "transfer_sizes", *NOT_IN_IDS)
    keys = sorted(k for k in knobs if k not in left_out and not same_value(knobs[k], base.get(k)))
    where = key_path("experiments", source.experiment, "ceilings") if source else "ceilings"
    sources = {k: (source.sources.get(k, where) if source else where) for k in knobs}
    name = experiment or CEILING_EXPERIMENTS[scenario]
    return PlannedCell(name, cell_id(knobs, keys), knobs, sources, baseline=False)


class Bounds:
    """The cells that measure the ceilings of training cells, looked up among `cells` (indexed once:
    a map of 10,000 cells is linear)."""

    def __init__(self, cells: list[PlannedCell]):
        self.by_knobs: dict[str, PlannedCell] = {}
        # a transfer probe less its labels -> the first such cell
        self.by_probe: dict[str, PlannedCell] = {}
        # device -> its transfer probes, the derived one first
        self.probes: dict[str, list[PlannedCell]] = {}
        for cell in cells:
            self.by_knobs[same_key(effective(cell.knobs))] = cell
            if cell.knobs.get("scenario") == "transfer":
                self.by_probe.setdefault(same_key(effective(_less_labels(cell.knobs))), cell)
                device = cell.knobs.get("device", KNOBS["device"].default)
                self.probes.setdefault(device, []).append(cell)
        for probes in self.probes.values():
            probes.sort(key=lambda c: c.experiment != CEILING_EXPERIMENTS["transfer"])

    def of(self, cell: PlannedCell) -> dict[str, PlannedCell | None]:
        """Loader, compute, and the transfer probe on the cell's device (the one timing a real batch
        of its own pipeline for user code; None on a CPU, or where no cell measures it)."""
        found = {
            s: self.by_knobs.get(same_key(effective(ceiling_knobs(cell.knobs, s))))
            for s in CEILINGS
        }
        device = cell.knobs.get("device", KNOBS["device"].default)
        if device == "cpu" or cell.knobs.get("command"):
            probe = None
        elif user_batch(cell.knobs):  # the probe that times a real batch of the cell's own pipeline
            probe = self.by_probe.get(
                same_key(effective(user_probe_knobs({"device": device, **cell.knobs})))
            )
        else:
            probe = next(iter(self.probes.get(device, [])), None)
        return {**found, "transfer": probe}


def ceiling_sources(cell: PlannedCell, cells: list[PlannedCell]) -> dict[str, PlannedCell | None]:
    """The cells that measure the ceilings of a training cell, as ceiling_cells derived or found
    them (Bounds.of)."""
    return Bounds(cells).of(cell)


def ceiling_map(cells: list[PlannedCell]) -> dict[str, dict[str, str | None]]:
    """`<experiment>/<cell>` of every single-process training cell some ceiling cell bounds ->
    `<experiment>/<cell>` of its loader, compute and transfer ceiling (None where no cell measures
    it): results/ceilings.json, what feedbench.analysis.aggregate.with_predictions joins on."""
    if not any(
        c.knobs.get("scenario", KNOBS["scenario"].default) in (*CEILINGS, "transfer") for c in cells
    ):
        return {}  # no cell measures a ceiling: nothing to look up
    bounds = Bounds(cells)
    links = {}
    for cell in cells:
        if not trains_alone(cell.knobs):
            continue
        found = {s: f"{c.experiment}/{c.id}" if c else None for s, c in bounds.of(cell).items()}
        if any(found.values()):
            links[f"{cell.experiment}/{cell.id}"] = found
    return links


def training_cells(cells: list[PlannedCell]) -> dict[str, dict[str, Any]]:
    """`<experiment>/<cell>` -> knobs of every single-process training cell: those a target's
    estimate predicts (results/target.json, feedbench.harness.flops.target_estimates), as the
    ceilings predict them here. Not a command's: the estimate counts a model feedbench builds, and
    a command's is inside its script (its compute ceiling measured there: target compute
    measured)."""
    return {
        f"{c.experiment}/{c.id}": dict(c.knobs)
        for c in cells
        if trains_alone(c.knobs) and not c.knobs.get("command")
    }


def write_map(path: str, links: dict[str, dict[str, str | None]]) -> None:
    """The planner's map (ceiling_map) as JSON: what the summary's ceiling columns were joined
    on."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write(path, json.dumps(links, indent=1, sort_keys=True) + "\n")


def read_map(path: str) -> dict[str, dict[str, str | None]]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
