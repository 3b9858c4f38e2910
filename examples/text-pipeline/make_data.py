"""Writes the example's shards, data/reviews-{0,1}.jsonl: short made-up reviews labelled by their
words.

python examples/text-pipeline/make_data.py   # the shards are in the repository; this remakes them
"""

from __future__ import annotations

import json
import os
import random

GOOD = "great wonderful reliable delightful comfortable excellent sturdy gorgeous".split()
BAD = "broken disappointing flimsy terrible unreliable awkward overpriced noisy".split()
NOUNS = (
    "battery screen handle packaging keyboard speaker strap hinge charger manual fabric lid".split()
)
FILLER = (
    "the this it was is and but really quite after before using with for my our every day week "
    "month arrived works worked feels looks seems compared previous model delivery support"
).split()


def review(rng: random.Random) -> dict:
    label = rng.randrange(2)
    words = []
    for _ in range(rng.randint(80, 160)):
        kind = rng.random()
        if kind < 0.12:
            words.append(rng.choice(GOOD if label else BAD))
        elif kind < 0.3:
            words.append(rng.choice(NOUNS))
        else:
            words.append(rng.choice(FILLER))
    return {"text": " ".join(words).capitalize() + ".", "label": label}


def main(out_dir: str, shards: int = 2, per_shard: int = 256) -> None:
    rng = random.Random(0)
    os.makedirs(out_dir, exist_ok=True)
    for shard in range(shards):
        with open(os.path.join(out_dir, f"reviews-{shard}.jsonl"), "w") as f:
            for _ in range(per_shard):
                f.write(json.dumps(review(rng)) + "\n")


if __name__ == "__main__":
    main(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
