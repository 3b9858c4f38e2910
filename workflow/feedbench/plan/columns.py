"""The columns of results/summary.csv that are not knobs: their one list, without pandas.

analysis.aggregate writes them; plan.matrix checks every plot spec against them when the Snakefile is parsed,
where importing pandas would cost every parse (the run's and each job's) about a second.
"""

from __future__ import annotations

import re

from .metrics import PHASES

# A row's place: experiment, cell, repeat (its sort order), and whether the cell is its experiment's baseline.
LABELS = ["experiment", "cell", "repeat", "baseline"]
ORDER = ["experiment", "cell", "repeat"]
STATUS = ["status", "error_type", "error_message", "adjustments"]
# The metrics of a result (feedbench.analysis.aggregate._metrics), then one median and one share per phase.
METRIC_COLUMNS = [
    "samples_per_s",
    "tokens_per_s",
    "step_ms_median",
    "step_ms_p10",
    "step_ms_p90",
    "stall_pct",
    "h2d_gb_per_s",
    "time_to_first_batch_s",
    "wait_ms_p50",  # the data wait's tail over the measured steps (metrics.wait_tail)
    "wait_ms_p90",
    "wait_ms_p99",
    "epoch_stall_ms",  # the median wait of the steps that began a later epoch (metrics.epoch_boundaries)
    "epoch_stall_ms_max",
    "epoch_stall_s",  # what those waits cost beyond the median wait, summed
    "epoch_boundaries",
    "workers_uss_growth_mb_per_1k",  # the loader workers' memory growth, fitted (monitor.memory; plan.memory)
    "workers_uss_grown_mb",
    "workers_uss_growth_r2",
    "trainer_uss_growth_mb_per_1k",
    "memory_used_mb",
    "memory_limit_mb",  # the smallest of RAM, the cgroup's memory.max and Slurm's allocation (plan.memory)
    "memory_limit_by",
    "samples_to_memory_limit",
    "workers_start_method",
    "cuda_init_s",
    "gc_collections",  # Python's collections in the trainer during the window, and their pauses (harness.collector)
    "gc_pause_ms",
    "original_fwd_samples_per_s",
    "original_bwd_samples_per_s",
    "original_samples_per_s",
    "first_batch_profiled_ms",
    "measured_steps",
    "window_s",
    "page_cache_effective",
    "page_cache_resident",
    "world_size",
    "comm_share",
    "timing_effective",
    "duration_s",
    *(f"{phase}_{stat}" for phase in PHASES for stat in ("ms", "share")),
    "stage_worker_ms",  # a sample's mean time in the loader's worker (knob stage_timing), its stages' sum
    "stage_order",  # the stages a what-if may name, in the pipeline's order, joined by " > "
    "stage_decorated",  # the @feedbench.stage functions a sample ran: a cache or skip may name each alone
    "stage_on_device",  # the stages device_stages may start at: from each on, all took and gave a tensor when sampled
    "stage_profile",  # the costliest functions a profile of the warm-up found, JSON [[module:qualname, share, ms]]
    "whatif_trades",  # what a stage what-if (knobs cache_after, skip_stages, device_stages) traded, "; "-joined
    "whatif_cache_mb",  # cache_after: the cache's size
    "whatif_device_ms",  # device_stages: the moved stages' median ms per batch in the training process
]
# Then, per stage a cell timed (knob stage_timing; harness.stages), columns stage_<name>_<stat>: the stage's ms per
# sample (median; mean, p90, p99), its share of the worker's time and its calls. Which stages there are varies.
STAGE_STATS = {
    "ms": "median_ms",
    "mean_ms": "mean_ms",
    "p90_ms": "p90_ms",
    "p99_ms": "p99_ms",
    "share": "share",
    "calls": "calls",
}
STAGE_COLUMN = re.compile(r"stage_.+_(" + "|".join(STAGE_STATS) + ")")
# A transfer probe's: also one column per probed size (transfer_gb_per_s_<pinned|pageable>_<bytes>), which vary.
TRANSFER_COLUMNS = ["transfer_method", "transfer_peak_gb_per_s_pinned", "transfer_peak_gb_per_s_pageable"]
PROVENANCE_COLUMNS = ["host", "gpu"]
# The trainer's intra-op threads as it ran (the result's `torch_threads`) and why (`torch_threads_source`,
# plan.threads): the knob column `torch_threads` is empty where the cell left them to the launch.
THREADS_COLUMNS = ["torch_threads_used", "torch_threads_source", "torch_threads_launch"]
# The cell's CPU demand against its usable cores (the result's `cpu`, plan.cores.cpu_load): empty without workers.
CPU_COLUMNS = [
    "usable_cores",
    "demand_cores",
    "trainer_cores",  # each rank's trainer in demand_cores: its threads where it computes on the CPU, else 1
    "workers_cpu_share",
    "workers_runnable_share",
    "workers_kind",
    "oversubscribed",
]
# Shared memory as the cell's loader started (the result's `shm`, plan.shm.facts).
SHM_COLUMNS = ["shm_in_flight_bytes", "shm_free_bytes"]
# The knobs as the workflow asked for them, and the result's path.
REQUEST_COLUMNS = ["requested", "result"]
# Added to every row by analysis.aggregate.with_predictions: filled for training cells whose ceilings were measured.
PREDICTION_COLUMNS = [
    "ceiling_loader_samples_per_s",
    "ceiling_compute_samples_per_s",
    "ceiling_copy_gb_per_s",
    "ceiling_copy_from",
    "predicted_samples_per_s",
    "predicted_bound",
    "prediction_error_pct",
    "predicted_from",  # "ceilings", or "stage what-if of <baseline cell>" (analysis.whatifs)
]
# Every column that is not a knob, in the summary's order; monitor means (<name>_mean) and transfer sizes vary.
SUMMARY_COLUMNS = [
    *LABELS,
    *STATUS,
    *METRIC_COLUMNS,
    *TRANSFER_COLUMNS,
    *PROVENANCE_COLUMNS,
    *THREADS_COLUMNS,
    *CPU_COLUMNS,
    *SHM_COLUMNS,
    *REQUEST_COLUMNS,
    *PREDICTION_COLUMNS,
]
