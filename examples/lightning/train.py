"""A PyTorch Lightning training script: a small CNN on generated images of ten patterns.

A LightningDataModule with a training and a validation loader, a LightningModule with AdamW and a
cosine schedule stepped every step, run by `Trainer.fit`. The images are made from their index
(no files) and augmented by torchvision's v2 transforms, ColorJitter among them.

    python train.py --max-steps 40 --workers 2
"""

from __future__ import annotations

import argparse
import math
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

MEAN, STD = [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]


class Patterns(Dataset):
    """`size` RGB images of 80x80 pixels: stripes whose angle says the class, in a
    colour of their own, with noise. Image `i` is the same every time it is read."""

    def __init__(self, size: int, transform=None, seed: int = 0, classes: int = 10):
        self.size, self.transform, self.seed, self.classes = size, transform, seed, classes
        self.ys, self.xs = torch.meshgrid(torch.arange(80.0), torch.arange(80.0), indexing="ij")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        label = index % self.classes
        rng = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        angle = math.pi * label / self.classes + 0.2 * torch.rand((), generator=rng).item()
        phase = 6.28 * torch.rand((), generator=rng).item()
        wave = torch.sin((self.xs * math.cos(angle) + self.ys * math.sin(angle)) * 0.3 + phase)
        colour = torch.rand(3, 1, 1, generator=rng) * 0.6 + 0.2
        noise = torch.randn(3, 80, 80, generator=rng) * 0.1
        image = ((0.5 + 0.4 * wave) * colour + noise).clamp(0, 1)
        image = (image * 255).to(torch.uint8)
        if self.transform is not None:
            image = self.transform(image)
        return image, label


class PatternData(L.LightningDataModule):
    def __init__(self, batch_size: int = 32, workers: int = 0, seed: int = 0):
        super().__init__()
        self.batch_size, self.workers, self.seed = batch_size, workers, seed

    def setup(self, stage: str) -> None:
        train_transform = v2.Compose(
            [
                v2.RandomResizedCrop(64, scale=(0.5, 1.0), antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(MEAN, STD),
            ]
        )
        val_transform = v2.Compose(
            [v2.CenterCrop(64), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
        )
        self.train_set = Patterns(20_000, train_transform, seed=self.seed)
        self.val_set = Patterns(512, val_transform, seed=self.seed + 1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.workers,
            drop_last=True,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=2 * self.batch_size, num_workers=self.workers)


def block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(outputs),
        nn.ReLU(inplace=True),
    )


class PatternNet(L.LightningModule):
    def __init__(self, lr: float = 2e-3, warmup_steps: int = 5, classes: int = 10):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            block(3, 16),
            block(16, 32),
            block(32, 64),
            block(64, 64),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = nn.functional.cross_entropy(self(images), labels)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        logits = self(images)
        self.log("val_loss", nn.functional.cross_entropy(logits, labels))
        self.log("val_acc", (logits.argmax(1) == labels).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.05)
        total, warmup = self.trainer.estimated_stepping_batches, self.hparams.warmup_steps

        def cosine(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.5 * (1 + math.cos(math.pi * progress))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class Throughput(L.Callback):
    """Training samples per second from the end of step `skip` to the end of the last step: the
    loader's wait, the step and the callbacks, as the run goes."""

    def __init__(self, skip: int, batch_size: int, workers: int):
        self.skip, self.batch_size, self.workers = skip, batch_size, workers
        self.start, self.samples = None, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step > self.skip:
            self.samples += len(batch[0]) * trainer.world_size
        if step in (self.skip, trainer.max_steps) and pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        if step == self.skip:
            self.start = time.perf_counter()
        self.end, self.last = time.perf_counter(), step

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero and self.start is not None:
            rate = self.samples / (self.end - self.start)
            print(
                f"train: {rate:.1f} samples/s over steps {self.skip + 1}-{self.last}"
                f" (batch {self.batch_size}, {self.workers} workers)"
            )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=0, help="the DataLoaders' num_workers")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup-steps", type=int, default=5, help="learning-rate warm-up")
    parser.add_argument("--timing-warmup", type=int, default=5, help="steps left out of the timing")
    parser.add_argument(
        "--val-every", type=int, default=None, help="validate every N steps (default: each epoch)"
    )
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 0 <= args.timing_warmup < args.max_steps:
        parser.error("--timing-warmup must be at least 0 and below --max-steps")
    return args


def main() -> None:
    args = parse_args()
    L.seed_everything(args.seed, workers=True)
    data = PatternData(args.batch_size, args.workers, args.seed)
    model = PatternNet(lr=args.lr, warmup_steps=args.warmup_steps)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=args.val_every,
        callbacks=[Throughput(args.timing_warmup, args.batch_size, args.workers)],
    )
    trainer.fit(model, datamodule=data)


if __name__ == "__main__":
    main()
