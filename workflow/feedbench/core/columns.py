"""The columns of results/summary.csv that are not knobs: their one list, without pandas.

analysis.aggregate writes them; plan.matrix checks every plot spec against them when the Snakefile
is parsed, where importing pandas would cost every parse (the run's and each job's) about a second.
"""

from __future__ import annotations

import re

from . import metric_table

# A row's place: experiment, cell, repeat (its sort order), and whether the cell is its experiment's
# baseline.
LABELS = ["experiment", "cell", "repeat", "baseline"]
ORDER = ["experiment", "cell", "repeat"]
STATUS = ["status", "error_type", "error_message", "adjustments"]
# The metrics of a result, in the summary's order: declared in core.metric_table, one phase's
# columns together.
METRIC_COLUMNS = metric_table.columns()
# Then, per stage a cell timed (knob stage_timing; harness.stages), columns stage_<name>_<stat>: the
# stage's ms per sample (median; mean, p90, p99), its share of the worker's time and its calls.
# Which stages there are varies.
STAGE_COLUMN = re.compile(
    "|".join(
        re.escape(m.summary_column).replace(r"\{stage\}", ".+")
        for m in metric_table.expanded(metric_table.STAGE)
    )
)
# A transfer probe's: also one column per probed size (transfer_gb_per_s_<pinned|pageable>_<bytes>),
# which vary.
TRANSFER_COLUMNS = metric_table.sparse_columns()
PROVENANCE_COLUMNS = ["host", "gpu"]
# The trainer's intra-op threads as it ran (the result's `torch_threads`) and why
# (`torch_threads_source`, core.threads): the knob column `torch_threads` is empty where the cell
# left them to the launch.
THREADS_COLUMNS = ["torch_threads_used", "torch_threads_source", "torch_threads_launch"]
# The cell's CPU demand against its usable cores (the result's `cpu`, core.cores.cpu_load): empty
# without workers.
CPU_COLUMNS = [
    "usable_cores",
    "demand_cores",
    # each rank's trainer in demand_cores: its threads where it computes on the CPU, else 1
    "trainer_cores",
    "workers_cpu_share",
    "workers_runnable_share",
    "workers_kind",
    "oversubscribed",
]
# Shared memory as the cell's loader started (the result's `shm`, core.shm.facts).
SHM_COLUMNS = ["shm_in_flight_bytes", "shm_free_bytes"]
# The knobs as the workflow asked for them, and the result's path.
REQUEST_COLUMNS = ["requested", "result"]
# Added to every row by analysis.aggregate.with_predictions: filled for training cells whose
# ceilings were measured.
PREDICTION_COLUMNS = [
    "ceiling_loader_samples_per_s",
    "ceiling_compute_samples_per_s",
    "ceiling_copy_gb_per_s",
    "ceiling_copy_from",
    "predicted_samples_per_s",
    "predicted_bound",
    "prediction_error_pct",
    "predicted_from",  # "ceilings", or "stage what-if of <baseline cell>" (analysis.whatifs)
    # whether a ceiling it was predicted from had only repeats measured beside other load
    # (analysis.other_load): its figures are not divided by a quiet cell's, nor the reverse
    "ceilings_disturbed",
]
# Every column that is not a knob, in the summary's order; monitor means (<name>_mean) and transfer
# sizes vary.
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
