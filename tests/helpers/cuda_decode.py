"""torchvision-cuda's decode checked on a GPU, for its test (tests/harness/test_decoder.py) and the
GPU check's rows (benchmarks/gpu_check.py): its pixels against the CPU decoder's, and
pytorch/vision#9606's reproduction of the race its stream ordering (data.DeviceDecoded) fixes."""

from __future__ import annotations

from pathlib import Path

import torch
from feedbench.core.cell import parse_cell
from feedbench.harness import data

# about 50 ms of spinning on an H100 or H200 (torch.cuda._sleep counts GPU cycles)
SPIN_CYCLES = 50_000_000


def jpegs(folder: str, count: int | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The first `count` (default: all) JPEG files under `folder`, in order: their bytes as uint8
    tensors (what decode_jpeg takes), and each decoded by the CPU decoder (torchvision's
    libjpeg)."""
    paths = sorted(Path(folder).rglob("*.JPEG"))[:count]
    raws = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in paths]
    return raws, [data.decode(p.read_bytes(), "torchvision") for p in paths]


def decoders(folder: str) -> dict:
    """name -> decode(raws) -> images on this process's GPU: `straight`, decode_jpeg called on the
    caller's stream as before the fix, and `ordered`, through DeviceDecoded's own stream."""
    from torchvision.io import ImageReadMode, decode_jpeg

    device = torch.device("cuda", torch.cuda.current_device())
    cell = parse_cell({"dataset": "images", "data_dir": folder, "decoder": "torchvision-cuda"})
    ours = data.DeviceDecoded(loader=[], cell=cell, device=device)
    return {
        "straight": lambda raws: decode_jpeg(raws, mode=ImageReadMode.RGB, device=device),
        "ordered": lambda raws: ours._decode(decode_jpeg, raws, ImageReadMode.RGB),
    }


def corrupted_runs(decode, raws: list[torch.Tensor], runs: int = 20, per_image: int = 4):
    """vision#9606's reproduction, run `runs` times: fill `per_image` tensors of each decoded
    image's size with a known value and synchronise; queue SPIN_CYCLES of GPU work, then one sum
    per tensor, on the caller's stream; free the tensors while those sums are still queued (the
    caching allocator hands such a block out again at once, to the next allocation on that stream);
    decode; synchronise and check every sum. A sum is wrong only where the decode wrote into memory
    the queued work had not read yet. (runs in which a sum was wrong, the last run's images)."""
    sizes = [image.numel() for image in decode(raws)]  # also warms the decoder up
    torch.cuda.synchronize()
    corrupted, images = 0, []
    for _ in range(runs):
        held = [
            torch.full((n,), 7, dtype=torch.uint8, device="cuda")
            for n in sizes
            for _ in range(per_image)
        ]
        torch.cuda.synchronize()
        torch.cuda._sleep(SPIN_CYCLES)
        sums = [t.sum(dtype=torch.int64) for t in held]
        expected = [7 * t.numel() for t in held]
        del held  # freed with their sums still queued
        images = decode(raws)
        torch.cuda.synchronize()
        corrupted += any(int(s) != e for s, e in zip(sums, expected, strict=True))
    return corrupted, images


def levels_apart(images: list[torch.Tensor], references: list[torch.Tensor]) -> list[float]:
    """Each image's mean absolute difference from its reference, in levels of 255."""
    return [
        float((image.cpu().float() - reference.float()).abs().mean())
        for image, reference in zip(images, references, strict=True)
    ]
