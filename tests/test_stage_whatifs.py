"""Stage what-ifs run and predicted (issue #23, parts 3 and 4): cache_after, skip_stages and device_stages run through
real Snakemake on the known-cost pipeline of test_stages (its transforms as torchvision v2 ones), each predicted from
the baseline cell's stage profile within 10 % of its measurement, the report showing both, the error and the trades;
and each bad input as its one line."""

from __future__ import annotations

import csv
import json
import sys
import textwrap

import pytest
import torch
import yaml
from conftest import write_user_module
from feedbench.analysis.aggregate import read_summary
from feedbench.analysis.verdict import summarize_experiment
from feedbench.harness import whatif
from feedbench.harness.runner import run
from feedbench.plan.cell import parse_cell
from feedbench.plan.config import validate_config
from feedbench.plan.knobs import KnobError
from feedbench.plan.matrix import ConfigError, build_cells
from snakemake_run import run_snakemake, workflow_copy
from test_stages import COSTS, USER_MODULE
from test_stages import USER_CODE as V1_CODE

# The known costs of test_stages (Crop 2 ms, Jitter 4 ms in the Compose; tokenize 1.5 ms and 3 ms unattributed outside
# it), with the Compose's two transforms also as torchvision v2 ones, which device_stages can move. Each cost is a sleep
# here, not a busy-wait: the cells of a prediction run one after the other, and a busy-wait overshoots by what the
# machine's other load takes from it then (on a 2-core machine at load 7, 20 % between two cells), a sleep less. Each
# is SCALE times longer than in test_stages: what a loaded machine adds to each wait (its wake-up) is then a small part.
SCALE = 4
V2_CODE = f"""

from torchvision.transforms import v2


def spin(ms):
    time.sleep({SCALE} * ms / 1000)


class CropV2(v2.Transform):
    def forward(self, x):
        return Crop()(x)


class JitterV2(v2.Transform):
    def forward(self, x):
        return Jitter()(x)


def build_v2(ctx, n=64):
    data = Costs(n)
    data.transform = v2.Compose([CropV2(), JitterV2()])
    return data
"""

BASE = {
    "dataset": "known_costs:build_v2",
    "model": "known_costs:model",
    "step": "known_costs:step",
    "batch_size": 4,
    "num_workers": 0,
    "stage_timing": True,
}
DEFAULTS = {"repeats": 1, "steps": 20, "warmup_steps": 2, "device": "cpu", "torch_threads": 1, "monitor_interval_s": 5}
EXPERIMENT = {
    "title": "What if a stage of the known-cost pipeline went?",
    "ceilings": True,
    "base": BASE,
    "matrix": {"cache_after": [None, "JitterV2"]},
    "include": [{"skip_stages": ["CropV2"]}, {"device_stages": "JitterV2"}],
}


USER_CODE = textwrap.dedent(V1_CODE) + V2_CODE  # the user_module fixture's (tests/conftest.py)


