# The preflight (feedbench.core.preflight): an experiment whose cells run the user's code builds
# each distinct combination of it once, in one light job, before any of its cells. A ceiling
# experiment's waits for the preflights of the experiments whose cells it bounds (input `after`),
# and checks a combination only where one of them passed. Its record says
# ok or the error; the summary's inputs of the experiment (gated_results) wait for it as a
# checkpoint, so Snakemake plans the experiment's cells only once it passed; otherwise the summary
# reads the record, and writes each cell a stopped record from it: no bench job of the experiment is
# submitted. Every bench job of the experiment also names the record as an input (rule bench), so a
# cell asked for by another path waits for it too; ancient(), so that a preflight run again never
# reruns cells by its date alone.


checkpoint preflight:
    input:
        images=preflight_images,
        after=preflight_after,
    output:
        record=feedbench_preflight.PREFLIGHT,
    log:
        feedbench_preflight.PREFLIGHT_LOG,
    conda:
        "../../envs/feedbench.yaml"
    threads: 1
    resources:
        mem_mb=preflight_resource("mem_mb"),
        gpu=preflight_resource("gpu"),
        runtime=10,
        # Locally it takes the cells' one slot: it never runs beside a cell that measures the
        # machine.
        bench_slots=1,
    params:
        cells=preflight_cells,
        code=preflight_code,
        attempt=preflight_attempt,
        after=preflight_after_json,
        harness=HARNESS,
    shell:
        '"$FEEDBENCH_PYTHON" -m feedbench preflight --cells {params.cells:q} --out {output.record} --log {log}'
        " --attempt {params.attempt:q} --after {params.after:q}"
