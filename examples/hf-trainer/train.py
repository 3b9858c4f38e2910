"""A Hugging Face Trainer script: a tiny BERT classifies generated product reviews by sentiment.

A WordPiece tokenizer trained at start-up with the `tokenizers` library on the reviews themselves
(nothing downloaded), a map-style Dataset that tokenizes each review when it is read,
DataCollatorWithPadding, BertForSequenceClassification built from a BertConfig, `Trainer.train`.

    python train.py --max-steps 40 --workers 2
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import torch
from torch.utils.data import Dataset

# Nothing is downloaded: the model and the tokenizer are made here.
os.environ["HF_HUB_OFFLINE"] = "1"
# The tokenizer is trained on all cores before the loader forks its workers; without this, every
# worker warns that parallelism was disabled.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import (  # noqa: E402
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

SYLLABLES = "ka lo mi ne ru ta vi so pe da zu fo ri ba ge ho ju la mo ni ku se ti wa yo".split()
ACCENTED = "né lö çu rì tá".split()  # the tokenizer's normalizer strips their accents
POSITIVE = "great love excellent perfect sturdy happy recommend".split()
NEGATIVE = "broken awful refund poor flimsy disappointed return".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_reviews(count: int, seed: int) -> tuple[list[str], list[int]]:
    """`count` reviews of 40 to 200 invented words, punctuated, with a few sentiment words and a
    price."""
    rng = random.Random(seed)
    lexicon = ["".join(rng.choices(SYLLABLES + ACCENTED, k=rng.randint(1, 4))) for _ in range(3000)]
    weights = [1 / (rank + 1) for rank in range(len(lexicon))]  # word frequencies follow Zipf
    texts, labels = [], []
    for _ in range(count):
        label = rng.randint(0, 1)
        words = rng.choices(lexicon, weights, k=rng.randint(40, 200))
        words = [w + rng.choice(",.;") if rng.random() < 0.1 else w for w in words]
        for _ in range(rng.randint(1, 4)):
            cue = rng.choice(POSITIVE if label else NEGATIVE)
            words.insert(rng.randrange(40), cue.capitalize() if rng.random() < 0.3 else cue)
        words.insert(rng.randrange(len(words)), f"{rng.randint(1, 99)}.{rng.randint(0, 9)}€!")
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


def train_tokenizer(texts: list[str], vocab_size: int = 2000) -> PreTrainedTokenizerFast:
    """A BERT-style WordPiece tokenizer trained on `texts`, wrapped for transformers."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


class Reviews(Dataset):
    """Reviews tokenized when read: the loader does the tokenizer's work, batch by batch."""

    def __init__(self, texts: list[str], labels: list[int], tokenizer, max_length: int = 64):
        self.texts, self.labels = texts, labels
        self.tokenizer, self.max_length = tokenizer, max_length

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> dict:
        encoding = self.tokenizer(self.texts[index], truncation=True, max_length=self.max_length)
        return {**encoding, "labels": self.labels[index]}


class Throughput(TrainerCallback):
    """Training samples per second from the end of step `skip` to the end of the last step: the
    loader's wait and the step, as the Trainer runs them."""

    def __init__(self, skip: int, workers: int):
        self.skip, self.workers = skip, workers
        self.start = self.end = None
        self.last = 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (self.skip, state.max_steps) and torch.cuda.is_available():
            torch.cuda.synchronize()
        if state.global_step == self.skip:
            self.start = time.perf_counter()
        self.end, self.last = time.perf_counter(), state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.start is not None and self.last > self.skip:
            batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
            samples = (self.last - self.skip) * batch * args.world_size
            print(
                f"train: {samples / (self.end - self.start):.1f} samples/s over steps"
                f" {self.skip + 1}-{self.last} (batch {batch}, {self.workers} workers)"
            )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=0, help="the DataLoader's num_workers")
    parser.add_argument("--batch-size", type=int, default=32, help="per device")
    parser.add_argument("--warmup-steps", type=int, default=5, help="learning-rate warm-up")
    parser.add_argument("--timing-warmup", type=int, default=5, help="steps left out of the timing")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 0 <= args.timing_warmup < args.max_steps:
        parser.error("--timing-warmup must be at least 0 and below --max-steps")
    return args


def main() -> None:
    args = parse_args()
    set_seed(args.seed)
    texts, labels = make_reviews(args.samples, args.seed)
    tokenizer = train_tokenizer(texts[:1000])
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            max_steps=args.max_steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=args.lr,
            warmup_steps=args.warmup_steps,
            weight_decay=0.01,
            dataloader_num_workers=args.workers,
            dataloader_pin_memory=torch.cuda.is_available(),
            use_cpu=not torch.cuda.is_available(),
            eval_strategy="no",
            save_strategy="no",
            logging_steps=10,
            report_to="none",
            disable_tqdm=True,
            seed=args.seed,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=Reviews(texts, labels, tokenizer),
            data_collator=DataCollatorWithPadding(tokenizer),
            processing_class=tokenizer,
            callbacks=[Throughput(args.timing_warmup, args.workers)],
        )
        trainer.train()


if __name__ == "__main__":
    main()
