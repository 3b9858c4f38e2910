# The JPEG dataset of cells with `dataset: images` and no data_dir: generated
# once, deterministically, from config `images` (changing it regenerates the
# folder and reruns the cells that read it).


rule make_images:
    output:
        directory(IMAGES_DIR),
    log:
        "logs/make_images.log",
    conda:
        "../../envs/feedbench.yaml"
    params:
        images=config["images"]["count"],
        size=config["images"]["size"],
        classes=config["images"]["classes"],
        seed=config["images"]["seed"],
        harness=HARNESS,  # the generator is harness code (feedbench/harness/images.py)
    shell:
        '"$FEEDBENCH_PYTHON" -m feedbench make-images {output} --count {params.images} --size {params.size}'
        " --classes {params.classes} --seed {params.seed} > {log} 2>&1"