@pytest.mark.slow  # one real Snakemake run: 4 training cells and the 2 ceilings they share
@pytest.mark.timing  # the predictions hold within 10 %: no other run beside it
def test_each_what_if_runs_through_snakemake_and_its_prediction_holds(tmp_path):
    workflow, workdir = workflow_copy(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    write_user_module(project, USER_MODULE, USER_CODE)
    config = {"python_path": ["src"], "defaults": DEFAULTS, "experiments": {"whatif": EXPERIMENT}}
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    done = run_snakemake(workflow, workdir, "--cores", "1", "--configfile", str(project / "config.yaml"))
    assert done.returncode == 0, done.stderr[-4000:]
    with open(workdir / "results" / "summary.csv") as f:
        rows = {r["cell"]: r for r in csv.DictReader(f) if r["experiment"] == "whatif"}
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows.values()), rows
    whatifs = {cell: r for cell, r in rows.items() if r["predicted_from"].startswith("stage what-if")}
    assert len(whatifs) == 3, {cell: r["predicted_from"] for cell, r in rows.items()}
    for cell, row in whatifs.items():
        assert abs(float(row["prediction_error_pct"])) <= 10, (
            cell,
            row["samples_per_s"],
            row["predicted_samples_per_s"],
        )
    trades = {cell: row["whatif_trades"] for cell, row in whatifs.items()}
    assert any(t.startswith("cache of ") and t.endswith("in memory, per process") for t in trades.values()), trades
    assert any(t == "changes the data: CropV2 skipped" for t in trades.values()), trades
    assert any(t == "JitterV2 run on the batch after the copy" for t in trades.values()), trades
    device = next(r for r in whatifs.values() if r["device_stages"] == "JitterV2")
    assert float(device["whatif_device_ms"]) >= SCALE * COSTS["Jitter"] * 0.99  # once per batch, on the batch
    summary = read_summary(str(workdir / "results" / "summary.csv"))
    ours = summary[summary["experiment"] == "whatif"].copy()
    assert summarize_experiment(ours, EXPERIMENT["matrix"])["best"]["cell"] == "cache_after-JitterV2"
    skipped = ours["skip_stages"] != "[]"
    ours.loc[skipped, "samples_per_s"] *= 10  # a skip that measured other data is never the best configuration
    assert summarize_experiment(ours, EXPERIMENT["matrix"])["best"]["cell"] == "cache_after-JitterV2"
    html = (workdir / "results" / "report" / "index.html").read_text()
    assert "Stage what-ifs (cells run with" in html and "3 cells, median error" in html
    assert all(f"what-if: {t}" in html for t in trades.values())
    assert "on the device" in html and "cached after it" in html  # the baseline's top stages, predicted
    # Every cell's warm-up was profiled too (harness/profile.py): the user's functions, named in the summary and the
    # report's table; the measured figures above held beside it.
    named = [json.loads(r["stage_functions"]) for r in rows.values()]
    assert all(any(name.startswith("known_costs:") for name, _, _ in found) for found in named), named
    assert "The costliest functions of each cell's loader" in html and "known_costs:" in html


def _cell(module: str, **knobs):
    return parse_cell({**BASE, **DEFAULTS_OF_CELL, "python_path": [module], **knobs})


DEFAULTS_OF_CELL = {k: v for k, v in DEFAULTS.items() if k != "repeats"}


def _dataset(module: str, v2: bool = True):
    sys.path.insert(0, module)
    try:
        import known_costs
    finally:
        sys.path.remove(module)
    return (known_costs.build_v2 if v2 else known_costs.build)(None, n=8)


def test_the_first_pass_caches_and_later_samples_start_after_it(user_module, tmp_path):
    dataset = _dataset(user_module)
    cell = _cell(user_module, cache_after="CropV2", cache_in="file")
    cached, plan = whatif.apply(cell, dataset, str(tmp_path))
    assert plan.facts["cached"] == ["CropV2"] and plan.facts["cache"]["samples"] == 8
    assert plan.facts["cache"]["bytes"] == 8 * 4 * 4  # a 4-float tensor per sample
    assert (tmp_path / whatif.CACHE_FILE).exists()
    assert [type(t).__name__ for t in dataset.transform.transforms] == ["Cached", "JitterV2"]
    x, _spent = cached[3]
    assert torch.equal(x, torch.full((4,), 4.0))  # the cached crop of sample 3, jittered after it


def test_skip_drops_the_stage_and_says_the_data_changed(user_module):
    dataset = _dataset(user_module, v2=False)  # a v1 Compose: skip_stages and cache_after work there too
    _same, plan = whatif.apply(_cell(user_module, dataset="known_costs:build", skip_stages=["Jitter"]), dataset, None)
    assert [type(t).__name__ for t in dataset.transform.transforms] == ["Crop"]
    assert plan.facts["trades"] == ["changes the data: Jitter skipped"]
    assert torch.equal(dataset[2][0], torch.full((4,), 2.0))  # not jittered


