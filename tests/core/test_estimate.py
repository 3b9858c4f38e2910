"""The compute estimate for a target GPU: FLOPs counted on the CPU, its leave-one-study-out error
published."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from feedbench.core.estimate import (
    HOST_BOUND_SHARE,
    HOST_SECONDS,
    HOST_SOURCE,
    MEASURE_OVER,
    PUBLISHED_BOUND,
    RANGE_COVERAGE,
    beside_published,
    compute_range,
    compute_seconds,
    host_bound,
    host_seconds,
    step_on,
    summary_table,
)
from feedbench.core.kernels import (
    KERNELS,
    NCHW_PASSES,
    RATIO_GPU,
    bandwidth_share,
    kernel_figure,
    kernel_seconds,
    kernel_table,
    op_dtype,
)
from feedbench.core.knobs import ConfigError
from feedbench.core.target import Target, dtype, find_gpu, roofline_seconds
from feedbench.harness.flops import (
    PARAMETER_PASSES,
    PUBLISHED_COUNTS,
    StepCount,
    checkout_cells,
    count_once,
    count_step,
    estimate_cell,
    estimate_range,
    memory_error,
    published_error,
    stored_counts,
    write_published_counts,
)

DOC = os.path.join(ROOT, "docs", "results", "prediction-error.md")
# One worker for the module: the published cells are counted afresh once (about 12 s of CPU, most of
# it the nmt study's LSTMs) to check the stored counts that published_error reads.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("published_error")]


def test_the_flops_of_an_mlp_are_what_the_hand_counts():
    """MLP(64 -> 32, 2 hidden 32 x 32, -> 1) at batch 8: forward 2 B (64*32 + 2*32*32 + 32);
    backward the weight gradients of every layer (as many) and the input gradients of every layer
    but the first (the data needs none)."""
    count = count_step(
        {"model": "mlp", "input_size": 64, "width": 32, "hidden_layers": 2, "batch_size": 8}
    )
    forward = 2 * 8 * (64 * 32 + 2 * 32 * 32 + 32)
    inputs = 2 * 8 * (2 * 32 * 32 + 32)
    assert count.flops == forward + forward + inputs == 165_376
    assert count.parameters == (64 * 32 + 32) + 2 * (32 * 32 + 32) + (32 + 1)
    assert count.bytes > PARAMETER_PASSES * 4 * count.parameters  # activations too
    assert count.family == "mlp"


def test_a_convolution_counts_its_forward_and_twice_that_backward():
    """ResNet-18 at 32 px: the published 1.8 GFLOPs (multiply-adds) at 224 px scale with the
    pixels."""
    small = count_step({"model": "resnet18", "image_size": 32, "num_classes": 10, "batch_size": 2})
    double = count_step({"model": "resnet18", "image_size": 32, "num_classes": 10, "batch_size": 4})
    assert double.flops == pytest.approx(2 * small.flops, rel=1e-6)
    assert double.family == "cnn"


def test_a_users_model_has_no_estimate():
    with pytest.raises(ValueError, match="no compute estimate"):
        count_step({"model": "sleep"})


def test_every_published_gpu_throughput_is_a_cell_with_its_bound():
    cells = checkout_cells(ROOT)
    by_study = {s: [c for c in cells if c.study == s] for s in PUBLISHED_BOUND}
    assert {s: len(c) for s, c in by_study.items()} == {"scaling": 8, "nmt": 79, "prefetch": 18}
    k80 = by_study["scaling"][0]
    assert k80.gpu.name == "K80" and k80.published_step_s == pytest.approx(32 / 41.49)
    # 1 epoch of 50 batches, 1 layer, with the side stream: 2.52 s
    prefetch = by_study["prefetch"][0]
    assert prefetch.published_step_s == pytest.approx(2.52 / 50) and prefetch.overlapped
    assert prefetch.copy_bytes == 4096 * (4096 * 4 + 8)


def test_the_stored_published_counts_are_what_counting_gives_now(tmp_path):
    """harness/published_counts.json, which every run with a target reads instead of counting the
    published cells (count_once), is what count_step gives each of them in this checkout, written as
    --write-counts writes it: a change to the counting, a preset or a reference shows here."""
    written = tmp_path / "published_counts.json"
    fresh = write_published_counts(ROOT, str(written))
    stale = sorted(key for key in fresh if stored_counts().get(key) != fresh[key])
    assert not stale and set(stored_counts()) == set(fresh), (
        f"{PUBLISHED_COUNTS} is stale for {stale or 'cells no longer published'}: rerun "
        "benchmarks/prediction_error.py --write-counts"
    )
    assert written.read_text() == Path(PUBLISHED_COUNTS).read_text()
    knobs = checkout_cells(ROOT)[1].knobs
    assert count_once(knobs) is stored_counts()[json.dumps(knobs, sort_keys=True)]


def _section(text: str, start: str, end: str) -> list[str]:
    return text[text.index(start) : text.index(end)].splitlines()


def test_the_page_is_reproduced_by_its_benchmark():
    """#51: docs/results/prediction-error.md is what benchmarks/prediction_error.py prints in its
    own process (the benchmark's run in the suite): the public results against the estimate with
    the goals, the kernel figures every GPU takes, and the studies' summaries by the kernels and by
    the family estimate (leave one study out) are line for line the doc's. Regenerate the doc with
    it."""
    family, efficiencies = published_error(ROOT)
    kernels, _ = published_error(ROOT, per_op=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "workflow"))
    script = os.path.join(ROOT, "benchmarks", "prediction_error.py")
    page = subprocess.run(
        [sys.executable, script, "--print"], capture_output=True, text=True, env=env, timeout=600
    )
    assert page.returncode == 0, page.stderr[-3000:]
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    stale = "docs/results/prediction-error.md is stale: rerun benchmarks/prediction_error.py"
    public = _section(page.stdout, "## The estimate against public", "## The studies'")
    # the validation table: 24 results of ResNet-50 and BERT-large on V100, A100 and H100 cards
    rows = [line for line in public if line.startswith("| [")]
    assert len(rows) == 24 and {"| fp32 |", "| tf32 |", "| amp |"} <= {
        f"| {row.split(' | ')[3].split(',')[0]} |" for row in rows
    }
    assert all(gpu in " ".join(rows) for gpu in ("| V100 (", "| A100 (", "| H100 ("))
    assert sum("| met |" in line or "| not met |" in line for line in public) == 4
    for line in public + summary_table(kernels) + summary_table(family):
        assert line in doc, f"{stale} ({line})"
    for name, value in efficiencies.items():
        assert f"| {name} | {value:.3f} |" in doc
    # Held out, no study's own efficiency serves it: each is the only study of its family.
    assert {p.efficiency_from for p in family} == {"pooled"}
    assert {p.efficiency_from for p in kernels} == {"kernels"}
    # #38 item 4: the page says what the nmt preset counts and how far the study's encoder-decoder
    # is from it.
    gap = next(
        line
        for line in page.stdout.splitlines()
        if line.strip().startswith("bidirectional encoder (2 layers")
    )
    assert gap in doc, f"{stale} ({gap})"
    low, high = (float(x) for x in re.findall(r"(\d+\.\d+) (?:to|times)", gap.split(":")[-1]))
    # the study's model does more work a step than the preset's language model
    assert 1 < low < high, gap


def test_beside_published_puts_each_held_out_prediction_in_the_studys_own_unit():
    """The study views' table (a run with a target): the published figure as the table printed it,
    the held-out prediction in the same unit, and a target's column only where its GPU is not the
    study's."""
    predictions, efficiencies = published_error(ROOT)
    k80 = find_gpu("K80")
    found = beside_published(
        predictions, Target(k80, 4, 1.0, k80.h2d_gb_per_s), efficiencies, count_once
    )
    scaling, prefetch = found["scaling"], found["prefetch"]
    assert scaling["gpu"] == "K80" and prefetch["gpu"] == "RTX2080Ti"
    one_gpu, eight = scaling["rows"][0], scaling["rows"][3]
    assert one_gpu["published"] == pytest.approx(41.49) and eight["published"] == pytest.approx(
        303.5
    )
    held_out = next(p for p in predictions if p.cell.study == "scaling")
    # samples/s of one GPU at batch 32
    assert one_gpu["predicted"] == pytest.approx(32 / held_out.step_s)
    # no communication in the estimate
    assert eight["predicted"] == pytest.approx(8 * one_gpu["predicted"])
    assert all(r["on_target"] is None for r in scaling["rows"])  # the target is the study's GPU
    # 1 layer, 1 epoch of 50 batches, with the side stream: 2.52 s published
    first = prefetch["rows"][0]
    assert first["unit"] == "s" and first["published"] == pytest.approx(2.52)
    cell = next(p.cell for p in predictions if p.cell.study == "prefetch")
    on_k80 = step_on(cell, Target(k80, 4, 1.0, k80.h2d_gb_per_s), efficiencies, count_once)[2]
    assert (
        first["on_target"] == pytest.approx(50 * on_k80) and first["on_target"] > first["predicted"]
    )
    assert first["error"] == pytest.approx(abs(first["published"] / first["predicted"] - 1))


def test_a_family_no_study_covers_takes_the_pooled_efficiency():
    v100 = find_gpu("V100")  # 15.7 TFLOP/s fp32
    work = StepCount(flops=15.7e12, bytes=0.0, parameters=0, family="transformer")
    assert compute_seconds(work, {"model": "vit_b_16"}, v100, {"cnn": 0.5, "pooled": 0.25}) == (
        4.0,
        "pooled",
    )
    cnn = StepCount(flops=15.7e12, bytes=0.0, parameters=0, family="cnn")
    assert compute_seconds(cnn, {"model": "resnet50"}, v100, {"cnn": 0.5, "pooled": 0.25}) == (
        2.0,
        "cnn",
    )


TINY_MLP = {"model": "mlp", "input_size": 16, "width": 16, "hidden_layers": 1, "batch_size": 4}


def test_each_hidden_layer_adds_its_six_kernels_and_momentum_its_optimizer_kernels():
    """A square layer launches addmm and relu forward; mm for its input's gradient, mm for its
    weight's, sum for its bias's and threshold_backward backward (its transposes are views: none).
    SGD with momentum and weight decay runs three more foreach operators than plain SGD's one (the
    buffer's mul_ and add_, the decay's add)."""
    counts = [count_step({**TINY_MLP, "hidden_layers": layers}).kernels for layers in (1, 2, 3)]
    assert counts[1] - counts[0] == counts[2] - counts[1] == 6
    heavy = count_step({**TINY_MLP, "momentum": 0.9, "weight_decay": 1e-4})
    assert heavy.kernels - counts[0] == 3


def test_a_tiny_mlp_on_an_h100_is_predicted_no_faster_than_the_hosts_time_for_its_kernels():
    """Width 16 at batch 4: a few hundred FLOPs, whose roofline on an H100 is nanoseconds; the
    host's time to issue its counted kernels (about 20, HOST_SECONDS each) is the step, by either
    estimate, even at the lowest efficiency a family could be given; and it is host-bound."""
    h100, work = find_gpu("H100"), count_step(TINY_MLP)
    assert work.kernels > 10
    for efficiency in (1.0, 0.01):
        seconds, _ = compute_seconds(
            work, TINY_MLP, h100, {"mlp": efficiency, "pooled": efficiency}
        )
        assert seconds == host_seconds(work) == work.kernels * HOST_SECONDS
        assert (
            roofline_seconds(work.flops, work.bytes, h100, dtype(TINY_MLP, h100)) / efficiency
            < seconds / 10
        )
    assert compute_seconds(work, TINY_MLP, h100, {}, per_op=True) == (host_seconds(work), "kernels")
    assert host_bound(work, host_seconds(work))


def test_the_hosts_time_per_kernel_is_our_h200_runs():
    """#51 item 3: HOST_SECONDS is the H200's ResNet-18 step (docs/results/gpu-validation.md) over
    the kernels counted for it, where the GPU's own work is a small part of the step."""
    work, h200 = count_once(HOST_SOURCE["knobs"]), find_gpu("H200")
    assert HOST_SECONDS == pytest.approx(HOST_SOURCE["step_s"] / work.kernels, rel=0.01)
    gpu = sum(kernel_seconds(work, HOST_SOURCE["knobs"], h200).values())
    assert gpu < HOST_BOUND_SHARE * HOST_SOURCE["step_s"]


def test_resnet50_is_host_bound_at_batch_32_on_an_h100_and_not_at_a_training_batch():
    """Its few hundred kernels take the host about 20 ms: more than an H100 needs for 32 images,
    a fraction of what it needs for 640, where the family estimate is the roofline over the
    efficiency again, even at the full roofline (efficiency 1)."""
    h100 = find_gpu("H100")
    for batch, bound in ((32, True), (640, False)):
        knobs = {"model": "resnet50", "batch_size": batch}
        work = count_step(knobs)
        seconds = compute_seconds(work, knobs, h100, {}, per_op=True)[0]
        assert host_bound(work, seconds) is bound
    roofline = roofline_seconds(work.flops, work.bytes, h100, dtype(knobs, h100))
    assert compute_seconds(work, knobs, h100, {"cnn": 1.0}) == (roofline, "cnn")
    assert host_seconds(work) < roofline / 2


def test_a_cell_that_cannot_fit_the_targets_memory_is_refused_in_one_line():
    """#38: parameters, gradients, optimizer state and saved activations, counted on the meta
    device: an MLP of four 65536-wide layers holds 17.2 G parameters (68.7 GB in fp32, as much again
    in gradients) where a K80 has 12 GB."""
    spec = {"gpu": "K80", "cores_per_gpu": 4, "cpu_speed": 1.0}
    knobs = {
        "scenario": "train",
        "model": "mlp",
        "input_size": 64,
        "hidden_layers": 4,
        "batch_size": 16,
    }
    big = count_step({**knobs, "width": 65536})
    assert big.memory_bytes >= 2 * 4 * big.parameters  # weights and gradients at least
    got = memory_error(
        spec, {"fit/small": {**knobs, "width": 64}, "fit/big": {**knobs, "width": 65536}}
    )
    assert got == (
        f"bad config: experiments.fit: cell 'big' holds at least {big.memory_bytes / 1e9:.1f} GB "
        "on the GPU (parameters, gradients, optimizer state and the activations saved for "
        "backward, counted on the meta device at batch_size 16), more than the 12 GB of "
        "target.gpu K80; allowed: a smaller batch_size or model, or a GPU with more memory "
        "(H200)"
    )
    assert "\n" not in got and memory_error(spec, {"fit/small": {**knobs, "width": 64}}) is None


def test_the_counted_memory_adds_the_optimizers_state_and_the_saved_activations():
    """Adam keeps two moments per parameter, SGD without momentum none; a larger batch saves more
    activations."""
    knobs = {
        "model": "mlp",
        "input_size": 256,
        "width": 256,
        "hidden_layers": 2,
        "batch_size": 64,
        "momentum": 0.0,
    }
    sgd, adam = count_step(knobs), count_step({**knobs, "optimizer": "adam"})
    assert adam.memory_bytes - sgd.memory_bytes >= 2 * 4 * sgd.parameters
    assert count_step({**knobs, "batch_size": 128}).memory_bytes > sgd.memory_bytes


def test_a_cell_under_amp_moves_fewer_bytes_than_in_fp32_and_a_memory_bound_one_is_faster():
    """#38: autocast's matmuls and convolutions write 2-byte outputs, and the pointwise ops after
    them (batch norm, ReLU, the residual add) follow their inputs; its losses and softmax stay fp32.
    ResNet-18's activations then move 0.61 of their fp32 bytes (the 2-byte copies of the weights and
    their gradients on top of half). A memory-bound step (a narrow MLP at a large batch) is faster
    on the same GPU for it."""
    cnn = {"model": "resnet18", "image_size": 64, "batch_size": 32}
    fp32, bf16 = count_step(cnn), count_step({**cnn, "amp": "bf16"})
    parameters = PARAMETER_PASSES * 4 * fp32.parameters  # fp32 master weights either way
    assert bf16.flops == fp32.flops and bf16.bytes - parameters < 2 / 3 * (fp32.bytes - parameters)
    assert bf16.memory_bytes < fp32.memory_bytes  # its saved activations too
    assert count_step({**cnn, "amp": "fp16"}).bytes == bf16.bytes
    mlp = {"model": "mlp", "input_size": 64, "width": 64, "hidden_layers": 2, "batch_size": 1 << 20}
    h100 = find_gpu("H100")
    seconds = {}
    for amp in ("off", "bf16"):
        knobs = {**mlp, "amp": amp}
        work = count_step(knobs)
        kind = dtype(knobs, h100)
        # memory-bound
        assert work.bytes / (h100.mem_gb_per_s * 1e9) > work.flops / (h100.peak_tflops[kind] * 1e12)
        seconds[amp] = sum(kernel_seconds(work, knobs, h100).values())  # the GPU's time
    assert seconds["bf16"] < 0.8 * seconds["off"]


def test_a_range_is_two_sided_and_never_from_one_cell_nor_one_study():
    """#51 item 4: the CNN's family has one published one-GPU cell (the K80's), so its range comes
    from every study's one-GPU cells; it holds the factor RANGE_COVERAGE of them were estimated
    within, either way of the estimate; over 1.5x wide, so it says measure there."""
    predictions, _ = published_error(ROOT, per_op=True)
    one_gpu = [p for p in predictions if p.cell.gpus == 1]
    assert sum(p.cell.study == "scaling" for p in one_gpu) == 1
    for family in ("cnn", "rnn", "mlp", "transformer", None):
        found = compute_range(predictions, family)
        assert found.low == pytest.approx(1 / found.high) and found.low < 1 < found.high
        assert f"{len(one_gpu)} one-GPU published cells of scaling (K80), nmt (P100), " in (
            found.source
        )
        within = sum(p.factor <= found.high * (1 + 1e-9) for p in one_gpu) / len(one_gpu)
        assert within >= RANGE_COVERAGE and found.span > MEASURE_OVER
    entry = {"compute_s": 0.1, "host_bound": False, "kernels": 100, "family": "cnn"}
    ranged = estimate_range(entry, predictions)
    cnn = compute_range(predictions, "cnn")
    assert ranged["compute_range_s"] == pytest.approx([0.1 * cnn.low, 0.1 * cnn.high])
    assert ranged["measure_there"] and ranged["range_span"] == pytest.approx(cnn.span)


def test_a_host_bound_cells_range_is_open_above():
    """#51 item 3: where the host's time is at least half the estimate, the GPU waits on the host,
    whose time per kernel varies with the CPU: the range keeps its fast end and is open above. The
    tiny MLP on an H100 is such a cell."""
    predictions, _ = published_error(ROOT, per_op=True)
    h100 = find_gpu("H100")
    entry = estimate_cell({**TINY_MLP, "scenario": "train"}, Target(h100, 4, 1.0, 63.0))
    assert entry["host_bound"] and entry["compute_s"] == entry["host_s"]
    ranged = estimate_range(entry, predictions)
    low = entry["compute_s"] * compute_range(predictions, "mlp").low
    assert ranged["compute_range_s"] == [pytest.approx(low), None]
    assert ranged["range_span"] is None and ranged["measure_there"]
    assert ranged["range_from"].startswith("host-bound")


# Large enough that their roofline, not their launches, is their step on a P100; a short sequence
# keeps the count quick.
SMALL_RESNET = {"model": "resnet18", "image_size": 64, "num_classes": 10, "batch_size": 64}
SMALL_LSTM = {"model": "lstm", "dataset": "tokens", "vocab_size": 1000, "embedding_dim": 512, "hidden_size": 512,  # noqa: E501
              "lstm_layers": 1, "seq_len": 5, "batch_size": 64, "lstm_impl": "fused"}  # fmt: skip
SMALL_LOOP = {**SMALL_LSTM, "lstm_impl": "cell"}


def _op_rooflines(work, knobs, gpu) -> dict[str, float]:
    """Each class's summed per-operation roofline seconds, by hand from the counted operations."""
    found: dict[str, float] = {}
    for op_class, flops, moved, count in work.ops:
        seconds = count * roofline_seconds(flops, moved, gpu, dtype(knobs, gpu))
        found[op_class] = found.get(op_class, 0.0) + seconds
    return found


def test_the_counted_operations_add_up_to_the_steps_flops_and_bytes():
    """The per-operation estimate prices the same work as the family one, split by operation: a
    ResNet's convolutions, matmul and batch norms; a fused LSTM's layers as recurrent, an LSTMCell
    loop's as matmuls."""
    for knobs in (SMALL_RESNET, SMALL_LSTM, SMALL_LOOP):
        work = count_once(knobs)
        assert sum(f * n for _, f, _, n in work.ops) == work.flops
        assert sum(b * n for _, _, b, n in work.ops) == pytest.approx(work.bytes)
    classes = lambda knobs: {c for c, *_ in count_once(knobs).ops}  # noqa: E731
    assert classes(SMALL_RESNET) == {"convolution", "matmul", "normalisation", "elementwise"}
    assert "recurrent" in classes(SMALL_LSTM)
    assert classes(SMALL_LOOP) == {"matmul", "elementwise"}


def test_each_operation_is_priced_at_its_classs_kernel_figure_and_the_rest_at_bandwidth():
    """On a P100 (DeepBench's figures: core/kernels.yaml) a ResNet's convolutions take the
    convolution figure, a fused LSTM's layers the recurrent one and an LSTMCell loop's matmuls the
    GEMM one: each operation's FLOPs over the peak times its figure, or its bytes at the achieved
    bandwidth, the longer. So a fused LSTM and its loop, equal in FLOPs, are priced apart."""
    p100 = find_gpu("P100")
    bandwidth = p100.mem_gb_per_s * 1e9 * bandwidth_share()
    for knobs in (SMALL_RESNET, SMALL_LSTM, SMALL_LOOP):
        work, by_hand = count_once(knobs), {}
        for op_class, flops, moved, count in work.ops:
            rate = p100.peak_tflops["fp32"] * 1e12
            if op_class in ("matmul", "convolution", "recurrent"):
                rate *= kernel_table()[("P100", "fp32")][op_class]
            each = max(flops / rate, moved / bandwidth)
            by_hand[op_class] = by_hand.get(op_class, 0.0) + count * each
        priced = kernel_seconds(work, knobs, p100)
        assert {c: v for c, v in priced.items() if v} == pytest.approx(by_hand)
    fused, loop = count_once(SMALL_LSTM), count_once(SMALL_LOOP)
    assert fused.flops == loop.flops
    priced = [
        sum(kernel_seconds(w, k, p100).values())
        for w, k in ((fused, SMALL_LSTM), (loop, SMALL_LOOP))
    ]
    # the fused layer at DeepBench's LSTM figure (0.293), the loop's matmuls at its GEMM one (0.91)
    assert priced[0] > 1.5 * priced[1]


def test_memory_bound_operations_are_priced_at_the_achieved_bandwidth():
    """#51 item 2: elementwise ops, batch norms, reductions and the optimizer's update take their
    bytes over the datasheet bandwidth times the measured streaming share, whatever the GPU's FLOP
    figures; a figure for them in kernels.yaml is refused (they have none to have)."""
    share = bandwidth_share()
    assert 0.8 < share < 0.95
    for name in ("V100", "A100", "K80"):
        gpu, work = find_gpu(name), count_once(SMALL_RESNET)
        bandwidth = gpu.mem_gb_per_s * 1e9 * share
        priced = kernel_seconds(work, SMALL_RESNET, gpu)
        for op_class in ("elementwise", "normalisation"):
            moved = sum(n * b for c, _, b, n in work.ops if c == op_class)
            assert priced[op_class] == pytest.approx(moved / bandwidth, rel=1e-3)


def test_the_math_path_moves_an_amp_estimate_and_an_fp32_one_apart():
    """#51 item 1: one figure per GPU and math path. On an A100 a matmul-bound MLP's matmuls run at
    the fp32 CUDA cores' figure without autocast and at the bf16 tensor cores' under it: its
    estimates are as far apart as the two achieved rates, not the two peaks; its memory-bound part
    is the bytes autocast leaves."""
    a100 = find_gpu("A100")
    knobs = {"model": "mlp", "input_size": 4096, "width": 4096, "hidden_layers": 4}
    knobs["batch_size"] = 4096
    off, bf16 = ({**knobs, "amp": amp} for amp in ("off", "bf16"))
    assert (op_dtype("matmul", off, a100), op_dtype("matmul", bf16, a100)) == ("fp32", "bf16")
    rates = {
        kind: a100.peak_tflops[kind] * kernel_figure("A100", kind, "matmul").efficiency
        for kind in ("fp32", "bf16")
    }
    assert rates["fp32"] == pytest.approx(19.5) and rates["bf16"] == pytest.approx(267.9, rel=1e-3)
    matmul = {
        name: kernel_seconds(count_once(k), k, a100)["matmul"]
        for name, k in (("off", off), ("bf16", bf16))
    }
    assert matmul["off"] / matmul["bf16"] == pytest.approx(rates["bf16"] / rates["fp32"], rel=0.02)


def test_the_tf32_knob_changes_the_estimate():
    """#51 item 1: `matmul_precision` (torch.set_float32_matmul_precision) puts float32 matmuls on
    TF32 tensor cores where the GPU has them; convolutions use them either way (cuDNN's default).
    On an A100 the MLP's estimate moves by the two rates; on a V100, which has no TF32, not at
    all."""
    a100, v100 = find_gpu("A100"), find_gpu("V100")
    knobs = {"model": "mlp", "input_size": 4096, "width": 4096, "hidden_layers": 4}
    knobs["batch_size"] = 4096
    high = {**knobs, "matmul_precision": "high"}
    work = count_once(knobs)
    assert (op_dtype("matmul", knobs, a100), op_dtype("matmul", high, a100)) == ("fp32", "tf32")
    assert op_dtype("convolution", knobs, a100) == "tf32"
    assert (dtype(knobs, a100), dtype(high, a100)) == ("fp32", "tf32")
    highest, tf32 = (compute_seconds(work, k, a100, {}, per_op=True)[0] for k in (knobs, high))
    assert tf32 < highest / 3
    assert compute_seconds(work, high, v100, {}, per_op=True) == compute_seconds(
        work, knobs, v100, {}, per_op=True
    )


def test_a_cell_sets_its_matmul_precision_in_torch(run_cell):
    """The knob reaches PyTorch: a cell's step sets torch.set_float32_matmul_precision to it (each
    cell sets its own: process-wide)."""
    try:
        run_cell(**{**TINY_MLP, "steps": 2, "warmup_steps": 0, "matmul_precision": "high"})
        assert torch.get_float32_matmul_precision() == "high"
        run_cell(**{**TINY_MLP, "steps": 2, "warmup_steps": 0})
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision("highest")


def test_a_gpu_without_its_own_figure_takes_the_nearest_by_the_tables_rules():
    """kernels.yaml's rules: an A100's convolutions take its matmul figure times the V100's ratio
    of convolutions to matmuls in that path; an H100 PCIe card the H100's (the same chip); a K80,
    measured by no one, the median of the GPUs measured in fp32; fp16 the bf16 figure of the same
    tensor cores."""
    table = kernel_table()
    conv = kernel_figure("A100", "bf16", "convolution")
    ratio = table[(RATIO_GPU, "fp16")]["convolution"] / table[(RATIO_GPU, "fp16")]["matmul"]
    assert conv.efficiency == pytest.approx(table[("A100", "bf16")]["matmul"] * ratio)
    assert "ratio" in conv.how
    pcie = kernel_figure("H100-PCIe", "bf16", "matmul")
    assert pcie.efficiency == table[("H100", "bf16")]["matmul"] and "same chip" in pcie.how
    k80 = kernel_figure("K80", "fp32", "matmul")
    measured = [v["matmul"] for (_, k), v in table.items() if k == "fp32" and "matmul" in v]
    assert k80.efficiency == statistics.median(measured) and "median" in k80.how
    assert kernel_figure("A100", "fp16", "matmul").efficiency == table[("A100", "bf16")]["matmul"]
    assert kernel_figure("V100", "fp32", "matmul").how == "measured"


def test_a_tensor_core_convolution_on_nchw_pays_the_transposes():
    """Without channels_last, cuDNN transposes a tensor-core convolution's activations to NHWC and
    back: NCHW_PASSES more of its bytes at the bandwidth; on CUDA cores (fp32 on a V100) none."""
    a100, v100 = find_gpu("A100"), find_gpu("V100")
    knobs = {**SMALL_RESNET, "amp": "bf16"}
    work = count_once(knobs)
    moved = sum(n * b for c, _, b, n in work.ops if c == "convolution")
    nchw = kernel_seconds(work, knobs, a100)["convolution"]
    nhwc = kernel_seconds(work, {**knobs, "channels_last": True}, a100)["convolution"]
    bandwidth = a100.mem_gb_per_s * 1e9 * bandwidth_share()
    assert nchw - nhwc == pytest.approx(NCHW_PASSES * moved / bandwidth)
    fp32 = count_once(SMALL_RESNET)
    assert kernel_seconds(fp32, SMALL_RESNET, v100) == kernel_seconds(
        fp32, {**SMALL_RESNET, "channels_last": True}, v100
    )


def test_a_targets_compute_is_the_per_operation_estimate():
    """results/target.json's compute: each operation at the GPU's kernel figures, split by class,
    with the host's time and the share of the roofline it comes to."""
    p100 = find_gpu("P100")
    entry = estimate_cell(SMALL_LSTM, Target(p100, 4, 1.0, p100.h2d_gb_per_s))
    work = count_once(SMALL_LSTM)
    assert entry["compute_s"] == compute_seconds(work, SMALL_LSTM, p100, {}, per_op=True)[0]
    assert entry["kernel_s"] == kernel_seconds(work, SMALL_LSTM, p100)
    assert entry["host_s"] == host_seconds(work) and entry["efficiency_from"] == "kernels"
    roofline = roofline_seconds(work.flops, work.bytes, p100, "fp32")
    assert entry["efficiency"] == pytest.approx(roofline / entry["compute_s"])


@pytest.mark.parametrize("missing", ["source", "shapes"])
def test_a_kernel_figure_without_its_source_is_refused_in_one_line(tmp_path, missing):
    with open(KERNELS, encoding="utf-8") as f:
        text = f.read()
    path = tmp_path / "kernels.yaml"
    figure = {
        "efficiency": 0.5,
        "source": "DeepBench (https://github.com/baidu-research/DeepBench)",
        "shapes": "all",
    }
    del figure[missing]
    path.write_text(
        text + "  K80:\n    fp32:\n      matmul: " + repr(figure).replace("'", '"') + "\n"
    )
    with pytest.raises(ConfigError) as error:
        kernel_table(str(path))
    assert "\n" not in str(error.value)
    assert f"K80.fp32.matmul: efficiency without its {missing}" in str(error.value)
    assert kernel_table()[("P100", "fp32")]["recurrent"] > 0  # the project's own table passes


def test_a_kernel_figure_for_a_memory_bound_class_is_refused(tmp_path):
    with open(KERNELS, encoding="utf-8") as f:
        text = f.read()
    path = tmp_path / "kernels.yaml"
    figure = '{"efficiency": 0.5, "source": "a page", "shapes": "all"}'
    path.write_text(text + f"  K80:\n    fp32:\n      elementwise: {figure}\n")
    with pytest.raises(ConfigError, match="memory-bound operations take `bandwidth`"):
        kernel_table(str(path))
