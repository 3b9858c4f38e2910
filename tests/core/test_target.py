"""feedbench.core.target: the `target:` block checked at plan time, the GPU table, the roofline and
the copy."""

from __future__ import annotations

import pytest
import yaml
from feedbench.core.ceilings import trainer_seconds
from feedbench.core.model_names import TORCHVISION_MODELS, model_family
from feedbench.core.target import (
    DTYPES,
    MEASURED_EXPERIMENT,
    PAGEABLE_SHARE,
    PINNED_SHARE,
    TABLE,
    Target,
    copy_seconds,
    dtype,
    find_gpu,
    gpu_table,
    measured_compute,
    measured_resources,
    pinned,
    read_target,
    roofline_seconds,
    same_gpu,
)
from feedbench.plan.config import validate_config
from feedbench.plan.matrix import ConfigError, build_cells
from helpers.plans import SCHEMA, TRAIN, plan

# The GPUs of the published studies, and the ones a cluster job is planned for today.
NEEDED = ("K80", "P100", "RTX2080Ti", "V100", "A100", "H100", "H200", "L4")


def test_a_good_target_plans():
    assert plan({"gpu": "h100", "cores_per_gpu": 16, "cpu_speed": 1.2}) == ""
    assert (
        plan({"gpu": "RTX 2080 Ti", "cores_per_gpu": 4, "cpu_speed": 0.8, "link_gb_per_s": 12})
        == ""
    )


def test_an_unknown_gpu_is_one_line_naming_the_known_ones():
    got = plan({"gpu": "B300", "cores_per_gpu": 16, "cpu_speed": 1.0})
    assert got == f"bad config: target.gpu: unknown GPU 'B300'; allowed: {', '.join(gpu_table())}"


@pytest.mark.parametrize(
    "target, message",
    [
        (
            {"gpu": "A100", "cores_per_gpu": 8},
            "bad config: target: missing key; allowed: a mapping with gpu, cores_per_gpu, "
            "cpu_speed",
        ),
        (
            {"cores_per_gpu": 8, "cpu_speed": 1},
            "bad config: target: missing key; allowed: a mapping with gpu",
        ),
    ],
)
def test_a_missing_figure_of_the_target_is_one_line(target, message):
    got = plan(target)
    assert got.startswith(message) and "\n" not in got, got


def test_a_dtype_the_gpu_has_no_peak_for_is_one_line_at_plan_time():
    got = plan({"gpu": "K80", "cores_per_gpu": 8, "cpu_speed": 1.0}, {**TRAIN, "amp": "fp16"})
    assert got == (
        "bad config: experiments.e: cell 'num_workers-0' computes in fp16, for which target.gpu "
        "K80 has no peak_tflops; allowed: a GPU with one (P100, RTX2080Ti, V100, A100, H100, "
        "H200, L4, V100-PCIe, A100-PCIe, H100-PCIe) or another amp"
    )


@pytest.mark.parametrize("figure", ["mem_gb_per_s", "h2d_gb_per_s", "peak_tflops", "memory_gb"])
def test_a_figure_missing_from_the_table_is_one_line(figure):
    row = {k: v for k, v in gpu_table()["H100"].items() if k != figure}
    with pytest.raises(ConfigError) as error:
        find_gpu("H100", table={"H100": row})
    assert str(error.value) == (
        f"target.gpu: GPU H100 has no {figure} in {TABLE}; allowed: a row with peak_tflops, "
        "mem_gb_per_s, h2d_gb_per_s, memory_gb"
    )


def test_a_figure_without_its_source_is_refused():
    row = gpu_table()["L4"]
    row = {**row, "sources": {k: v for k, v in row["sources"].items() if k != "mem_gb_per_s"}}
    with pytest.raises(ConfigError, match="GPU L4 has no source for mem_gb_per_s"):
        find_gpu("L4", table={"L4": row})


def test_fewer_cores_than_a_rank_and_one_worker_is_one_line_at_plan_time():
    got = plan({"gpu": "H200", "cores_per_gpu": 1, "cpu_speed": 1.0})
    assert got == (
        "bad config: target.cores_per_gpu: value 1 gives a rank fewer cores than itself and one "
        "loader worker; allowed: at least 2"
    )


