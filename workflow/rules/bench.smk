# One job per cell and repeat: write the cell's knobs (params.cell) to
# cell.yaml and run the harness on it. The knobs and the harness fingerprint
# are params, so Snakemake's params trigger reruns exactly the cells whose
# knobs or harness code changed.


rule bench:
    input:
        unpack(cell_inputs),
    output:
        result="results/cells/{experiment}/{cell}/rep{repeat}/result.json",
    params:
        cell=cell_knobs,
        harness=HARNESS,
        dir="results/cells/{experiment}/{cell}/rep{repeat}",
    log:
        "logs/bench/{experiment}/{cell}/rep{repeat}.log",
    benchmark:
        "results/cells/{experiment}/{cell}/rep{repeat}/benchmark.tsv"
    threads: cell_threads
    resources:
        cpus_per_task=cell_cpus_per_task,
        mem_mb=cell_mem_mb,
        runtime=30,
        gpu=cell_gpus,
        nodes=cell_nodes,
        tasks=cell_tasks,
        tasks_per_node=cell_tasks_per_node,
        tasks_per_gpu=cell_tasks_per_gpu,
        mpi=cell_mpi,
        bench_slots=1,
    conda:
        "../../envs/feedbench.yaml"
    shell:
        # Exit 1 (the cell failed) and 2 (bad input) come with a result.json
        # saying status: failed. A harness killed before it could write one
        # (SIGKILL, the OOM killer) gets one from record-failure. Either way the
        # job succeeds, so the matrix goes on and the report lists the failure.
        # The cell stops itself a margin (a tenth, at least 30 s) before the
        # job's runtime: a job killed by Slurm at its limit loses its result.
        """
        rm -f {params.dir}/steps.csv {params.dir}/trace.json
        printf '%s\\n' {params.cell:q} > {params.dir}/cell.yaml
        runtime_s=$(( {resources.runtime} * 60 ))
        margin_s=$(( runtime_s / 10 > 30 ? runtime_s / 10 : 30 ))
        code=0
        python -m feedbench run {params.dir}/cell.yaml --out {params.dir} --time-limit $(( runtime_s - margin_s )) > {log} 2>&1 || code=$?
        if [ ! -s {output.result} ]; then
            python -m feedbench record-failure {params.dir} --exit-code $code --cell {params.dir}/cell.yaml --log {log}
        fi
        """
