# One job per cell and repeat: write the cell's knobs (params.cell) to
# cell.yaml and run the harness on it (feedbench/plan/job.py). The knobs and the harness fingerprint
# are params, so Snakemake's params trigger reruns exactly the cells whose
# knobs or harness code changed.


# A cell's resources, each a constant when every cell of the run has the same (per_cell), else a
# function of the job; rule bench_target asks for the same.
BENCH_RESOURCES = dict(
    cpus_per_task=per_cell(cell_resources.cpus_per_task),
    mem_mb=cell_mem_mb,
    runtime=30,
    gpu=per_cell(cell_resources.gpus),
    nodes=per_cell(cell_resources.nodes),
    tasks=per_cell(cell_resources.tasks),
    tasks_per_node=per_cell(cell_resources.tasks_per_node),
    tasks_per_gpu=cell_resources.TASKS_PER_GPU,
    mpi=per_cell(cell_resources.mpi),
    bench_slots=1,
)


rule bench:
    input:
        **bench_inputs(),
    output:
        result=f"{CELL_DIR}/result.json",
    log:
        CELL_LOG,
    benchmark:
        f"{CELL_DIR}/benchmark.tsv"
    conda:
        "../../envs/feedbench.yaml"
    # A constant when every cell of the run has the same (per_cell), else a function of the job.
    threads: per_cell(cell_resources.threads)
    resources:
        **BENCH_RESOURCES,
    params:
        cell=cell_knobs,
        harness=HARNESS,
    shell:
        # The job's steps are feedbench.plan.job's (write cell.yaml, run the harness, record a
        # failure it left unrecorded, stop the cell before the job's end): one short command, cheap
        # for Snakemake to format for every job. The job finds its folder and log (CELL_DIR,
        # CELL_LOG) from the labels in params.cell. $FEEDBENCH_PYTHON: the workflow's. --launch-env:
        # the thread variables as the workflow was launched (LAUNCH_ENV, a constant), which the
        # harness gets back in place of the job's threads Snakemake sets them to; a change to them
        # reruns the cells, as their trainers' threads change.
        f'"$FEEDBENCH_PYTHON" -m feedbench job --cell {{params.cell:q}} --runtime {{resources.runtime}} --launch-env{LAUNCH_ENV}'


# With `target: {compute: measured}`: the cells measured on the target's GPU (experiment
# target-compute, feedbench.core.target.measured_cells) are rule bench by another name, so that
# `target: {partition: ...}` sends them, and only them, to the target's partition under
# profiles/slurm (feedbench.core.target.measured_resources); without one they ask for what rule
# bench asks for. Resources given on the command line or in a profile are per rule
# name: `--set-resources bench:...` does not reach these jobs, `bench_target:...` does.
use rule bench as bench_target with:
    wildcard_constraints:
        experiment=MEASURED_EXPERIMENT,
    resources:
        **BENCH_RESOURCES,
        **measured_resources(config),


# Both rules make the cells of target-compute: this one does.
ruleorder: bench_target > bench