def test_the_table_has_every_needed_gpu_with_every_figure_and_its_source():
    with open(TABLE, encoding="utf-8") as f:
        table = yaml.safe_load(f)
    assert set(NEEDED) <= set(table)
    for name in table:
        gpu = find_gpu(name)  # refuses a missing figure or source
        assert set(gpu.peak_tflops) == set(DTYPES) and gpu.peak_tflops["fp32"] > 0
        # Tensor cores only ever add to the plain fp32 rate; the link is slower than the memory.
        assert all(v is None or v >= gpu.peak_tflops["fp32"] for v in gpu.peak_tflops.values()), (
            name
        )
        assert 0 < gpu.h2d_gb_per_s < gpu.mem_gb_per_s, name
        assert gpu.memory_gb > 0 and gpu.chip in table, name


def test_a_pcie_key_and_an_sxm_key_give_different_figures():
    """#38: the table says which card. An H100 PCIe card is slower than the SXM module in FLOP/s and
    in memory."""
    sxm, pcie = find_gpu("H100-SXM"), find_gpu("h100 pcie")
    assert (
        (sxm.name, pcie.name) == ("H100", "H100-PCIe")
        and find_gpu("H100 SXM5") == sxm
        and pcie.chip == "H100"
    )
    assert (
        pcie.peak_tflops["bf16"] < sxm.peak_tflops["bf16"] and pcie.mem_gb_per_s < sxm.mem_gb_per_s
    )
    # compute-bound, then memory-bound
    for kind, flops, moved in (("bf16", 1e13, 0.0), ("fp32", 0.0, 1e10)):
        assert roofline_seconds(flops, moved, pcie, kind) > roofline_seconds(
            flops, moved, sxm, kind
        )
    assert find_gpu("V100-PCIe").peak_tflops["fp16"] < find_gpu("V100-SXM2").peak_tflops["fp16"]
    assert find_gpu("A100-PCIe").mem_gb_per_s < find_gpu("A100-SXM4").mem_gb_per_s


def test_a_form_factor_the_table_does_not_hold_is_one_line_naming_the_known_ones():
    got = plan({"gpu": "H100-NVL", "cores_per_gpu": 8, "cpu_speed": 1.0})
    assert got == (
        "bad config: target.gpu: 'H100-NVL': the table holds no NVL card of the H100; "
        "allowed: H100 (SXM), H100-PCIe (PCIe)"
    )


def test_the_link_defaults_to_the_gpus_and_an_own_link_replaces_it():
    assert read_target({"gpu": "A100", "cores_per_gpu": 8, "cpu_speed": 1}).link_gb_per_s == 31.5
    target = read_target({"gpu": "A100", "cores_per_gpu": 8, "cpu_speed": 1, "link_gb_per_s": 20})
    assert target.link_gb_per_s == 20
    assert copy_seconds(40e9, target) == pytest.approx(2.0 / PINNED_SHARE)
    assert copy_seconds(None, target) == 0  # a batch of tokens: its bytes vary


def test_a_copy_reaches_a_share_of_the_link_and_a_pageable_one_less():
    """#38: a pinned copy at 11.7 of PCIe 3.0's 15.75 GB/s (a P100's bandwidthTest), a pageable one
    at 8.33."""
    target = read_target({"gpu": "P100", "cores_per_gpu": 8, "cpu_speed": 1})
    assert 15.75 * PINNED_SHARE == pytest.approx(11.7) and 15.75 * PAGEABLE_SHARE == pytest.approx(
        8.33
    )
    assert (
        copy_seconds(1e9, target, from_pinned=False)
        > copy_seconds(1e9, target)
        > 1e9 / (15.75 * 1e9)
    )
    assert pinned({"pin_memory": True}) and not pinned({})  # the knob's default: pageable


def test_the_roofline_is_the_longer_of_flops_and_bytes():
    v100 = find_gpu("V100")  # 15.7 TFLOP/s fp32, 900 GB/s
    assert roofline_seconds(15.7e12, 1e9, v100, "fp32") == pytest.approx(1.0)
    assert roofline_seconds(1e9, 1800e9, v100, "fp32") == pytest.approx(2.0)
    with pytest.raises(ValueError):
        roofline_seconds(1, 1, v100, "bf16")


def test_the_dtype_follows_amp_and_pytorchs_tf32_convolutions():
    a100, v100 = find_gpu("A100"), find_gpu("V100")
    assert dtype({"model": "resnet50"}, a100) == "tf32"
    assert dtype({"model": "resnet50"}, v100) == "fp32"
    assert dtype({"model": "mlp"}, a100) == "fp32"  # matmuls: allow_tf32 is off by default
    assert dtype({"model": "lstm", "amp": "bf16"}, a100) == "bf16"


