"""Embedding, mean over the real tokens, and an MLP: a small classifier whose forward takes named
inputs."""

from __future__ import annotations

import torch
from torch import nn


class ReviewClassifier(nn.Module):
    def __init__(self, vocab_size: int = 512, dim: int = 128, hidden: int = 512, classes: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(self.embed.weight.dtype)
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(pooled)
