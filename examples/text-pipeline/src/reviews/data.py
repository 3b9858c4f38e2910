"""Reviews read from jsonl shards (one {"text", "label"} object a line) and a padding collate."""

from __future__ import annotations

import glob
import json
import os

import torch
from torch.utils.data import Dataset

from .tokenizer import BPETokenizer


class ReviewShards(Dataset):
    """Every line of every shard under `data_dir`, tokenized when a sample is read."""

    def __init__(self, data_dir: str, merges: int = 400, max_tokens: int = 256):
        self.rows = []
        for path in sorted(glob.glob(os.path.join(data_dir, "*.jsonl"))):
            with open(path) as f:
                self.rows.extend(json.loads(line) for line in f if line.strip())
        if not self.rows:
            raise FileNotFoundError(f"no *.jsonl shard in {data_dir}")
        self.tokenizer = BPETokenizer([row["text"] for row in self.rows[:100]], merges)
        self.max_tokens = max_tokens

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = self.rows[index]
        ids = self.tokenizer.encode(row["text"])[: self.max_tokens]
        return {"input_ids": torch.tensor(ids, dtype=torch.long), "label": row["label"]}


def pad_collate(samples: list[dict]) -> dict:
    """Pads the batch to its longest sample; the mask marks the real tokens."""
    longest = max(len(s["input_ids"]) for s in samples)
    input_ids = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, sample in enumerate(samples):
        input_ids[row, : len(sample["input_ids"])] = sample["input_ids"]
    return {
        "input_ids": input_ids,
        "attention_mask": input_ids != 0,
        "labels": torch.tensor([s["label"] for s in samples]),
    }