def test_every_model_has_a_family_but_the_users_and_the_placeholders():
    assert {model_family(m) for m in TORCHVISION_MODELS} == {"cnn", "transformer"}
    assert model_family("vit_b_16") == "transformer" and model_family("resnet50") == "cnn"
    assert (model_family("mlp"), model_family("lstm")) == ("mlp", "rnn")
    assert model_family("sleep") is None and model_family("mypkg.models:Net") is None


def test_the_copy_overlaps_compute_only_with_a_side_stream():
    assert trainer_seconds(3.0, 1.0, stream_prefetch=True) == 3.0
    assert trainer_seconds(3.0, 1.0, stream_prefetch=False) == 4.0
    assert trainer_seconds(1.0, 3.0, stream_prefetch=True) == 3.0


def test_a_target_is_plain_data():
    target = read_target({"gpu": "l4", "cores_per_gpu": 4, "cpu_speed": 0.5})
    assert target == Target(find_gpu("L4"), 4, 0.5, 31.5)


def test_the_sites_default_cpus_per_gpu_is_a_whole_number_of_at_least_one():
    good = {"gpu": "H100", "cores_per_gpu": 8, "cpu_speed": 1.0}
    assert plan({**good, "default_cpus_per_gpu": 2}) == ""
    got = plan({**good, "default_cpus_per_gpu": 0})
    assert got.startswith("bad config: target.default_cpus_per_gpu:") and "\n" not in got, got


def planned_cells(target: dict, experiments: dict) -> list:
    config = {"defaults": {"repeats": 2}, "target": target, "experiments": experiments}
    validate_config(config, SCHEMA)
    return build_cells(config)


def test_compute_measured_plans_each_training_cells_compute_ceiling_once_on_a_gpu():
    """Two worker counts share one compute ceiling (workers are the loader's); a second model is a
    second cell; a loader cell has none; the estimated default plans nothing more."""
    experiments = {
        "e": {"base": TRAIN, "matrix": {"num_workers": [0, 2], "batch_size": [4]}},
        "m": {"base": {**TRAIN, "model": "resnet34"}},
        "l": {"base": {**TRAIN, "scenario": "loader"}},
    }
    target = {"gpu": "H100", "cores_per_gpu": 8, "cpu_speed": 1.0}
    measured = [
        c
        for c in planned_cells({**target, "compute": "measured"}, experiments)
        if c.experiment == "target-compute"
    ]
    assert len(measured) == 2 and MEASURED_EXPERIMENT == "target-compute"
    assert {c.knobs["scenario"] for c in measured} == {"compute"} and {
        c.knobs["device"] for c in measured
    } == {"cuda"}
    assert {c.knobs["model"] for c in measured} == {"resnet18", "resnet34"}
    assert not any(c.experiment == "target-compute" for c in planned_cells(target, experiments))


def test_an_experiment_named_like_the_targets_own_is_one_line():
    target = {"gpu": "H100", "cores_per_gpu": 8, "cpu_speed": 1.0, "compute": "measured"}
    with pytest.raises(
        ConfigError, match="name 'target-compute' is the target's own.*allowed: another name"
    ):
        planned_cells(target, {"target-compute": {"base": TRAIN}})
    assert "target.compute: value 'guessed' is not allowed; allowed: estimated, measured" in plan(
        {**target, "compute": "guessed"}
    )


def test_a_partition_routes_the_compute_measured_there_and_is_one_slurm_name():
    target = {"gpu": "H100", "cores_per_gpu": 8, "cpu_speed": 1.0, "compute": "measured"}
    assert plan({**target, "partition": "gpu.h100_x-1"}) == ""
    assert measured_resources({"target": {**target, "partition": "gpu"}}) == {
        "slurm_partition": "gpu"
    }
    assert measured_resources({"target": target}) == {} and measured_resources({}) == {}
    assert plan({**target, "partition": "gpu,debug"}) == (
        "bad config: target.partition: value 'gpu,debug' is no Slurm partition name; allowed: "
        "one name of letters, digits, _, . and - (not first), as `sinfo -s` lists it"
    )
    assert plan({**target, "compute": "estimated", "partition": "gpu"}) == (
        "bad config: target.partition: given with target.compute estimated; allowed: a partition "
        "only with compute: measured (it runs the compute cells measured there)"
    )
    assert (
        plan({**target, "partition": 7})
        == "bad config: target.partition: value 7 has the wrong type; allowed: a string"
    )


