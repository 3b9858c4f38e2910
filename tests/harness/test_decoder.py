"""The JPEG decoder as an axis (knob decoder): the CPU decoders give the model the same batch
layout from the same files, their pixels near-equal, and each runs a cell through the harness."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from feedbench.core.cell import parse_cell
from feedbench.core.knobs import JPEG_DATASETS
from feedbench.harness import data
from feedbench.harness.images import make_images
from feedbench.harness.shards import make_shards
from feedbench.harness.stages import StagedBatch, strip
from helpers import cuda_decode


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, str]:
    """Six JPEGs of the project's generator: the data_dir of dataset images, all the GPU tests need
    (a GPU machine may lack pyarrow, which the shards need)."""
    folder = str(tmp_path_factory.mktemp("jpegs") / "images")
    make_images(folder, 6, 64, 2)
    return {"images": folder}


@pytest.fixture(scope="module")
def folders(images, tmp_path_factory) -> dict[str, str]:
    """The six JPEGs, and the same as one shard of each format: each JPEG dataset's data_dir."""
    shards = str(tmp_path_factory.mktemp("shards"))
    make_shards(images["images"], shards, 1)
    return {name: images["images"] if name == "images" else shards for name in JPEG_DATASETS}


def first_batch(folders, decoder: str, dataset: str = "images", timed: bool = False, **knobs):
    """A loader over `dataset` decoded by `decoder` (3 unshuffled 32 px images a batch, `knobs` over
    them) and its first batch, its crops drawn from seed 0: the same draws for each decoder."""
    cell = parse_cell(
        dict(
            dataset=dataset,
            data_dir=folders[dataset],
            decoder=decoder,
            model="resnet18",
            image_size=32,
            batch_size=3,
            shuffle=False,
            **knobs,
        )
    )
    loader = data.build_loader(cell, data.build_dataset(cell), timed=timed)
    torch.manual_seed(0)
    return loader, next(iter(loader))


def decoder_cell(folders, decoder: str, **knobs) -> dict:
    """A cell of the JPEG folder decoded by `decoder`: 3 steps of 2 images, one worker, `knobs` over
    them."""
    shape = dict(batch_size=2, steps=3, warmup_steps=1, num_workers=1)
    return dict(dataset="images", data_dir=folders["images"], decoder=decoder, **shape, **knobs)


def test_the_decoders_decode_a_file_to_near_equal_pixels(folders):
    """Pillow and torchvision each bundle their own libjpeg-turbo: the same file may decode a level
    apart."""
    path = min(Path(folders["images"]).rglob("*.JPEG"))
    with open(path, "rb") as f:
        raw = f.read()
    pil = torch.from_numpy(np.array(data.decode(raw, "pil"))).permute(2, 0, 1)
    ours = data.decode(raw, "torchvision")
    assert ours.shape == pil.shape == (3, 64, 64) and ours.dtype == pil.dtype == torch.uint8
    assert (ours.int() - pil.int()).abs().max() <= 2
    assert data.decode(raw, "torchvision-cuda").equal(
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    )


@pytest.mark.parametrize("dataset", JPEG_DATASETS)
def test_both_cpu_decoders_give_the_model_the_same_batch(folders, dataset):
    """Same shape and dtype, float32 normalised, and the same crops (the same random draws): pixels
    within a level."""
    batches = {d: first_batch(folders, d, dataset, shards=1)[1] for d in ("pil", "torchvision")}
    pil, ours = batches["pil"], batches["torchvision"]
    assert (
        ours[0].shape == pil[0].shape == (3, 3, 32, 32)
        and ours[0].dtype == pil[0].dtype == torch.float32
    )
    assert ours[1].equal(pil[1])
    # One level of 255, normalised by the smallest std (0.224), is 0.0175; resizing spreads a
    # level's difference.
    assert (ours[0] - pil[0]).abs().max() < 0.05
    assert (ours[0] - pil[0]).abs().mean() < 0.01


@pytest.mark.parametrize("timed", [False, True])
def test_the_batched_device_decode_gives_what_the_workers_decode(folders, monkeypatch, timed):
    """torchvision-cuda's design, run on the CPU: the loader yields bytes, DeviceDecoded decodes the
    batch in one call and transforms each image, drawing the same crops in the same order: the batch
    the CPU decoder's workers give. With stage timing on, the batch comes with its timings and the
    loop's strip gives the same batch."""
    monkeypatch.setattr(data, "decode_device", lambda: torch.device("cpu"))
    batches = {}
    for decoder in ("torchvision", "torchvision-cuda"):
        loader, first = first_batch(folders, decoder, timed=timed, device="auto")
        assert isinstance(first, StagedBatch) == timed
        batches[decoder] = strip(first)
    assert isinstance(loader, data.DeviceDecoded) and len(loader) == 2 and loader.batch_size == 3
    (ours, labels), (cpu, cpu_labels) = batches["torchvision-cuda"], batches["torchvision"]
    assert ours.shape == cpu.shape == (3, 3, 32, 32) and ours.dtype == torch.float32
    assert labels.equal(cpu_labels) and torch.allclose(ours, cpu)


