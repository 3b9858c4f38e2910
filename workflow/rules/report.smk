# Results -> tidy summary -> one SVG per experiment with a plot spec -> one
# self-contained HTML report. The three are also marked for `snakemake --report`.


rule aggregate:
    input:
        **GATED_RESULTS,
        results=RESULTS,
        # Each gated experiment's cells, or their stopped records, once its preflight has run
        # (rules/preflight.smk).
    output:
        summary=report(
            SUMMARY,
            caption="../../report/captions/summary.rst",
            category="Summary",
        ),
        ceilings=CEILING_MAP,
        records=RECORDS,
    log:
        "logs/aggregate.log",
    conda:
        "../../envs/report.yaml"
    params:
        ceilings=lambda wildcards: ceiling_map(list(CELLS.values())),
        stopped=stopped_cells,
    script:
        "../scripts/aggregate.py"


# With a `target:` in the config: each training cell's step counted on the CPU and estimated on the
# target's GPU (docs/target.md), for the report's section "On <target>". One job, from the knobs
# alone; with `compute: measured` it reads the compute cells measured on the target's GPU, and with
# a cpu_speed file measured there it also runs the same reference cell here (about 20 s, alone).
rule target:
    input:
        measured=MEASURED_RESULTS,
        speed=TARGET_SPEED_FILES,
    output:
        estimates=TARGET_ESTIMATES,
    log:
        "logs/target.log",
    conda:
        "../../envs/feedbench.yaml"
    threads: TARGET_THREADS
    params:
        cells=lambda wildcards: training_cells(list(CELLS.values())),
        target=config.get("target") or {},
        measured={key: "/".join(cell) for key, cell in MEASURED.items()},
        root=workflow.basedir,
    script:
        "../scripts/target.py"


rule plot:
    input:
        summary=SUMMARY,
    output:
        svg=report(
            "results/plots/{experiment}.svg",
            caption="../../report/captions/plot.rst",
            category="Plots",
            labels={"experiment": "{experiment}"},
        ),
    log:
        "logs/plot/{experiment}.log",
    conda:
        "../../envs/report.yaml"
    params:
        experiment="{experiment}",
        spec=experiment_spec,
    script:
        "../scripts/plot.py"


# The results the report reads are rule aggregate's records of them (results/records.json,
# feedbench.core.records), not the result files: a second rule with every result as input would
# double Snakemake's planning of them (docs/performance.md, "Workflow DAG"), and each would be read
# again. The records are made again whenever a result changes, so the report is too.
rule report:
    input:
        **REPORT_INPUTS,
        summary=SUMMARY,
        records=RECORDS,
        plots=PLOTS,
    output:
        html=report(
            REPORT,
            caption="../../report/captions/report.rst",
            category="Report",
        ),
        verdict=VERDICT,
    log:
        "logs/report.log",
    conda:
        "../../envs/report.yaml"
    params:
        config=config,
        config_hash=config_hash(config),
        config_dir=CONFIG_DIR,
    script:
        "../scripts/report.py"
