"""How wrong the predictions for a target GPU are: writes docs/results/prediction-error.md.

    .venv/bin/python benchmarks/prediction_error.py            # rewrites docs/results/prediction-error.md
    .venv/bin/python benchmarks/prediction_error.py --print    # prints it instead
    .venv/bin/python benchmarks/prediction_error.py --write-counts  # recounts the published cells

Compute, two checks of the target's estimate (feedbench.core.estimate, core.kernels: each counted
operation at its GPU's public kernel figures, fitted to no throughput): the public end-to-end
training results of one GPU in benchmarks/public_training.csv (ResNet-50 and BERT-large on V100s,
A100s and H100s, fp32, TF32 and mixed precision), each counted here on the meta device (the
BERT-large as BertSquad below), with the goals of issue #51; and every published GPU throughput of
the scaling, nmt and prefetch studies (report/references/), beside the family estimate fitted to
them leave one study out. About a minute, most of it counting BERT and the studies' LSTMs on the
meta device (the studies' counts are read from feedbench/harness/published_counts.json, which
--write-counts rewrites after a change to the counting, a preset or a reference). Copy: the batch's
bytes over the link against this machine's transfer probe (a host memcpy without a GPU), and against
the one copy a GPU of ours has published (docs/results/gpu-validation.md).
tests/core/test_estimate.py checks the page is what this script prints.
"""  # noqa: E501

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import textwrap
from dataclasses import dataclass
from functools import lru_cache

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
import torch
from feedbench.core.ceilings import batch_bytes
from feedbench.core.cell import parse_cell
from feedbench.core.estimate import (
    HOST_SECONDS,
    HOST_SOURCE,
    MEASURE_OVER,
    PUBLISHED_BOUND,
    compute_range,
    compute_seconds,
    host_bound,
    host_seconds,
    summarize,
    summary_table,
)
from feedbench.core.kernels import (
    NCHW_PASSES,
    bandwidth_share,
    gpu_figures,
    kernel_figure,
    kernel_seconds,
    kernel_table,
)
from feedbench.core.target import (
    DTYPES,
    PAGEABLE_SHARE,
    PINNED_SHARE,
    Target,
    copy_seconds,
    find_gpu,
    gpu_table,
    link_seconds,
)
from feedbench.harness.flops import (
    count_module,
    count_once,
    published_error,
    write_published_counts,
)
from feedbench.harness.transfer import probe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "results", "prediction-error.md")
PUBLIC = os.path.join(ROOT, "benchmarks", "public_training.csv")
# Sizes of the local transfer probe; the largest gives the link figure the others are predicted
# with.
PROBE_SIZES = [64 * 1024, 1024**2, 16 * 1024**2, 64 * 1024**2]
# The one GPU copy we have published: docs/results/gpu-validation.md, H200 run of 2026-11-25, the
# h2d phase of tests/harness/test_gpu.py::test_sync_timing_keeps_the_stream_prefetch_overlap (a
# pinned batch of 128 images of 256 px).
H200_COPY = {"knobs": {"image_size": 256, "batch_size": 128, "model": "sleep"}, "measured_ms": 1.92}
# Issue #51's goals on the public results (factors of the estimate against each) and on the studies'
# one-GPU cells (the median error).
GOAL_MEDIAN, GOAL_WORST, GOAL_HELD, GOAL_STUDY_MEDIAN = 1.25, 1.6, 0.8, 0.25


def para(text: str) -> list[str]:
    """A paragraph of the page, wrapped."""
    return textwrap.wrap(text, width=115, break_on_hyphens=False) + [""]