@pytest.mark.parametrize("decoder", ["pil", "torchvision"])
def test_a_cell_runs_with_each_cpu_decoder_and_records_it(run_cell, folders, decoder):
    # here, not at the top: the module's GPU tests run where jsonschema is missing (gpu_check.sh)
    import jsonschema
    from feedbench.core.result import schema

    code, result = run_cell(
        **decoder_cell(folders, decoder, model="sleep", compute_ms=1, image_size=16)
    )
    assert code == 0, result["error"]
    assert result["cell"]["decoder"] == decoder and result["decoder"]["name"] == decoder
    assert "libjpeg" in result["decoder"]["library"]

    jsonschema.validate(result, schema())


def test_no_decoder_is_recorded_where_no_jpeg_is_decoded(run_cell):
    code, result = run_cell(
        model="mlp", input_size=8, width=8, batch_size=4, steps=2, warmup_steps=0
    )
    assert code == 0 and "decoder" not in result and result["cell"]["decoder"] == "pil"


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal given where no GPU is present"
)
def test_a_node_without_gpu_refuses_the_cuda_decoder_in_one_line(run_cell, folders):
    code, result = run_cell(
        dataset="images", data_dir=folders["images"], decoder="torchvision-cuda", device="auto"
    )
    assert code == 2 and result["status"] == "failed"
    assert result["error"]["message"].startswith(
        "knob 'decoder': value 'torchvision-cuda' needs a GPU"
    )


@pytest.mark.gpu
def test_the_cuda_decode_never_writes_memory_the_callers_queued_work_still_reads(images):
    """pytorch/vision#9606: the batched decode allocates its outputs on the caller's stream and
    writes them from a stream of its own that does not wait for the caller's, so it can be handed a
    block that work queued on the caller's stream has yet to read, and overwrite it (134 of 200 runs
    on an H100). Here the host runs ahead under `events`, and the prefetcher decodes on its side
    stream. N8 (#50): the test before this one queued no freed tensors with pending reads, the one
    state that corrupts, so it passed on the old code too. Now vision#9606's own reproduction, 20
    runs each way: decode_jpeg straight on the caller's stream (the old code) must corrupt at least
    once, else this GPU cannot show the race and the test says so; DeviceDecoded's ordered stream
    never; and its images within nvJPEG's rounding of the CPU decoder's."""
    raws, cpu = cuda_decode.jpegs(images["images"])
    decode = cuda_decode.decoders(images["images"])
    ordered, images = cuda_decode.corrupted_runs(decode["ordered"], raws)
    straight, _ = cuda_decode.corrupted_runs(decode["straight"], raws)
    assert ordered == 0, (
        f"{ordered} of 20 runs corrupted through DeviceDecoded ({straight} straight)"
    )
    assert max(cuda_decode.levels_apart(images, cpu)) < 3, "a decoded image differs from the CPU's"
    if straight == 0:
        pytest.skip("the straight decode corrupted none of 20 runs: this GPU cannot show the race")


@pytest.mark.gpu
@pytest.mark.parametrize("scenario", ["train", "loader"])
def test_the_cuda_decoder_gives_the_batch_on_the_gpu(run_cell, images, scenario):
    """Batched decode_jpeg on the device: the same layout and dtype as the CPU decoders, on the GPU,
    pixels close (nvJPEG is a third decoder), in a cell."""
    batches = {d: first_batch(images, d)[1] for d in ("torchvision", "torchvision-cuda")}
    images, labels = batches["torchvision-cuda"]
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.float32 and images.is_cuda
    assert labels.equal(batches["torchvision"][1])
    # nvJPEG rounds its IDCT and upsamples chroma its own way: on an H200, 0.033 apart on average
    # after normalising (about 2 of 255 levels). Each decode must lie far closer to the same image's
    # CPU decode than to another image.
    cpu = batches["torchvision"][0]
    own = (images.cpu() - cpu).abs().mean()
    assert own < 0.06 and own < 0.25 * (cpu[0] - cpu[1]).abs().mean(), own
    knobs = dict(model="resnet18") if scenario == "train" else {}
    cell = decoder_cell(
        images, "torchvision-cuda", scenario=scenario, image_size=32, device="cuda", **knobs
    )
    code, result = run_cell(**cell)
    assert code == 0, result["error"]
    assert (
        result["decoder"]["name"] == "torchvision-cuda" and "nvJPEG" in result["decoder"]["library"]
    )
