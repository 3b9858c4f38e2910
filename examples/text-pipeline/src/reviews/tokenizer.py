"""A byte-pair-encoding tokenizer in pure Python, without a cache: slow, as hand-written tokenizers
are."""

from __future__ import annotations

import collections
import re

WORD = re.compile(r"[a-z]+|[0-9]+|[^\sa-z0-9]")


class BPETokenizer:
    """Learns `merges` pair merges from the texts; encodes a word by applying the best-ranked merge
    until none fits."""

    def __init__(self, texts: list[str], merges: int = 400):
        words = collections.Counter(w for text in texts for w in WORD.findall(text.lower()))
        corpus = {tuple(word): count for word, count in words.items()}
        self.ranks: dict[tuple[str, str], int] = {}
        for rank in range(merges):
            pairs = collections.Counter()
            for symbols, count in corpus.items():
                for pair in zip(symbols, symbols[1:], strict=False):
                    pairs[pair] += count
            if not pairs:
                break
            best = max(pairs, key=pairs.get)
            self.ranks[best] = rank
            corpus = {merge(symbols, best): count for symbols, count in corpus.items()}
        symbols = sorted({c for word in words for c in word} | {a + b for a, b in self.ranks})
        self.vocab = {symbol: i + 2 for i, symbol in enumerate(symbols)}  # 0: padding, 1: unknown

    def __len__(self) -> int:
        return len(self.vocab) + 2

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in WORD.findall(text.lower()):
            ids.extend(self.vocab.get(symbol, 1) for symbol in self.bpe(word))
        return ids

    def bpe(self, word: str) -> tuple[str, ...]:
        symbols = tuple(word)
        while len(symbols) > 1:
            ranked = [
                (self.ranks.get(pair, len(self.ranks)), pair)
                for pair in zip(symbols, symbols[1:], strict=False)
            ]
            rank, pair = min(ranked)
            if rank == len(self.ranks):
                break
            symbols = merge(symbols, pair)
        return symbols


def merge(symbols: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    """The symbols with every adjacent occurrence of `pair` joined into one."""
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)
