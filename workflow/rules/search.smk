# `search: num_workers` (feedbench.core.search): the ceilings of a searched experiment are measured
# first; this checkpoint then predicts every level of the worker axis from them and writes which
# training cells run. The summary's inputs (common.smk: result_files) ask for its output, so
# Snakemake re-evaluates the DAG after it.


checkpoint search:
    input:
        ceilings=search_inputs,
    output:
        plan="results/search/{experiment}.json",
    log:
        "logs/search/{experiment}.log",
    conda:
        "../../envs/report.yaml"
    params:
        groups=search_groups_json,
        baseline=lambda w: baseline(list(CELLS.values()), w.experiment).id,
        line=lambda w: search_dry_run_line(
            list(CELLS.values()), w.experiment, SEARCHED[w.experiment]
        ),
        axis=lambda w: SEARCHED[w.experiment],
        beyond_cores=lambda w: feedbench_search.beyond_cores(
            config["experiments"][w.experiment]["search"]
        ),
    # Printed by --dry-run before the ceilings exist: what the checkpoint will decide.
    message:
        "{params.line}"
    script:
        "../scripts/search.py"


localrules:
    search,
