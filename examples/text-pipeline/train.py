"""The training script as a user writes it: no feedbench in it. feedbench measures the same code
(config.yaml).

python examples/text-pipeline/train.py [--workers 2] [--steps 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.utils.data import DataLoader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "src"))
from reviews.data import ReviewShards, pad_collate  # noqa: E402
from reviews.model import ReviewClassifier  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    dataset = ReviewShards(os.path.join(HERE, "data"))
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        collate_fn=pad_collate,
        num_workers=args.workers,
    )
    model = ReviewClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step, start = 0, time.perf_counter()
    while step < args.steps:
        for batch in loader:
            logits = model(batch["input_ids"], batch["attention_mask"])
            loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == args.steps:
                break
    elapsed = time.perf_counter() - start
    print(f"{step * args.batch_size / elapsed:.0f} samples/s, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
