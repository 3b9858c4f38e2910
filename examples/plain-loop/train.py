"""A plain PyTorch training script: a sentiment classifier on generated product reviews.

A map-style dataset that tokenizes each review in pure Python when it is read, a collate that pads
into a dict, a small transformer, AdamW with a per-step warm-up and linear decay, gradient
clipping. Under `torchrun` it starts its own process group and wraps the model in DDP.

    python train.py --max-steps 40 --workers 2
    torchrun --nproc-per-node 2 train.py --max-steps 40
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
import unicodedata

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SYLLABLES = "ka lo mi ne ru ta vi so pe da zu fo ri ba ge ho ju la mo ni ku se ti wa yo".split()
ACCENTED = "né lö çu rì tá".split()  # the tokenizer strips their accents
POSITIVE = "great love excellent perfect sturdy happy recommend".split()
NEGATIVE = "broken awful refund poor flimsy disappointed return".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]"]


def make_reviews(count: int, seed: int) -> tuple[list[str], list[int]]:
    """`count` reviews of 80 to 400 invented words, punctuated, with a few sentiment words and a
    price."""
    rng = random.Random(seed)
    syllables = SYLLABLES + ACCENTED
    lexicon = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(3000)]
    weights = [1 / (rank + 1) for rank in range(len(lexicon))]  # word frequencies follow Zipf
    texts, labels = [], []
    for _ in range(count):
        label = rng.randint(0, 1)
        words = rng.choices(lexicon, weights, k=rng.randint(80, 400))
        words = [w + rng.choice(",.;") if rng.random() < 0.1 else w for w in words]
        for _ in range(rng.randint(1, 4)):
            cue = rng.choice(POSITIVE if label else NEGATIVE)
            words.insert(rng.randrange(40), cue.capitalize() if rng.random() < 0.3 else cue)
        words.insert(rng.randrange(len(words)), f"{rng.randint(1, 99)}.{rng.randint(0, 9)}€!")
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


class WordPiece:
    """BERT's tokenizer in pure Python: clean and normalize each character, strip accents, split
    on whitespace and punctuation, then greedy longest-match-first word pieces."""

    def __init__(self, texts: list[str], words: int = 500):
        counts: dict[str, int] = {}
        for text in texts[:500]:  # the vocabulary is learnt from the first 500 reviews
            for word in self.split(text):
                counts[word] = counts.get(word, 0) + 1
        frequent = sorted(counts, key=counts.get, reverse=True)[:words]
        chars = sorted({c for word in counts for c in word})
        pieces = SYLLABLES + chars
        vocab = SPECIALS + frequent + pieces + ["##" + p for p in pieces]
        self.vocab = {piece: i for i, piece in enumerate(dict.fromkeys(vocab))}
        self.longest = max(len(piece) for piece in self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, max_length: int) -> list[int]:
        ids = [self.vocab["[CLS]"]]
        for word in self.split(text):
            ids.extend(self.word_pieces(word))
        return ids[:max_length]

    @staticmethod
    def split(text: str) -> list[str]:
        """Lower-cased words without accents, each punctuation mark a word of its own."""
        text = unicodedata.normalize("NFD", text.lower())
        words, word = [], []
        for char in text:
            category = unicodedata.category(char)
            if category == "Mn":  # a combining accent
                continue
            if char.isspace() or category.startswith("C"):
                words.append("".join(word))
                word = []
            elif category.startswith("P") or category.startswith("S"):
                words.extend(("".join(word), char))
                word = []
            else:
                word.append(char)
        words.append("".join(word))
        return [w for w in words if w]

    def word_pieces(self, word: str) -> list[int]:
        ids, start = [], 0
        while start < len(word):
            for end in range(min(len(word), start + self.longest), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    start = end
                    break
            else:
                return [self.vocab["[UNK]"]]
        return ids


class Reviews(Dataset):
    def __init__(self, texts: list[str], labels: list[int], tokenizer: WordPiece, max_length=64):
        self.texts, self.labels = texts, labels
        self.tokenizer, self.max_length = tokenizer, max_length

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> dict:
        ids = self.tokenizer.encode(self.texts[index], self.max_length)
        return {"input_ids": torch.tensor(ids), "label": self.labels[index]}


def pad_collate(samples: list[dict]) -> dict[str, torch.Tensor]:
    longest = max(len(s["input_ids"]) for s in samples)
    input_ids = torch.zeros(len(samples), longest, dtype=torch.long)  # [PAD] is 0
    attention_mask = torch.zeros(len(samples), longest, dtype=torch.bool)
    for row, sample in enumerate(samples):
        input_ids[row, : len(sample["input_ids"])] = sample["input_ids"]
        attention_mask[row, : len(sample["input_ids"])] = True
    labels = torch.tensor([s["label"] for s in samples])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class Classifier(nn.Module):
    def __init__(self, vocab_size: int, dim: int = 64, max_length: int = 64, classes: int = 2):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.positions = nn.Embedding(max_length, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=128, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)
        x = self.encoder(x, src_key_padding_mask=~attention_mask)
        return self.head(x[:, 0])  # the [CLS] token


def warmup_linear(warmup_steps: int, total_steps: int):
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=0, help="the DataLoader's num_workers")
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--warmup-steps", type=int, default=5, help="learning-rate warm-up")
    parser.add_argument("--timing-warmup", type=int, default=5, help="steps left out of the timing")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 0 <= args.timing_warmup < args.max_steps:
        parser.error("--timing-warmup must be at least 0 and below --max-steps")
    return args


def setup_distributed() -> tuple[int, int, torch.device]:
    """(rank, world size, device); starts the process group when torchrun started several ranks."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world_size, device


def main() -> None:
    args = parse_args()
    rank, world_size, device = setup_distributed()
    torch.manual_seed(args.seed)
    texts, labels = make_reviews(args.samples, args.seed)
    tokenizer = WordPiece(texts)
    dataset = Reviews(texts, labels, tokenizer)
    sampler = DistributedSampler(dataset, seed=args.seed) if world_size > 1 else None
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        collate_fn=pad_collate,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
    )
    model = Classifier(len(tokenizer)).to(device)
    if world_size > 1:
        device_ids = [device] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=device_ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_linear(args.warmup_steps, args.max_steps)
    )
    train(args, model, loader, sampler, optimizer, schedule, device, rank, world_size)
    if world_size > 1:
        dist.destroy_process_group()


def train(args, model, loader, sampler, optimizer, schedule, device, rank, world_size) -> None:
    model.train()
    step, samples, start = 0, 0, time.perf_counter()
    for epoch in range(math.ceil(args.max_steps / len(loader))):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch in loader:
            batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
            logits = model(batch["input_ids"], batch["attention_mask"])
            loss = nn.functional.cross_entropy(logits, batch["labels"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            schedule.step()
            step += 1
            if step > args.timing_warmup:
                samples += len(batch["labels"]) * world_size
            if step == args.timing_warmup or step == args.max_steps:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if step == args.timing_warmup:
                    start = time.perf_counter()
            if rank == 0 and step % 10 == 0:
                print(f"step {step}: loss {loss.item():.4f}, lr {schedule.get_last_lr()[0]:.2e}")
            if step == args.max_steps:
                break
    seconds = time.perf_counter() - start
    if rank == 0:
        ranks = f", {world_size} ranks" if world_size > 1 else ""
        print(
            f"train: {samples / seconds:.1f} samples/s over steps {args.timing_warmup + 1}-{step}"
            f" (batch {args.batch_size}{ranks}, {args.workers} workers)"
        )


if __name__ == "__main__":
    main()