@pytest.mark.parametrize(
    "knobs, line",
    [
        (
            {"skip_stages": ["Blur"]},
            "knob 'skip_stages': the cell's pipeline has no stage 'Blur'; allowed: CropV2, JitterV2",
        ),
        (
            {"cache_after": "tokenize"},
            "knob 'cache_after': the cell's pipeline has no stage 'tokenize'; allowed: CropV2, JitterV2",
        ),
        (
            {"device_stages": "Jitter", "dataset": "known_costs:build"},
            "knob 'device_stages': stage 'Jitter' (known_costs.Jitter) is not a torchvision v2 transform; allowed: "
            "a stage from which on every transform is a torchvision.transforms.v2 one",
        ),
    ],
    ids=["unknown-stage", "not-cacheable", "not-v2"],
)
def test_a_stage_the_pipeline_does_not_have_or_cannot_move_is_one_line(user_module, knobs, line):
    dataset = _dataset(user_module, v2=knobs.get("dataset") != "known_costs:build")
    with pytest.raises(KnobError) as error:
        whatif.apply(_cell(user_module, **knobs), dataset, None)
    assert str(error.value) == line


def test_a_cache_over_its_limit_fails_its_cell_with_one_line(user_module, tmp_path):
    knobs = {**BASE, **DEFAULTS_OF_CELL, "python_path": [user_module], "cache_after": "CropV2"}
    run(
        {**knobs, "cache_limit_mb": 64 / 2**20, "dataset_args": {"n": 16}}, str(tmp_path / "out")
    )  # 64 bytes: 4 samples
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] != "ok"
    assert result["error"]["message"] == (
        "knob 'cache_limit_mb': the cache after 'CropV2' outgrew its 64 bytes at sample 5 of 16 (about 256 bytes for "
        "all); allowed: a larger cache_limit_mb, or cache_after a stage whose output is smaller"
    )


def test_a_what_if_on_a_dataset_without_stages_stops_at_plan_time():
    config = {
        "defaults": {"device": "cpu"},
        "experiments": {"e": {"base": {"dataset": "synthetic", "model": "mlp"}, "matrix": {"cache_after": ["decode"]}}},
    }
    validate_config(config, "config/schema.yaml")
    with pytest.raises(ConfigError) as error:
        build_cells(config, check=True)
    assert (
        "dataset 'synthetic' has no stages to change; allowed: null, or a dataset whose samples pass a torchvision"
        in (str(error.value))
    )
    assert "\n" not in str(error.value)
    with pytest.raises(KnobError, match=r"^knob 'device_stages': decoder 'torchvision-cuda' runs no stage"):
        parse_cell({"dataset": "images", "data_dir": ".", "decoder": "torchvision-cuda", "device_stages": "Normalize"})


@pytest.mark.parametrize("stage", ["read", "decode", "RandomResizedCrop"])
def test_the_built_in_images_cache_after_read_decode_or_a_transform(tmp_path, stage):
    from feedbench.harness.data import build_dataset
    from feedbench.harness.images import make_images

    make_images(str(tmp_path / "img"), count=6, size=24, classes=2)
    cell = parse_cell(
        {
            "dataset": "images",
            "data_dir": str(tmp_path / "img"),
            "image_size": 16,
            "device": "cpu",
            "cache_after": stage,
        }
    )
    dataset = build_dataset(cell)
    names = whatif.stage_names(dataset)
    assert names == [
        "read",
        "decode",
        "RandomResizedCrop",
        "RandomHorizontalFlip",
        "ToTensor",
        "Normalize",
    ]
    cached, plan = whatif.apply(cell, dataset, None)
    assert plan.facts["cached"] == names[: names.index(stage) + 1]
    assert ("random stage cached: augmentation fixed (RandomResizedCrop)" in plan.facts["trades"]) == (
        stage == "RandomResizedCrop"
    )
    for index in range(len(cached)):
        x, label = cached[index]
        assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and label in (0, 1)
    if stage != "read":  # no file is opened once the decoded image is cached
        assert type(dataset.loader).__name__ == "Nothing"