def ran(
    status: str = "ok",
    gpu: str | None = "NVIDIA H100 80GB HBM3",
    rate: float = 400.0,
    error: str | None = None,
):
    """A compute cell's result as the schema has it: what measured_compute reads."""
    return {
        "status": status,
        "provenance": {"gpu": gpu},
        "metrics": {"samples_per_s": rate},
        "error": error,
    }


def test_the_compute_measured_there_is_the_median_of_the_repeats_on_the_targets_gpu():
    h100 = find_gpu("H100")
    assert (
        same_gpu("NVIDIA H100 80GB HBM3", h100)
        and not same_gpu("NVIDIA H200", h100)
        and not same_gpu(None, h100)
    )
    assert same_gpu("NVIDIA GeForce RTX 2080 Ti", find_gpu("RTX2080Ti")) and same_gpu(
        "Tesla K80", find_gpu("K80")
    )
    assert same_gpu("NVIDIA A100-SXM4-80GB", find_gpu("A100")) and not same_gpu(
        "NVIDIA L40S", find_gpu("L4")
    )
    seconds, where = measured_compute(
        [ran(rate=400.0), ran(rate=200.0), ran(rate=100.0)], h100, batch_size=32
    )
    assert (
        seconds == pytest.approx(32 / 200.0)
        and where == "measured there, on NVIDIA H100 80GB HBM3 (3 repeats)"
    )
    seconds, where = measured_compute(
        [ran(rate=400.0), ran(gpu="NVIDIA A100-SXM4-80GB")], h100, batch_size=32
    )
    assert (
        seconds == pytest.approx(32 / 400.0)
        and where == "measured there, on NVIDIA H100 80GB HBM3 (1 repeat)"
    )


@pytest.mark.parametrize(
    "name, gpu, same",
    [
        ("NVIDIA H100 80GB HBM3", "H100", True),  # the SXM module names no form factor
        ("NVIDIA H100 PCIe", "H100", False),
        ("NVIDIA H100 NVL", "H100", False),
        ("NVIDIA A100-SXM4-80GB", "A100", True),
        ("NVIDIA A100 80GB PCIe", "A100", False),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100", False),
        ("Tesla P100-PCIE-16GB", "P100", True),
        ("Tesla V100-PCIE-16GB", "V100", False),
        ("Tesla V100-PCIE-16GB", "V100-PCIe", True),
        ("Tesla V100-SXM2-16GB", "V100-PCIe", False),
        ("NVIDIA H100 PCIe", "H100-PCIe", True),
        # a chip with a PCIe row: a name without a form is the SXM
        ("NVIDIA H100 80GB HBM3", "H100-PCIe", False),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe", True),
        ("NVIDIA L4", "L4", True),
    ],
)
def test_a_measurement_counts_only_on_the_tables_card_never_a_mig_slice_or_another_form_factor(
    name, gpu, same
):
    assert same_gpu(name, find_gpu(gpu)) is same
    _, where = measured_compute([ran(gpu=name)], find_gpu(gpu), batch_size=32)
    assert (
        where.startswith(f"measured there, on {name} (")
        if same
        else where.startswith(f"ran on {name}, ")
    )


def test_a_mig_slice_as_the_target_is_one_line():
    with pytest.raises(
        ConfigError,
        match=r"^target.gpu: 'A100 MIG 1g.5gb' is a MIG slice, " r".*; allowed: a whole GPU",
    ):
        find_gpu("A100 MIG 1g.5gb")


@pytest.mark.parametrize(
    "results, why",
    [
        ([], "not run yet"),
        ([ran(gpu=None)], "ran on no GPU, not on a H100"),
        ([ran(gpu="NVIDIA A100-SXM4-80GB")], "ran on NVIDIA A100-SXM4-80GB, not on a H100"),
        (
            [ran("failed", error="knob 'device': value 'cuda' is not available")],
            "failed: knob 'device'",
        ),
    ],
)
def test_a_compute_cell_that_did_not_run_on_the_targets_gpu_says_why(results, why):
    seconds, where = measured_compute(results, find_gpu("H100"), batch_size=32)
    assert seconds is None and where.startswith(why)
