"""Every bad input gives one line naming the knob, the value and what is allowed."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from conftest import cli
from feedbench.core.cell import parse_cell
from feedbench.core.fit import NAIVE_ON_GPU
from feedbench.core.knobs import KnobError
from feedbench.core.result import schema
from feedbench.harness.fit import resolve
from helpers.cells import TINY_RESNET, jpeg_cell


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"num_workerz": 2}, "unknown knob 'num_workerz'; allowed: amp, batch_size,"),
        (
            {"model": "resnet1000"},
            "knob 'model': value 'resnet1000' is not known; allowed: none, mlp, sleep, lstm or a "
            "torchvision classification model",
        ),
        (
            {"dataset": "imagenet"},
            "knob 'dataset': value 'imagenet' is not allowed; allowed: synthetic, memory, "
            "images, cifar10, cifar100, tokens",
        ),
        (
            {"scenario": "inference"},
            "knob 'scenario': value 'inference' is not allowed; allowed: train, loader, compute, "
            "transfer",
        ),
        (
            {"num_workers": -1},
            "knob 'num_workers': value -1 is out of range; allowed: an integer >= 0",
        ),
        (
            {"batch_size": "big"},
            "knob 'batch_size': value 'big' has the wrong type; allowed: an integer >= 1",
        ),
        (
            {"batch_size": True},
            "knob 'batch_size': value True has the wrong type; allowed: an integer >= 1",
        ),
        (
            {"pin_memory": "yes"},
            "knob 'pin_memory': value 'yes' has the wrong type; allowed: true or false",
        ),
        (
            {"timing": "cuda"},
            "knob 'timing': value 'cuda' is not allowed; allowed: events, sync, naive",
        ),
        ({"amp": "fp8"}, "knob 'amp': value 'fp8' is not allowed; allowed: off, bf16, fp16"),
        (
            {"device_prefetch": "thread"},
            "knob 'device_prefetch': value 'thread' is not allowed; allowed: none, stream",
        ),
        (
            {"multiprocessing_context": "threads"},
            "knob 'multiprocessing_context': value 'threads' is not allowed; allowed: fork, "
            "spawn, forkserver",
        ),
        (
            {"sample_delay_ms": -1},
            "knob 'sample_delay_ms': value -1.0 is out of range; allowed: a number >= 0",
        ),
        (
            {"momentum": float("nan")},
            "knob 'momentum': value nan is not a finite number; allowed: a number >= 0 and <= 1",
        ),
        (
            {"compute_ms": float("inf")},
            "knob 'compute_ms': value inf is not a finite number; allowed: a number >= 0 and <= "
            "3600000",
        ),
        (
            {"lr": 10**400},
            "knob 'lr': value 100000000000000000...0000000000000000000 is out of range; allowed: "
            "a number >= 0",
        ),
        (
            {"steps": 10**21},
            "knob 'steps': value 1000000000000000000000 is out of range; allowed: an integer >= "
            "1 and <= 1000000",
        ),
        (
            {"batch_size": 2**40},
            "knob 'batch_size': value 1099511627776 is out of range; allowed: an integer >= 1 "
            "and <= 1048576",
        ),
        (
            {"num_workers": 1000},
            "knob 'num_workers': value 1000 is out of range; allowed: an integer >= 0 and <= 256",
        ),
        ({"model": "x" * 10_000}, "knob 'model': value 'xxxxxxxx"),
        ({"steps": None}, "knob 'steps': value null is not allowed; allowed: an integer >= 1"),
        (
            {"transfer_sizes": [0]},
            "knob 'transfer_sizes': value [0] is not allowed; allowed: a non-empty list of byte "
            "counts > 0",
        ),
        (
            {"dataset": "images"},
            "knob 'data_dir': dataset 'images' needs a data_dir; allowed: an existing folder "
            "(make one with: python -m feedbench make-images DIR)",
        ),
        (
            {"dataset": "cifar10"},
            "knob 'data_dir': dataset 'cifar10' needs a data_dir; allowed: an existing folder "
            "(or download: true)",
        ),
        (
            {"scenario": "train", "model": "none"},
            "knob 'model': value 'none' is not allowed with scenario 'train'",
        ),
        (
            {"model": "lstm", "dataset": "synthetic"},
            "knob 'dataset': value 'synthetic' is not allowed with model 'lstm'; allowed: tokens",
        ),
        (
            {"model": "resnet18", "dataset": "tokens"},
            "knob 'model': value 'resnet18' is not allowed with dataset 'tokens'",
        ),
        (
            {"decoder": "simd"},
            "knob 'decoder': value 'simd' is not allowed; allowed: pil, torchvision, "
            "torchvision-cuda",
        ),
        (
            {"decoder": "torchvision", "dataset": "cifar10", "download": True, "data_dir": "/d"},
            "knob 'decoder': value 'torchvision' is not allowed with dataset 'cifar10', which "
            "decodes no JPEG; allowed: pil, or a dataset that does (images, webdataset, parquet)",
        ),
        (
            {"decoder": "torchvision", "dataset": "own.data:make", "model": "sleep"},
            "knob 'decoder': value 'torchvision' is not allowed with dataset 'own.data:make', "
            "which decodes no JPEG",
        ),
        (
            {"decoder": "torchvision-cuda", "dataset": "images", "data_dir": "/d", "device": "cpu"},
            "knob 'decoder': value 'torchvision-cuda' is not allowed with device 'cpu'; allowed: "
            "pil, torchvision, or device auto or cuda",
        ),
        (
            {
                "decoder": "torchvision-cuda",
                "dataset": "images",
                "data_dir": "/d",
                "collate": "own.data:collate",
            },
            "knob 'collate': value 'own.data:collate' is not allowed with decoder "
            "'torchvision-cuda', whose loader yields undecoded bytes; allowed: null",
        ),
    ],
)
def test_bad_knob_names_knob_value_and_choices(knobs, message):
    with pytest.raises(KnobError) as error:
        parse_cell(knobs)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message given where no GPU is present"
)
def test_cuda_without_gpu_is_refused():
    with pytest.raises(
        KnobError, match=r"knob 'device': value 'cuda' is not available .*; " r"allowed: auto, cpu"
    ):
        resolve(parse_cell({"device": "cuda"}), cuda_available=False)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message given where no GPU is present"
)
def test_cuda_decoder_without_gpu_is_refused():
    """device auto passes the plan (the node may have a GPU); the node without one refuses the cell
    in one line."""
    cell = parse_cell({"decoder": "torchvision-cuda", "dataset": "images", "data_dir": "/d"})
    with pytest.raises(KnobError) as error:
        resolve(cell, cuda_available=False)
    assert str(error.value) == (
        "knob 'decoder': value 'torchvision-cuda' needs a GPU and this node has none "
        "(torch.cuda.is_available() is False); allowed: pil, torchvision"
    )


@pytest.mark.parametrize(
    "knobs, note",
    [
        ({"prefetch_factor": 4}, "prefetch_factor=4 ignored: it needs num_workers > 0"),
        ({"in_order": False}, "in_order=False ignored: it needs num_workers > 0"),
        ({"persistent_workers": True}, "persistent_workers=True ignored: it needs num_workers > 0"),
        (
            {"multiprocessing_context": "spawn"},
            "multiprocessing_context=spawn ignored: it needs num_workers > 0",
        ),
        ({"pin_memory": True}, "pin_memory=true ignored: no accelerator to pin for"),
        ({"channels_last": True}, "channels_last=true ignored: model 'mlp' takes no images"),
    ],
)
def test_combinations_pytorch_refuses_are_adjusted_and_recorded(run_cell, knobs, note):
    code, result = run_cell(
        **{
            "model": "mlp",
            "input_size": 16,
            "width": 16,
            "batch_size": 8,
            "steps": 2,
            "warmup_steps": 0,
            **knobs,
        }
    )
    assert code == 0, result["error"]
    assert note in result["adjustments"]
    name = next(iter(knobs))
    ran_with = {
        "prefetch_factor": None,
        "in_order": True,
        "persistent_workers": False,
        "multiprocessing_context": None,
        "pin_memory": False,
    }
    if name in ran_with:
        assert result["cell"][name] == ran_with[name]


def test_cli_bad_knob_exits_2_with_one_line_and_writes_failed_result(tmp_path):
    proc = cli("run", "--out", str(tmp_path / "out"), "--set", "num_workers=-3")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "feedbench: error: knob 'num_workers': value -3 is out of range; allowed: an integer >= "
        "0 and <= 256"
    ]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    jsonschema.validate(result, schema())
    assert result["status"] == "failed" and result["cell"] is None


def test_cli_unreadable_cell_file_is_one_line(tmp_path):
    bad = tmp_path / "cell.yaml"
    bad.write_text("model: [unclosed\n")
    proc = cli("run", str(bad), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith(
        "feedbench: error:"
    )


def test_missing_image_folder_names_path_and_how_to_get_it(run_cell, tmp_path):
    missing = tmp_path / "no-such-images"
    code, result = run_cell(**jpeg_cell(missing))
    assert code == 2
    assert result["status"] == "failed"
    assert result["error"]["message"] == (
        f"knob 'data_dir': dataset 'images' needs an existing folder, {str(missing)!r} is not one; "
        f"make one with: python -m feedbench make-images {missing}"
    )


def test_missing_cifar_names_path_and_download(run_cell, tmp_path):
    code, result = run_cell(**dict(TINY_RESNET, dataset="cifar100", data_dir=str(tmp_path)))
    assert code == 2
    assert result["error"]["message"].startswith(
        f"knob 'data_dir': cifar100 not found in {str(tmp_path)!r}"
    )
    assert result["error"]["message"].endswith("set download: true or fix the path")


def test_a_naive_cell_on_a_gpu_says_its_stall_is_the_hosts_wait():
    """#35 item 11: what `timing: naive` cannot tell on a GPU is in the cell's adjustments; not on
    the CPU, where the host's wait is the stall."""
    _, notes = resolve(parse_cell({"timing": "naive", "device": "cuda"}), cuda_available=True)
    assert NAIVE_ON_GPU in notes and "not the GPU's idle time" in NAIVE_ON_GPU
    _, notes = resolve(parse_cell({"timing": "naive", "device": "cpu"}), cuda_available=False)
    assert NAIVE_ON_GPU not in notes