def test_the_what_if_model_takes_the_stages_out_of_the_workers_and_adds_the_device_part():
    from feedbench.analysis.predict import crossing_bytes, predict, predict_whatif, taken_out

    order = ["read", "decode", "RandomResizedCrop", "ToTensor", "Normalize"]
    assert taken_out(order, "cache_after", "decode") == ["read", "decode"]
    assert taken_out(order, "device_stages", "ToTensor") == ["ToTensor", "Normalize"]
    assert taken_out(order, "skip_stages", ["Normalize"]) == ["Normalize"]
    assert crossing_bytes(4000, ["ToTensor", "Normalize"]) == 1000 and crossing_bytes(4000, ["Normalize"]) == 4000
    # A loader of 100 samples/s whose workers spend 10 ms a sample: 4 ms out, so 10 / 6 x 100; compute 1000/s plus
    # 0.5 ms a sample on the device; with 2 workers the slower side bounds it.
    predicted, bound, terms = predict_whatif((100, 1000), 2, 8, 10.0, 4.0, 0.5)
    assert terms["loader_per_s"] == pytest.approx(100 * 10 / 6)
    assert predicted == pytest.approx(predict(100 * 10 / 6, 1 / (1 / 1000 + 0.0005), 2, 8)[0])
    assert bound == "data" and predicted == pytest.approx(1000 / 6)
    assert predict_whatif((None, 1000), 2, 8, 10.0, 4.0)[0] is None


RANDOM_V2 = """
from torchvision.transforms import v2


class Flips(Costs):
    def __init__(self, n):
        super().__init__(n)
        self.transform = v2.Compose([v2.RandomHorizontalFlip(), v2.ToDtype(torch.float64)])


def build_flips(ctx, n=16):
    return Flips(n)


def model64(ctx):
    return nn.Linear(4, 1).double()


def step64(model, batch, ctx):
    assert batch[0].dtype == torch.float64 and batch[0].device.type == ctx.device.type, batch[0]
    return model(batch[0]).mean()
"""


def _random_cell(run_cell, module, device: str | None):
    with open(f"{module}/known_costs.py", "a") as f:
        f.write(RANDOM_V2)
    knobs = {**BASE, "dataset": "known_costs:build_flips", "model": "known_costs:model64", "step": "known_costs:step64"}
    knobs.update(
        python_path=[module], device_stages="RandomHorizontalFlip", steps=3, warmup_steps=1, stage_timing=False
    )
    return run_cell(**knobs, **({"device": device} if device else {}))


def test_a_random_device_stage_draws_per_batch_and_says_so(run_cell, user_module):
    code, result = _random_cell(run_cell, user_module, None)
    assert code == 0 and result["status"] == "ok", result["error"]
    found = result["metrics"]["whatif"]
    assert found["device_stages"] == ["RandomHorizontalFlip", "ToDtype"] and found["device_ms_per_batch"] > 0
    assert found["trades"] == [
        "RandomHorizontalFlip, ToDtype run on the batch after the copy",
        "per-sample random transform applied per batch (RandomHorizontalFlip)",
    ]


@pytest.mark.gpu
def test_device_stages_run_on_the_gpu(run_cell, user_module):
    code, result = _random_cell(run_cell, user_module, "cuda")
    assert code == 0 and result["status"] == "ok", result["error"]  # the step asserts its batch is on the GPU
    assert result["metrics"]["whatif"]["device_ms_per_batch"] > 0  # CUDA events


def test_a_user_dataset_without_a_compose_has_no_stage_to_name(user_module):
    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return torch.zeros(4), index

    with pytest.raises(KnobError) as error:
        whatif.apply(_cell(user_module, cache_after="Crop"), Plain(), None)
    assert str(error.value) == (
        "knob 'cache_after': the cell's pipeline has no stage 'Crop'; allowed: none: the dataset has no torchvision "
        "Compose"
    )


@pytest.mark.slow  # two spawned workers start torch
def test_spawned_workers_map_the_file_cache(run_cell, user_module, tmp_path):
    """A spawned worker gets the cache's path, not its items, and maps the file itself (whatif.Store.__getstate__)."""
    knobs = {**BASE, "python_path": [user_module], "dataset_args": {"n": 16}, "num_workers": 2}
    code, result = run_cell(
        **knobs, multiprocessing_context="spawn", cache_after="CropV2", cache_in="file", steps=2, warmup_steps=1
    )
    assert code == 0 and result["status"] == "ok", result["error"]
    assert result["metrics"]["whatif"]["trades"] == ["cache of 256 bytes on disk (stage_cache.pt)"]
    assert result["metrics"]["stages"]["stages"]["Cached"]["calls"] == 8  # the measured batches' samples, in workers
