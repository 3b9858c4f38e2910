"""What the profile of stage timing costs (harness/profile.py): samples/s of a text pipeline with
the profile on beside off, through the harness's own timed dataset and collate, in one process,
rounds alternating which goes first.

The pipeline is the kind the profile is for and its worst case: a pure-Python tokenizer (lower-case,
split, a word-piece loop over each word's prefixes, dict look-ups), many small calls per sample,
each of which the profiler hooks. The profile runs only in the warm-up (see harness/profile.py), on
its first MOST_SAMPLES samples (every other one profiled), so what it costs a cell is those samples'
slower rate, including the time to name the functions once (`naming`, in the worker, before its last
profiled batch goes): the window with the profile less the window without.

    PYTHONPATH=workflow .venv/bin/python benchmarks/stage_profile.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
import torch
from feedbench.harness.profile import MOST_SAMPLES, SampleProfile
from feedbench.harness.stages import TimedCollate, TimedSamples
from torch.utils.data import DataLoader, Dataset, default_collate

BATCH = 16
WORDS = (
    "the quick brown fox jumps over the lazy dog while a slow tokenizer splits every "
    "word it sees".split()
)
VOCAB = {w[:n]: i for i, w in enumerate(WORDS) for n in range(1, len(w) + 1)}


def word_pieces(word: str) -> list[int]:
    """Greedy longest-prefix pieces of a word, as a word-piece tokenizer does."""
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start and word[start:end] not in VOCAB:
            end -= 1
        pieces.append(VOCAB.get(word[start:end], 0))
        start = max(end, start + 1)
    return pieces


def tokenize(text: str) -> list[int]:
    return [piece for word in text.lower().split() for piece in word_pieces(word)]


class Texts(Dataset):
    def __init__(self, n: int):
        self.texts = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(1024)) for i in range(n)]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> torch.Tensor:
        ids = tokenize(self.texts[index])[:256]
        return torch.tensor(ids + [0] * (256 - len(ids)))


class Named(SampleProfile):
    """The harness's profile, its naming of the functions timed."""

    def result(self) -> dict:
        start = time.perf_counter()
        self.found = super().result()
        self.naming_ms = (time.perf_counter() - start) * 1000
        return self.found


def one_pass(dataset: Dataset, profile: SampleProfile | None) -> float:
    """samples/s of one pass over the dataset, 0 workers, its samples timed (and profiled with a
    profile)."""
    loader = DataLoader(
        TimedSamples(dataset, profile),
        batch_size=BATCH,
        collate_fn=TimedCollate(default_collate),
        num_workers=0,
    )
    start = time.perf_counter()
    for _ in loader:
        pass
    return len(dataset) / (time.perf_counter() - start)


def alone_ms(dataset: Texts) -> tuple[float, float]:
    """CPU ms per sample of tokenize alone and of the whole __getitem__, unprofiled: what the
    profile should give."""
    cpu = []
    for call in (lambda i: tokenize(dataset.texts[i]), dataset.__getitem__):
        start = time.thread_time()
        for i in range(len(dataset)):
            call(i)
        cpu.append((time.thread_time() - start) * 1000 / len(dataset))
    return cpu[0], cpu[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--samples", type=int, default=MOST_SAMPLES, help="made in a pass (the profile's window)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dataset = Texts(args.samples)
    one_pass(dataset, None)  # imports, allocator
    with_, without, naming = [], [], []
    for round_ in range(args.rounds):
        for profiled in (True, False) if round_ % 2 else (False, True):
            if not profiled:
                without.append(one_pass(dataset, None))
                continue
            # ends after MOST_SAMPLES samples, or with the pass
            profile = Named(batches=10**9, worker=None)
            with_.append(one_pass(dataset, profile))
            if not hasattr(profile, "found"):  # a pass shorter than the profile's window
                profile.result()
            naming.append(profile.naming_ms)
    figures = {
        "with": statistics.median(with_),
        "without": statistics.median(without),
        "naming_ms": statistics.median(naming),
    }
    figures["added_ms"] = (
        args.samples / figures["with"] - args.samples / figures["without"]
    ) * 1000
    named = profile.found
    tokenize_ms, sample_ms = alone_ms(dataset)
    print(
        f"{args.samples} samples a pass, batch {BATCH}, 0 workers, {args.rounds} rounds, load "
        f"average {os.getloadavg()[0]:.2f}: {figures['without']:.0f} samples/s without the "
        f"profile, {figures['with']:.0f} with it (ratio "
        f"{figures['with'] / figures['without']:.3f}; rounds "
        f"{', '.join(f'{a / b:.2f}' for a, b in zip(with_, without, strict=True))}): the profile "
        f"adds {figures['added_ms']:.0f} ms to the warm-up, naming the functions "
        f"{figures['naming_ms']:.1f} ms of it; a profiled sample costs {named['slowdown']:.1f} "
        "times one without; named: "
        + ", ".join(
            f"{f['name']} {100 * f['share']:.0f} % ({f['ms']:.3f} ms)"
            for f in named["functions"][:3]
        )
        + f" of {named['cpu_ms_per_sample']:.3f} ms a sample; measured alone: tokenize "
        f"{tokenize_ms:.3f} ms of {sample_ms:.3f} ms a sample ("
        f"{100 * tokenize_ms / sample_ms:.0f} %)",
        flush=True,
    )
    return figures


if __name__ == "__main__":
    main()