class BertLayer(torch.nn.Module):
    """One encoder layer of BERT as NVIDIA's PyTorch BERT writes it: query, key and value
    projections, scores scaled and softmaxed, dropout on the probabilities, the context projected
    and added back under a LayerNorm; then a GELU feed-forward of 4x the width, added back under a
    second LayerNorm. Each step its own kernel (no fused attention), as eager PyTorch runs it."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value, self.out = (
            torch.nn.Linear(width, width) for _ in range(4)
        )
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.dropout = torch.nn.Dropout(0.1)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        return x.view(batch, tokens, self.heads, width // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        context = (self.dropout(torch.softmax(scores, dim=-1)) @ v).transpose(1, 2).flatten(2)
        x = self.norm1(x + self.dropout(self.out(context)))
        return self.norm2(x + self.dropout(self.down(torch.nn.functional.gelu(self.up(x)))))


class BertSquad(torch.nn.Module):
    """BERT-large fine-tuned on SQuAD, for counting only: word, position and segment embeddings of
    1,024 over a 30,522-word vocabulary, 24 layers of 16 heads (BertLayer), and the span head (two
    logits a token). Its loss is the mean of the start and end positions' cross-entropies."""

    def __init__(self, layers: int = 24, width: int = 1024, heads: int = 16, vocab: int = 30522):
        super().__init__()
        self.words, self.positions = (
            torch.nn.Embedding(vocab, width),
            torch.nn.Embedding(512, width),
        )
        self.segments = torch.nn.Embedding(2, width)
        self.norm, self.dropout = torch.nn.LayerNorm(width), torch.nn.Dropout(0.1)
        self.layers = torch.nn.ModuleList(BertLayer(width, heads) for _ in range(layers))
        self.span = torch.nn.Linear(width, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        places = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.words(tokens) + self.positions(places) + self.segments(torch.zeros_like(tokens))
        x = self.dropout(self.norm(x))
        for layer in self.layers:
            x = layer(x)
        return self.span(x)


def span_loss(output: torch.Tensor, batch: tuple) -> torch.Tensor:
    start, end = output.float().unbind(-1)
    return (
        torch.nn.functional.cross_entropy(start, batch[1])
        + torch.nn.functional.cross_entropy(end, batch[1])
    ) / 2


# BERT's sequence length in SQuAD fine-tuning (Lambda's bert_large_squad).
SQUAD_TOKENS = 384


@lru_cache(maxsize=8)
def count_bert(batch: int, amp: str):
    """BertSquad's step counted at `batch` sequences of SQUAD_TOKENS under `amp`, with AdamW (its
    fine-tuning optimizer)."""
    cell = parse_cell({"amp": amp, "optimizer": "adamw", "batch_size": batch})
    meta = torch.device("meta")
    inputs = torch.zeros(batch, SQUAD_TOKENS, dtype=torch.long, device=meta)
    positions = torch.zeros(batch, dtype=torch.long, device=meta)
    return count_module(cell, BertSquad, (inputs, positions), span_loss, "transformer")


@dataclass(frozen=True)
class PublicRow:
    """One public training result (benchmarks/public_training.csv) and the estimate of its step."""

    row: dict  # as the file gives it
    knobs: dict  # what it ran, as feedbench's knobs
    published: float  # samples/s of the one GPU
    estimated: float  # samples/s the estimate gives
    low: float  # the range of the estimate, samples/s (the slow end)
    high: float | None  # its fast end; None: open (a host-bound cell is open above in time)
    host_bound: bool

    @property
    def ratio(self) -> float:
        """Estimated over published: above 1, the estimate is too fast."""
        return self.estimated / self.published

    @property
    def factor(self) -> float:
        return max(self.ratio, 1 / self.ratio)

    @property
    def holds(self) -> bool:
        return self.low <= self.published and (self.high is None or self.published <= self.high)


def public_rows(path: str = PUBLIC) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def row_knobs(row: dict) -> dict:
    """The knobs of a public row: its batch, autocast, layout and matmul precision (tf32: float32
    matmuls on TF32, as NVIDIA's containers run them); ResNet-50 with SGD, momentum and weight
    decay."""
    knobs = {
        "batch_size": int(row["batch_size"]),
        "amp": "fp16" if row["precision"] == "amp" else "off",
        "channels_last": row["channels_last"] == "true",
        "matmul_precision": "high" if row["precision"] == "tf32" else "highest",
    }
    if row["model"] == "resnet50":
        knobs.update(model="resnet50", momentum=0.9, weight_decay=1e-4)
    return knobs


def row_work(row: dict, knobs: dict):
    """The counted step of a public row (layout and matmul precision change no count)."""
    if row["model"] == "bert_large_squad":
        return count_bert(knobs["batch_size"], knobs["amp"])
    return count_once(
        {k: v for k, v in knobs.items() if k not in ("channels_last", "matmul_precision")}
    )


def public_predictions(predictions) -> list[PublicRow]:
    """Every public row estimated on its GPU, with the range a target would print (its compute's
    range from the studies' cells, core.estimate.compute_range; open above in time where the cell is
    host-bound)."""
    found = []
    for row in public_rows():
        knobs, gpu = row_knobs(row), find_gpu(row["gpu"])
        work = row_work(row, knobs)
        seconds = compute_seconds(work, knobs, gpu, {}, per_op=True)[0]
        spread, bound = compute_range(predictions, work.family), host_bound(work, seconds)
        batch = knobs["batch_size"]
        found.append(
            PublicRow(
                row,
                knobs,
                float(row["throughput"]),
                batch / seconds,
                0.0 if bound else batch / (seconds * spread.high),
                batch / (seconds * spread.low),
                bound,
            )
        )
    return found


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def goals(public: list[PublicRow], studies: list) -> list[str]:
    """Issue #51's goals, each with the figure reached."""
    factors = [r.factor for r in public]
    held = sum(r.holds for r in public) / len(public)
    worst = max(public, key=lambda r: r.factor)
    study = summarize([p for p in studies if p.cell.gpus == 1])
    return [
        "| goal | reached | |",
        "|---|---|---|",
        f"| median factor at most {GOAL_MEDIAN}x on the {len(public)} public results | "
        f"{statistics.median(factors):.2f}x | {_met(statistics.median(factors) <= GOAL_MEDIAN)} |",
        f"| worst factor at most {GOAL_WORST}x | {worst.factor:.2f}x ({worst.row['model']}, "
        f"{worst.row['gpu']}, {worst.row['precision']}, {worst.row['source']}) | "
        f"{_met(worst.factor <= GOAL_WORST)} |",
        f"| the range holds the published figure in at least {100 * GOAL_HELD:.0f} % of them | "
        f"{100 * held:.0f} % | {_met(held >= GOAL_HELD)} |",
        f"| the studies' {study.cells} one-GPU cells: median error at most "
        f"{100 * GOAL_STUDY_MEDIAN:.0f} % | {100 * study.median_error:.1f} % (a factor of "
        f"{study.median_factor:.2f}) | {_met(study.median_error <= GOAL_STUDY_MEDIAN)} |",
        "",
    ]


def public_table(public: list[PublicRow]) -> list[str]:
    """The validation table: each public result, the estimate, the factor and the range."""
    lines = [
        "| source | model | GPU (card) | precision | batch | published /s | estimated /s | "
        "factor | "
        "range /s | holds | host-bound |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in public:
        way = "too fast" if r.ratio > 1 else "too slow"
        low = "open" if r.host_bound else f"{r.low:,.1f}"
        layout = ", NHWC" if r.knobs["channels_last"] else ""
        lines.append(
            f"| [{r.row['source']}]({r.row['url']}) | {r.row['model']} | {r.row['gpu']} "
            f"({r.row['hardware']}) | {r.row['precision']}{layout} | {r.row['batch_size']} | "
            f"{r.published:,.1f} {r.row['unit']} | {r.estimated:,.1f} | {r.factor:.2f}x {way} | "
            f"{low} to {r.high:,.1f} | {'yes' if r.holds else 'no'} | "
            f"{'yes' if r.host_bound else 'no'} |"
        )
    return lines + [""]


def by_group(public: list[PublicRow]) -> list[str]:
    """The factors per model and precision: where the estimate errs which way."""
    lines = [
        "| model | precision | results | median factor (estimated / published) | range of it |",
        "|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[float]] = {}
    for r in public:
        groups.setdefault((r.row["model"], r.row["precision"]), []).append(r.ratio)
    for (model, precision), ratios in groups.items():
        lines.append(
            f"| {model} | {precision} | {len(ratios)} | {statistics.median(ratios):.2f} | "
            f"{min(ratios):.2f} to {max(ratios):.2f} |"
        )
    return lines + [""]


def public_section(public: list[PublicRow], studies: list) -> list[str]:
    example = compute_range(studies, "transformer")
    return [
        "## The estimate against public single-GPU training results",
        "",
        *para(
            "What a target's compute estimate gives for public end-to-end training results of one "
            "GPU, none of which it was fitted to (benchmarks/public_training.csv: each row's page, "
            "batch and layout; NVIDIA's DeepLearningExamples tables and Lambda's benchmark "
            "results; no MLPerf training result states one GPU). Each step is counted on the meta "
            "device (ResNet-50: torchvision's, ResNet-50 v1.5; BERT-large: "
            "benchmarks/prediction_error.py's BertSquad at 384 tokens), each operation priced at "
            "the GPU's kernel figures in its math path (next section). The range is the one the "
            f'section "On <target>" prints: {example.source} (core.estimate.compute_range), '
            f"{example.span:.2f}x wide, so every row says measure there (over {MEASURE_OVER}x); a "
            "host-bound row is open at its slow end."
        ),
        *goals(public, studies),
        *public_table(public),
        *para(
            "Factor: estimated over published samples/s, as a factor of at least 1 whichever way. "
            "By model and precision, estimated over published:"
        ),
        *by_group(public),
    ]


def _rule(how: str) -> str:
    """The rule of kernels.yaml a figure came by, as the page's short tag."""
    if how == "measured":
        return "measured"
    if "the same chip" in how:
        return "rule 3"
    if "ratio" in how:
        return "rule 4"
    if "median" in how:
        return "rule 5"
    return "rule 1-2"


def _measured(kind: str, how: str) -> bool:
    """Whether a figure was measured on the GPU itself, in its dtype or the other 16-bit one (the
    same tensor cores at the same rate)."""
    halves = ("fp16", "bf16")
    return how == "measured" or (kind in halves and how.split()[-1] in halves and "chip" not in how)


def figures_used() -> tuple[list[str], list[str]]:
    """Per GPU and dtype of gpus.yaml, what each compute class takes (kernel_figure), and the
    measurements that would replace the figures no one measured."""
    lines = [
        "| GPU | dtype | matmul | convolution | recurrent |",
        "|---|---|---|---|---|",
    ]
    missing = []
    for gpu, row in gpu_table().items():
        for kind in DTYPES:
            if row["peak_tflops"][kind] is None:
                continue
            cells = []
            for op_class in ("matmul", "convolution", "recurrent"):
                figure = kernel_figure(gpu, kind, op_class)
                cells.append(f"{figure.efficiency:.3f} ({_rule(figure.how)})")
                if not _measured(kind, figure.how):
                    missing.append((gpu, kind, op_class))
            lines.append(f"| {gpu} | {kind} | {' | '.join(cells)} |")
    closes: dict[str, dict[str, list[str]]] = {}
    for gpu, kind, op_class in missing:
        closes.setdefault(gpu, {}).setdefault(kind, []).append(op_class)
    wanted = [
        f"* {gpu}: " + "; ".join(f"{kind} {', '.join(classes)}" for kind, classes in kinds.items())
        for gpu, kinds in closes.items()
    ]
    return lines + [""], wanted


def measured_table() -> list[str]:
    lines = ["| GPU | dtype | class | efficiency | shapes | source |", "|---|---|---|---|---|---|"]
    for (gpu, kind), rows in kernel_table().items():
        for name, value in rows.items():
            figure = gpu_figures(gpu, kind, name)
            lines.append(
                f"| {gpu} | {kind} | {name} | {value:.3f} | {figure['shapes']} | "
                f"{figure['source']} |"
            )
    return lines + [""]


def kernels_section() -> list[str]:
    used, wanted = figures_used()
    return [
        "## What each GPU achieves, per math path (workflow/feedbench/core/kernels.yaml)",
        "",
        *para(
            "Measured figures, each an achieved throughput over the GPU's peak of that dtype in "
            "gpus.yaml, from kernel-level measurements only: DeepBench's GEMM, convolution and "
            "LSTM training kernels, PyTorch's documented A100 matmul timings, and the maximum "
            "achievable "
            "matmul FLOPS table of Stas Bekman's Machine Learning Engineering."
        ),
        *measured_table(),
        *para(
            "Memory-bound operations (elementwise, normalisation, reductions, the optimizer's "
            f"update) are priced at {bandwidth_share():.3f} of the datasheet bandwidth (a "
            "streaming "
            "kernel's share: te42kyfo/gpu-benches' gpu-stream scale kernel on an H100 PCIe, "
            "1,704 of 2,000 GB/s; its V100 triad reached 0.91). A convolution on tensor cores "
            f"whose activations are NCHW (no channels_last) moves its bytes {NCHW_PASSES} times "
            "more, for cuDNN's transposes to NHWC and back. The host's time per counted kernel is "
            f"{1e6 * HOST_SECONDS:.0f} us (core.estimate.HOST_SECONDS: our H200's ResNet-18 "
            "step, below); a step takes the longer of the host's and the GPU's time, and is "
            "host-bound where the host's is at least half of it."
        ),
        *para(
            "What every GPU and dtype of gpus.yaml takes for each class: its own measured figure, "
            "or by the rules of kernels.yaml (1-2: the same GPU's other tensor-core dtype; 3: the "
            "same chip's other card; 4: the GPU's matmul figure times the V100's ratio of the "
            "class to its matmuls; 5: the median of the GPUs measured in that path)."
        ),
        *used,
        *para(
            "Where a GPU lacks a sourced figure of its own (rules 3 to 5, and rule 1-2 across "
            "tf32 and 16 bits), the measurement that would close it is that kernel timed on that "
            "GPU: cuBLAS GEMMs at training shapes (M, N and K of 512 to 8,192) for a matmul; "
            "cuDNN's forward and both backward passes of ResNet-50's layers at a training batch, "
            "in the layout a model runs, for a convolution; a cuDNN LSTM of hidden 512 to 2,048 at "
            "batch 64 to 360 for a recurrent layer. They are:"
        ),
        *wanted,
        "",
        *para(
            "Two corrections to the table's DeepBench figures. Its shape note said the selected "
            "GEMMs have K of 512 to 500,000: the set with M, N and K all at least 128 has K of 512 "
            "to 4,096 only (DeepBench's larger K come with an N or M under 128). And the LSTM "
            "figure was the mean over six machine-translation LSTMs of hidden 512, 1,024 and "
            "2,048, 0.396 of the P100's peak; DeepBench's LSTM efficiency rises steeply with the "
            "width and the batch (0.05 to 0.67 across them), so that mean priced the nmt study's "
            "512-wide layers as if they were wider. The figure is now the one shape nearest the "
            "study's, hidden 512 at batch 128 (the sheet's largest batch; the study's is 360): "
            "0.293 on the P100, 0.333 on the V100."
        ),
    ]


def study_side_by_side(family: list, kernels: list) -> list[str]:
    lines = [
        "| study | family: median | family: worst | kernels: median | kernels: worst |",
        "|---|---|---|---|---|",
    ]
    one = {
        name: [p for p in group if p.cell.gpus == 1]
        for name, group in (("family", family), ("kernels", kernels))
    }
    for study in [*PUBLISHED_BOUND, "all one-GPU cells"]:
        row = []
        for name in ("family", "kernels"):
            cells = [p for p in one[name] if study not in PUBLISHED_BOUND or p.cell.study == study]
            s = summarize(cells)
            way = "too fast" if s.worst_too_fast else "too slow"
            row += [
                f"{100 * s.median_error:.1f} % ({s.median_factor:.2f}x)",
                f"{s.worst_factor:.2f}x {way}",
            ]
        lines.append(f"| {study} | {' | '.join(row)} |")
    return lines + [""]


def cell_table(predictions) -> list[str]:
    lines = [
        "| study | published cell | GPU | published ms/step | estimated ms/step | share of the "
        "roofline | absolute error | factor | host-bound | bound: published, estimated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in predictions:
        way = "too fast" if p.too_fast else "too slow"
        lines.append(
            f"| {p.cell.study} | {p.cell.label} | {p.cell.gpu.name} | "
            f"{1000 * p.cell.published_step_s:.1f} | {1000 * p.step_s:.1f} | {p.efficiency:.3f} | "
            f"{100 * p.error:.1f} % | {p.factor:.2f}x {way} | {'yes' if p.host_bound else 'no'} | "
            f"{PUBLISHED_BOUND[p.cell.study][0]}, {p.bound} |"
        )
    return lines + [""]


def studies_section(family, efficiencies, kernels) -> list[str]:
    fitted_to = {
        "cnn": "scaling (ResNet-50, K80)",
        "rnn": "nmt (LSTM, P100)",
        "mlp": "prefetch (MLP, RTX 2080 Ti)",
    }
    return [
        "## The studies' published GPU throughputs",
        "",
        *para(
            "Every published GPU throughput of the scaling, nmt and prefetch studies "
            "(report/references/, docs/studies.md), each counted on the model of its study's "
            "preset "
            "at full size. The target's estimate (each operation at its GPU's kernel figures) is "
            "fitted to none of them; the K80 and the RTX 2080 Ti have no kernel figure of their "
            "own (rule 5). Its error, all cells and by study:"
        ),
        *summary_table(kernels),
        "",
        *para(
            "Error: |predicted - published| / published samples/s of one GPU, and as a factor, exp "
            "|ln(predicted / published)|, with the way the worst is off. 79 of the cells are "
            "nmt's. "
            "The estimate models one GPU's step: the multi-GPU cells add communication it does not "
            "model. The family estimate, which a target used before (the step's roofline over an "
            "efficiency per model family fitted to the studies), held out one study at a time:"
        ),
        *summary_table(family),
        "",
        "The family efficiencies, fitted to all three studies (one-GPU rows):",
        "",
        "| family | efficiency (share of the roofline) | fitted to |",
        "|---|---|---|",
        *(
            f"| {name} | {value:.3f} | "
            f"{fitted_to.get(name, 'geometric mean of the three studies')} |"
            for name, value in efficiencies.items()
        ),
        "",
        "The one-GPU cells side by side: median error (median factor) and worst factor per study.",
        "",
        *study_side_by_side(family, kernels),
        "The published bound of every cell, and the evidence:",
        "",
        *(f"* {study}: {bound}: {why}." for study, (bound, why) in PUBLISHED_BOUND.items()),
        "",
        "Every cell, by the target's estimate:",
        "",
        *cell_table(kernels),
    ]


class StudyNmt(torch.nn.Module):
    """The nmt study's model as docs/studies.md describes it, for counting only: source and target
    embeddings of 512 over 50K words, a bidirectional LSTM encoder of 512 units a direction
    (`bi_layers` layers of both directions), a 4-layer LSTM decoder of 512, Luong attention (the
    memory projected to 512, dot scores, the context beside the decoder's output through a 512 tanh
    layer) and the 50K-word head. The study's code is not stored here: the attention's form and what
    "4-layer bidirectional" means (TensorFlow NMT's "bi" encoder builds num_layers / 2 bidirectional
    layers) are readings, so the page gives both encoders."""

    def __init__(self, bi_layers: int, vocab: int = 50_000, dim: int = 512):
        super().__init__()
        self.source, self.target = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(vocab, dim)
        self.encoder = torch.nn.LSTM(dim, dim, bi_layers, bidirectional=True, batch_first=True)
        self.decoder = torch.nn.LSTM(dim, dim, 4, batch_first=True)
        self.memory = torch.nn.Linear(2 * dim, dim, bias=False)
        self.attention = torch.nn.Linear(3 * dim, dim, bias=False)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, source, target):
        memory, _ = self.encoder(self.source(source))
        output, _ = self.decoder(self.target(target))
        weights = torch.softmax(output @ self.memory(memory).transpose(1, 2), dim=-1)
        attended = torch.tanh(self.attention(torch.cat([output, weights @ memory], dim=-1)))
        return self.head(attended)


def study_nmt_flops(bi_layers: int, batch: int, length: int) -> float:
    """FLOPs of a training step of StudyNmt on the meta device (forward, loss, backward), source and
    target of `length` words, as feedbench.harness.flops counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = StudyNmt(bi_layers)
        words = torch.zeros(batch, length, dtype=torch.long)
    with FlopCounterMode(display=False) as flops:
        logits = model(words, words)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), words.flatten()).backward()
    return float(flops.get_total_flops())


def nmt_model_gap(predictions) -> list[str]:
    """The page's lines on what the nmt preset counts (a language model) against the study's
    encoder-decoder."""
    cell = next(p.cell for p in predictions if p.cell.study == "nmt" and p.cell.gpus == 1)
    knobs = cell.knobs
    counted = count_once(knobs).flops
    batch, length = knobs["batch_size"], knobs["seq_len"]
    two, four = (study_nmt_flops(layers, batch, length) for layers in (2, 4))
    return [
        "* **Other models than the study's.** The nmt preset's estimate counts its own model, a "
        "4-layer LSTM",
        f"  language model over {length} tokens ({counted / 1e12:.2f} TFLOPs a step at batch "
        f"{batch}). The study trained an",
        "  encoder-decoder: counted the same way on a model of its documented shape "
        "(benchmarks/prediction_error.py,",
        f"  StudyNmt: source and target of {length} words), a step is {two / 1e12:.2f} TFLOPs "
        "with TensorFlow NMT's reading of a 4-layer",
        f"  bidirectional encoder (2 layers of both directions) and {four / 1e12:.2f} with 4: "
        f"{two / counted:.2f} to {four / counted:.2f} times",
        "  what the preset counts. Where the step is FLOP-bound, the preset's count puts the "
        "study's step that",
        "  much too fast before any kernel figure; the family efficiency fitted with nmt absorbs "
        "it, the kernels",
        "  do not. The study's code is not stored here: the attention's form is a reading too. "
        "The fused and the",
        "  step-by-step LSTM count the same FLOPs; the kernels price the fused layer at "
        "DeepBench's LSTM figure",
        "  and the loop's matmuls at its GEMM figure, which TensorFlow's dynamic_rnn does not "
        "reach at batch 360.",
    ]


def weakest(kernels, public: list[PublicRow]) -> list[str]:
    h200, resnet = find_gpu("H200"), count_once(HOST_SOURCE["knobs"])
    gpu_s = sum(kernel_seconds(resnet, HOST_SOURCE["knobs"], h200).values())
    slowest = max(public, key=lambda r: r.factor)
    host = max(kernels, key=lambda p: host_seconds(count_once(p.cell.knobs)) / p.compute_s)
    host_share = host_seconds(count_once(host.cell.knobs)) / host.compute_s
    return [
        "## Where the method is weakest",
        "",
        *para(
            "Tensor-core convolutions. No public kernel-level figure of a convolution on an A100 "
            "or "
            "an H100 was found: their convolutions take the GPU's matmul figure times the V100's "
            "ratio of convolutions to matmuls (DeepBench, fp16, NHWC, batch 4 to 32). The worst "
            f"public row, {slowest.row['model']} {slowest.row['precision']} on "
            f"{slowest.row['gpu']} ({slowest.row['source']}, NCHW), is estimated "
            f"{slowest.factor:.2f}x "
            "too fast: its NCHW convolutions and batch norms in 16 bits run slower than the "
            "transposes priced here. The V100's own convolution figure comes from small batches "
            "and errs the other way (its ResNet-50 rows come out too slow)."
        ),
        *para(
            "TF32 on an H100. No public TF32 matmul rate of an H100 was found: it takes the H100's "
            "bf16 figure (rule 1-2), and its TF32 BERT rows come out too fast."
        ),
        *para(
            "Small, fixed costs. The prefetch study's 1-layer MLP spends more than half its step "
            "outside its two matmuls (the pageable copy, the loss): the kernels price it about 2x "
            "too fast. The host's time per kernel "
            f"({1e6 * HOST_SECONDS:.0f} us) is our H200's ResNet-18 of 64 px at batch 64: "
            f"{1000 * HOST_SOURCE['step_s']:.1f} ms a step (docs/results/gpu-validation.md, 7215 "
            f"samples/s) over its {resnet.kernels} counted kernels, where the GPU's work is "
            f"{1000 * gpu_s:.1f} ms; it is that cell's source, not a check of it. It binds nowhere "
            f"in the public rows; among the studies' cells it is at most {100 * host_share:.0f} % "
            f"of an estimate ({host.cell.study}, {count_once(host.cell.knobs).kernels} kernels "
            "counted step by step: an overcount for the fused LSTM, whose cells then read "
            "host-bound)."
        ),
        *para(
            "Pageable copies. A copy from pageable memory is staged by the driver through a pinned "
            f"buffer: it is priced at {PAGEABLE_SHARE:.2f} of the link's peak (a pinned one at "
            f"{PINNED_SHARE:.2f}), from one public measurement each on PCIe 3.0 "
            "(feedbench.core.target). The prefetch study's copies are pageable."
        ),
        *para(
            "More GPUs. The estimate is one GPU's; in the published multi-GPU rows a GPU's step "
            "takes up to twice the one-GPU step (nmt, all-reduce at 8 GPUs): communication the "
            "estimate does not model, in their error."
        ),
        *nmt_model_gap(kernels),
        "",
        *para(
            "The bound. Every published GPU cell was compute-bound, and the studies publish no "
            "loader cost on their GPUs, so 100 % of bounds right says little: no published cell "
            "tests a data-bound call."
        ),
    ]


def copy_section() -> list[str]:
    cell = parse_cell(
        {"scenario": "transfer", "transfer_sizes": PROBE_SIZES, "steps": 30, "warmup_steps": 3}
    )
    rows, _ = probe(cell, torch.device("cpu"))
    measured = {
        size: statistics.median(r["ms"] for r in rows if r["size_bytes"] == size)
        for size in PROBE_SIZES
    }
    link = PROBE_SIZES[-1] / (measured[PROBE_SIZES[-1]] / 1000) / 1e9
    h200 = find_gpu("H200")
    h200_bytes = batch_bytes(H200_COPY["knobs"])
    h200_ms = 1000 * copy_seconds(h200_bytes, Target(h200, 2, 1.0, h200.h2d_gb_per_s))
    lines = [
        "## Copy: the batch's bytes over the link, against the transfer probe",
        "",
        "| where | bytes | link GB/s (from) | predicted ms | measured ms | absolute error |",
        "|---|---|---|---|---|---|",
        "| H200, pinned (docs/results/gpu-validation.md: a training cell's h2d phase, "
        f"2026-11-25) | {h200_bytes} | {h200.h2d_gb_per_s} x {PINNED_SHARE:.2f} (the table: PCIe "
        f"5.0 x16; the pinned share) | {h200_ms:.2f} | {H200_COPY['measured_ms']:.2f} | "
        f"{100 * abs(H200_COPY['measured_ms'] / h200_ms - 1):.1f} % |",
    ]
    for size in PROBE_SIZES[:-1]:
        # the probe's own rate, no share: it is no PCIe link
        predicted = 1000 * link_seconds(size, link)
        lines.append(
            f"| this machine, host memcpy (transfer probe, no GPU) | {size} | {link:.2f} (the "
            f"probe at {PROBE_SIZES[-1]} bytes) | {predicted:.3f} | {measured[size]:.3f} | "
            f"{100 * abs(measured[size] / predicted - 1):.1f} % |"
        )
    return lines + [
        "",
        "This machine has no GPU: its probe times a host memcpy, and the link figure is the "
        "probe's own at its",
        "largest size, so these rows test only the shape of the model (time proportional to "
        "bytes), not a bandwidth",
        "figure. They fail it: a host memcpy that fits in the CPU's caches runs several times "
        "faster than one from",
        "memory, which a copy over PCIe never does, so they say little about a GPU's link; the "
        "times also vary from",
        "run to run on a shared machine. The H200 row tests the table's figure and the pinned "
        "share: a copy is priced",
        f"at {PINNED_SHARE:.2f} of the link's peak where it is pinned (a P100's bandwidthTest "
        "over PCIe 3.0, Microway)",
        f"and {PAGEABLE_SHARE:.2f} where it is pageable (large pageable copies over PCIe 3.0, "
        "NVIDIA's forums; the",
        "sources: feedbench.core.target); this H200's pinned copy reached 0.83 of its PCIe 5.0 "
        "peak, so the share",
        "prices it long by the row's error.",
        "Whether the copy overlaps compute follows the cell's knobs "
        "(feedbench.core.ceilings.trainer_seconds, the",
        "same rule as the local prediction): a side stream (device_prefetch: stream) overlaps "
        "it, else it adds.",
        "",
    ]


HEADER = [
    "# Prediction error for a target GPU",
    "",
    *para(
        "Regenerate with `.venv/bin/python benchmarks/prediction_error.py`. What a `target:` "
        "predicts ([target.md](../target.md)) is estimated, not measured: this page says how wrong "
        "the estimates were where public numbers exist. The compute estimate counts a step's "
        "operations on the CPU (feedbench.harness.flops, torch.utils.flop_counter.FlopCounterMode "
        "on the meta device: each operation's class, FLOPs and bytes) and prices each at what its "
        "GPU achieves in the operation's math path by public kernel-level measurements "
        "(workflow/feedbench/core/kernels.yaml; the GPU's peaks: "
        "workflow/feedbench/core/gpus.yaml, "
        "each figure with its public source), memory-bound operations at the memory's achieved "
        "bandwidth, and the host's time where it is longer (feedbench.core.kernels, "
        "feedbench.core.estimate). It is fitted to no end-to-end throughput: those below are its "
        "check. The loader's prediction from one core to two (feedbench.analysis.loader_scaling) "
        "has its own page, [prediction-error-loader.md](prediction-error-loader.md), "
        "regenerated by "
        "benchmarks/loader_scaling_error.py."
    ),
]


def compute_section() -> list[str]:
    family, efficiencies = published_error(ROOT)
    kernels, _ = published_error(ROOT, per_op=True)
    public = public_predictions(kernels)
    return (
        public_section(public, kernels)
        + kernels_section()
        + studies_section(family, efficiencies, kernels)
        + weakest(kernels, public)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--print", action="store_true", help="print the page instead of writing it")
    parser.add_argument(
        "--write-counts",
        action="store_true",
        help="count every published cell afresh into feedbench/harness/published_counts.json first",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.write_counts:
        write_published_counts(ROOT)
    text = "\n".join(HEADER + compute_section() + copy_section())
    if args.print:
        sys.stdout.write(text)
        return
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
