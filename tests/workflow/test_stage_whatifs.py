"""Stage what-ifs run and predicted (issue #23, parts 3 and 4): cache_after, skip_stages and
device_stages run through real Snakemake on the known-cost pipeline of test_stages (its transforms
as torchvision v2 ones), each predicted from the baseline cell's stage profile within 10 % of its
measurement, the report showing both, the error and the trades; and each bad input as its one
line."""

from __future__ import annotations

import csv
import json
import sys
import textwrap

import pandas as pd
import pytest
import torch
import yaml
from conftest import write_user_module
from feedbench.analysis import whatifs
from feedbench.analysis.aggregate import read_summary, result_row
from feedbench.analysis.verdict import summarize_experiment
from feedbench.analysis.whatifs import experiment_table
from feedbench.core.cell import parse_cell
from feedbench.core.knobs import KnobError
from feedbench.core.records import record_of
from feedbench.harness import stages, whatif
from feedbench.harness.runner import run
from feedbench.plan.config import validate_config
from feedbench.plan.matrix import ConfigError, build_cells
from helpers.browser import without_tags
from helpers.known_costs import COSTS, USER_MODULE
from helpers.known_costs import USER_CODE as V1_CODE
from helpers.snakemake_run import run_snakemake, workflow_copy

# The known costs of test_stages (Crop 2 ms, Jitter 4 ms in the Compose; tokenize 1.5 ms and 3 ms
# unattributed outside it), with the Compose's two transforms also as torchvision v2 ones, which
# device_stages can move. Each cost is a sleep here, not a busy-wait: the cells of a prediction run
# one after the other, and a busy-wait overshoots by what the machine's other load takes from it
# then (on a 2-core machine at load 7, 20 % between two cells), a sleep less. Each is SCALE times
# longer than in test_stages: what a loaded machine adds to each wait (its wake-up) is then a small
# part.
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


CALLS = {{"Spell": 0}}


@feedbench.stage("Spell")
def spell(x):  # a function of the user's own after the Compose, marked as a stage: a cache or skip may name it
    CALLS["Spell"] += 1
    spin(3.0)
    return x + 0.5


@feedbench.stage("Mix")
def mix(x, weight):  # two arguments: a skip has no one input to return
    return x * weight


class Spelled(Costs):
    def __getitem__(self, index):
        x, spent = super().__getitem__(index)
        return mix(spell(x), 1.0), spent


def build_v2(ctx, n=64):
    data = Spelled(n)
    data.transform = v2.Compose([CropV2(), JitterV2()])
    return data


class Lower:
    def __call__(self, text):
        return text.lower()


class Tokenize:  # pure Python: a string in, a list of ids out
    def __call__(self, text):
        spin(1.0)
        return [int(c) for c in text.split()[-1]]


class Pad:
    def __call__(self, ids):
        return torch.tensor((ids + [0] * 4)[:4], dtype=torch.float32)


class Scale:
    def __call__(self, x):
        return x / 32


class Texts(Dataset):  # text through a Compose, then work of its own on what the Compose gives
    def __init__(self, n):
        self.n, self.transform = n, transforms.Compose([Lower(), Tokenize(), Pad(), Scale()])

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return self.transform(f"Sample {{index:04d}}").clamp(0, 1), {{}}


def build_texts(ctx, n=16):
    return Texts(n)
"""  # noqa: E501

BASE = {
    "dataset": "known_costs:build_v2",
    "model": "known_costs:model",
    "step": "known_costs:step",
    "batch_size": 4,
    "num_workers": 0,
    "stage_timing": True,
}
DEFAULTS = {
    "repeats": 1,
    "steps": 20,
    "warmup_steps": 2,
    "device": "cpu",
    "torch_threads": 1,
    "monitor_interval_s": 5,
}
EXPERIMENT = {
    "title": "What if a stage of the known-cost pipeline went?",
    "ceilings": True,
    "base": BASE,
    "matrix": {"cache_after": [None, "JitterV2"]},
    "include": [
        {"skip_stages": ["CropV2"]},
        {"device_stages": "JitterV2"},
        {"cache_after": "Spell"},
    ],
}


USER_CODE = textwrap.dedent(V1_CODE) + V2_CODE  # the user_module fixture's (tests/conftest.py)


@pytest.mark.slow  # one real Snakemake run: 5 training cells and the 2 ceilings they share
@pytest.mark.timing  # the predictions hold within 10 %: no other run beside it
def test_each_what_if_runs_through_snakemake_and_its_prediction_holds(tmp_path):
    workflow, workdir = workflow_copy(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    write_user_module(project, USER_MODULE, USER_CODE)
    config = {"python_path": ["src"], "defaults": DEFAULTS, "experiments": {"whatif": EXPERIMENT}}
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    done = run_snakemake(
        workflow, workdir, "--cores", "1", "--configfile", str(project / "config.yaml")
    )
    assert done.returncode == 0, done.stderr[-4000:]
    with open(workdir / "results" / "summary.csv") as f:
        rows = {r["cell"]: r for r in csv.DictReader(f) if r["experiment"] == "whatif"}
    assert len(rows) == 5 and all(r["status"] == "ok" for r in rows.values()), rows
    whatifs = {
        cell: r for cell, r in rows.items() if r["predicted_from"].startswith("stage what-if")
    }
    assert len(whatifs) == 4, {cell: r["predicted_from"] for cell, r in rows.items()}
    for cell, row in whatifs.items():
        assert abs(float(row["prediction_error_pct"])) <= 10, (
            cell,
            row["samples_per_s"],
            row["predicted_samples_per_s"],
        )
    trades = {cell: row["whatif_trades"] for cell, row in whatifs.items()}
    assert any(
        t.startswith("cache of ") and t.endswith("in memory, per process") for t in trades.values()
    ), trades
    assert any(t == "changes the data: CropV2 skipped" for t in trades.values()), trades
    assert any(t == "JitterV2 run on the batch after the copy" for t in trades.values()), trades
    device = next(r for r in whatifs.values() if r["device_stages"] == "JitterV2")
    # once per batch, on the batch
    assert float(device["whatif_device_ms"]) >= SCALE * COSTS["Jitter"] * 0.99
    summary = read_summary(str(workdir / "results" / "summary.csv"))
    ours = summary[summary["experiment"] == "whatif"].copy()
    assert (
        summarize_experiment(ours, EXPERIMENT["matrix"])["best"]["cell"] == "cache_after-JitterV2"
    )
    skipped = ours["skip_stages"] != "[]"
    # a skip that measured other data is never the best configuration
    ours.loc[skipped, "samples_per_s"] *= 10
    assert (
        summarize_experiment(ours, EXPERIMENT["matrix"])["best"]["cell"] == "cache_after-JitterV2"
    )
    # as read: no glossary links
    html = without_tags((workdir / "results" / "report" / "index.html").read_text())
    assert "Stage what-ifs (cells run with" in html and "4 cells, median error" in html
    assert all(f"what-if: {t}" in html for t in trades.values())
    # the baseline's top stages, predicted
    assert "on the device" in html and "cached after it" in html
    # 64 x 4 floats
    assert rows["cache_after-Spell"]["whatif_trades"] == "cache of 1.0 KB in memory, per process"
    table = {(r["stage"], r["what"]) for r in experiment_table(ours)}
    assert {
        ("Spell", "cached after it"),
        ("JitterV2", "on the device"),
        ("CropV2", "on the device"),
    } <= table
    # a Python function of the sample never moves
    assert ("Spell", "on the device") not in table, table
    # Every cell's warm-up was profiled too (harness/profile.py): the user's functions, named in the
    # summary and the report's table; the measured figures above held beside it.
    named = [json.loads(r["stage_profile"]) for r in rows.values()]
    assert all(any(name.startswith("known_costs:") for name, _, _ in found) for found in named), (
        named
    )
    assert "The costliest functions of each cell's loader" in html and "known_costs:" in html


@pytest.fixture(autouse=True)
def _own_replacements(monkeypatch):
    """Each test's what-ifs on decorated stages (stages.REPLACED, per process) end with it."""
    monkeypatch.setattr(stages, "REPLACED", {})


def _cell(module: str, **knobs):
    return parse_cell({**BASE, **DEFAULTS_OF_CELL, "python_path": [module], **knobs})


DEFAULTS_OF_CELL = {k: v for k, v in DEFAULTS.items() if k != "repeats"}


def _module(module: str):
    sys.path.insert(0, module)
    try:
        import known_costs
    finally:
        sys.path.remove(module)
    return known_costs


def _dataset(module: str, v2: bool = True):
    known_costs = _module(module)
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
    # the cached crop of sample 3, jittered after it, then spelled
    assert torch.equal(x, torch.full((4,), 4.5))


def test_a_decorated_function_is_cached_per_sample_and_not_run_again(user_module):
    dataset = _dataset(user_module)
    cached, plan = whatif.apply(_cell(user_module, cache_after="Spell"), dataset, None)
    assert plan.facts["cached"] == ["Spell"] and plan.facts["cache"]["bytes"] == 8 * 4 * 4
    calls = _module(user_module).CALLS
    before = calls["Spell"]
    for index in range(8):
        x, _spent = cached[index]
        # cropped, jittered, spelled: as the function gave it
        assert torch.equal(x, torch.full((4,), index + 1.5))
    assert calls["Spell"] == before  # the function did not run: its output came from the cache
    # outside a sample: run
    assert torch.equal(_module(user_module).spell(torch.zeros(4)), torch.full((4,), 0.5))
    assert calls["Spell"] == before + 1


def test_a_skipped_function_returns_its_one_argument(user_module):
    dataset = _dataset(user_module)
    same, plan = whatif.apply(_cell(user_module, skip_stages=["Spell"]), dataset, None)
    before = _module(user_module).CALLS["Spell"]
    assert torch.equal(same[2][0], torch.full((4,), 3.0))  # cropped and jittered, not spelled
    assert _module(user_module).CALLS["Spell"] == before
    assert plan.facts["trades"] == ["changes the data: Spell skipped"]


def test_a_cache_in_the_middle_of_a_compose_gives_the_dataset_what_it_expects_after_it(user_module):
    """cache_after a middle member, with the dataset's own code after its Compose: the first pass
    runs the rest of the Compose too (it crashed in the user's __getitem__ when the Compose gave the
    cached stage's output)."""
    dataset = _module(user_module).build_texts(None, n=8)
    cached, plan = whatif.apply(_cell(user_module, cache_after="Tokenize"), dataset, None)
    assert plan.facts["cached"] == ["Lower", "Tokenize"]
    assert [type(t).__name__ for t in dataset.transform.transforms] == ["Cached", "Pad", "Scale"]
    for index in range(8):
        assert torch.equal(cached[index][0], torch.tensor([0.0, 0.0, 0.0, index]) / 32)


def test_a_first_pass_that_fails_says_so(user_module):
    class Fails(_module(user_module).Texts):
        def __getitem__(self, index):
            if index == 5:
                raise ValueError("no text for sample 5")
            return super().__getitem__(index)

    with pytest.raises(ValueError) as error:
        whatif.apply(_cell(user_module, cache_after="Tokenize"), Fails(8), None)
    assert (
        str(error.value) == "cache_after 'Tokenize': its first pass failed at sample 5: "
        "no text for sample 5"
    )


def test_only_stages_that_took_and_gave_tensors_get_an_on_device_row(
    run_cell, user_module, tmp_path
):
    """The report's "on the device" what-if: for a stage from which on the sampled call took and
    gave tensors (Scale), never for a Python tokenizer (Tokenize: a string in, a list out) or what
    comes before it."""
    knobs = {
        **BASE,
        "dataset": "known_costs:build_texts",
        "python_path": [user_module],
        "steps": 3,
        "warmup_steps": 1,
    }
    code, result = run_cell(**knobs, torch_threads=1)
    assert code == 0 and result["status"] == "ok", result["error"]
    found = result["metrics"]["stages"]
    assert found["order"] == ["Lower", "Tokenize", "Pad", "Scale"] and found["on_device"] == [
        "Scale"
    ]
    assert "functions" not in found  # no @feedbench.stage function ran
    rows = pd.DataFrame([result_row(record_of(result, str(tmp_path / "result.json")))])
    table = {
        (r["stage"], r["what"])
        for r in whatifs.table(rows, result["cell"], (1000.0, 1000.0), (None, None))
    }
    assert ("Tokenize", "cached after it") in table and ("Tokenize", "costs nothing") in table
    assert {stage for stage, what in table if what == "on the device"} <= {"Scale"}, table


def test_skip_drops_the_stage_and_says_the_data_changed(user_module):
    # a v1 Compose: skip_stages and cache_after work there too
    dataset = _dataset(user_module, v2=False)
    _same, plan = whatif.apply(
        _cell(user_module, dataset="known_costs:build", skip_stages=["Jitter"]), dataset, None
    )
    assert [type(t).__name__ for t in dataset.transform.transforms] == ["Crop"]
    assert plan.facts["trades"] == ["changes the data: Jitter skipped"]
    assert torch.equal(dataset[2][0], torch.full((4,), 2.0))  # not jittered


@pytest.mark.parametrize(
    "knobs, line",
    [
        (
            {"skip_stages": ["Blur"]},
            "knob 'skip_stages': the cell's pipeline has no stage 'Blur'; allowed: CropV2, "
            "JitterV2, Spell, Mix",
        ),
        (
            {"cache_after": "tokenize"},
            "knob 'cache_after': stage 'tokenize' is a `with feedbench.stage` span, a block of "
            "code whose output feedbench cannot take; allowed: @feedbench.stage('tokenize') on a "
            "function that does its work, or one of CropV2, JitterV2, Spell, Mix",
        ),
        (
            {"skip_stages": ["Mix"]},
            "knob 'skip_stages': stage 'Mix' (known_costs.mix) takes (x, weight), and a skipped "
            "function returns its one argument; allowed: a stage whose function takes one "
            "argument, or cache_after 'Mix'",
        ),
        (
            {"device_stages": "Spell"},
            "knob 'device_stages': stage 'Spell' is a @feedbench.stage function; only a "
            "Compose's stages move to the batch; allowed: CropV2, JitterV2",
        ),
        (
            {"device_stages": "Jitter", "dataset": "known_costs:build"},
            "knob 'device_stages': stage 'Jitter' (known_costs.Jitter) is not a torchvision v2 "
            "transform; allowed: a stage from which on every transform is a "
            "torchvision.transforms.v2 one",
        ),
    ],
    ids=["unknown-stage", "span", "not-v2", "skip-two-arguments", "function-to-device"],
)
def test_a_stage_the_pipeline_does_not_have_or_cannot_move_is_one_line(user_module, knobs, line):
    dataset = _dataset(user_module, v2=knobs.get("dataset") != "known_costs:build")
    with pytest.raises(KnobError) as error:
        whatif.apply(_cell(user_module, **knobs), dataset, None)
    assert str(error.value) == line


def test_a_stream_has_no_index_to_cache_by_nor_a_sample_drawn_ahead(user_module):
    stream = _module(user_module).build_stream(None, n=8)
    with pytest.raises(KnobError) as error:
        whatif.apply(_cell(user_module, cache_after="Crop"), stream, None)
    assert str(error.value) == (
        "knob 'cache_after': an IterableDataset has no index to cache its samples by; allowed: "
        "null, or a map-style dataset"
    )
    with pytest.raises(KnobError) as error:
        whatif.apply(_cell(user_module, skip_stages=["Spell"]), stream, None)
    assert str(error.value) == (
        "knob 'skip_stages': stage 'Spell' is a @feedbench.stage function, found in a sample "
        "only, and no sample was drawn ahead of the loader (an IterableDataset's would change "
        "what it yields, or the first sample failed); allowed: Crop, Jitter"
    )


def test_a_cache_over_its_limit_fails_its_cell_with_one_line(user_module, tmp_path):
    knobs = {**BASE, **DEFAULTS_OF_CELL, "python_path": [user_module], "cache_after": "CropV2"}
    run(
        {**knobs, "cache_limit_mb": 64 / 2**20, "dataset_args": {"n": 16}}, str(tmp_path / "out")
    )  # 64 bytes: 4 samples
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] != "ok"
    assert result["error"]["message"] == (
        "knob 'cache_limit_mb': the cache after 'CropV2' outgrew its 64 bytes at sample 5 of 16 "
        "(about 256 bytes for all); allowed: a larger cache_limit_mb, or cache_after a stage "
        "whose output is smaller"
    )


def test_a_what_if_on_a_dataset_without_stages_stops_at_plan_time():
    config = {
        "defaults": {"device": "cpu"},
        "experiments": {
            "e": {
                "base": {"dataset": "synthetic", "model": "mlp"},
                "matrix": {"cache_after": ["decode"]},
            }
        },
    }
    validate_config(config, "config/schema.yaml")
    with pytest.raises(ConfigError) as error:
        build_cells(config, check=True)
    assert (
        "dataset 'synthetic' has no stages to change; allowed: null, or a dataset whose samples "
        "pass a torchvision" in (str(error.value))
    )
    assert "\n" not in str(error.value)
    with pytest.raises(
        KnobError, match=r"^knob 'device_stages': decoder 'torchvision-cuda' " r"runs no stage"
    ):
        parse_cell(
            {
                "dataset": "images",
                "data_dir": ".",
                "decoder": "torchvision-cuda",
                "device_stages": "Normalize",
            }
        )


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
    assert (
        "random stage cached: augmentation fixed (RandomResizedCrop)" in plan.facts["trades"]
    ) == (stage == "RandomResizedCrop")
    # found random by what it does on the first pass (harness.randomness.differs), not by its name
    assert plan.facts.get("frozen") == (["RandomResizedCrop"] if stage[0] == "R" else None)
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
    assert (
        crossing_bytes(4000, ["ToTensor", "Normalize"]) == 1000
        and crossing_bytes(4000, ["Normalize"]) == 4000
    )
    # A loader of 100 samples/s whose workers spend 10 ms a sample: 4 ms out, so 10 / 6 x 100;
    # compute 1000/s plus 0.5 ms a sample on the device; with 2 workers the slower side bounds it.
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

    def __getitem__(self, index):  # a vector a flip changes (a constant one is its own flip)
        return self.transform(torch.arange(4.0) + index), index


def build_flips(ctx, n=16):
    return Flips(n)


def model64(ctx):
    return nn.Linear(4, 1).double()


def step64(model, batch, ctx):
    assert batch[0].dtype == torch.float64 and batch[0].device.type == ctx.device.type, batch[0]
    return model(batch[0]).mean()
"""


def _random_cell(run_cell, module):
    with open(f"{module}/known_costs.py", "a") as f:
        f.write(RANDOM_V2)
    knobs = {
        **BASE,
        "dataset": "known_costs:build_flips",
        "model": "known_costs:model64",
        "step": "known_costs:step64",
    }
    knobs.update(
        python_path=[module],
        device_stages="RandomHorizontalFlip",
        steps=3,
        warmup_steps=1,
        stage_timing=False,
    )
    return run_cell(**knobs)


def test_a_random_device_stage_draws_per_batch_and_says_so(run_cell, user_module):
    code, result = _random_cell(run_cell, user_module)
    assert code == 0 and result["status"] == "ok", result["error"]
    found = result["metrics"]["whatif"]
    assert (
        found["device_stages"] == ["RandomHorizontalFlip", "ToDtype"]
        and found["device_ms_per_batch"] > 0
    )
    assert found["trades"] == [
        "RandomHorizontalFlip, ToDtype run on the batch after the copy",
        "per-sample random transform applied per batch (RandomHorizontalFlip)",
    ]


def test_a_user_dataset_without_a_compose_has_no_stage_to_name(user_module):
    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return torch.zeros(4), index

    with pytest.raises(KnobError) as error:
        whatif.apply(_cell(user_module, cache_after="Crop"), Plain(), None)
    assert str(error.value) == (
        "knob 'cache_after': the cell's pipeline has no stage 'Crop'; allowed: none: the dataset "
        "has no torchvision Compose, and its sample ran no @feedbench.stage function"
    )


@pytest.mark.slow  # two spawned workers start torch, per case
@pytest.mark.parametrize("stage, timed", [("CropV2", "Cached"), ("Spell", "Spell")])
def test_spawned_workers_map_the_file_cache(run_cell, user_module, tmp_path, stage, timed):
    """A spawned worker gets the cache's path, not its items, and maps the file itself
    (whatif.Store.__getstate__); for a decorated stage, it also gets what replaces the function
    (whatif.CachedSamples.__setstate__)."""
    knobs = {**BASE, "python_path": [user_module], "dataset_args": {"n": 16}, "num_workers": 2}
    code, result = run_cell(
        **knobs,
        multiprocessing_context="spawn",
        cache_after=stage,
        cache_in="file",
        steps=2,
        warmup_steps=1,
    )
    assert code == 0 and result["status"] == "ok", result["error"]
    assert result["metrics"]["whatif"]["trades"] == ["cache of 256 bytes on disk (stage_cache.pt)"]
    found = result["metrics"]["stages"]["stages"][timed]
    assert found["calls"] == 8  # the measured batches' samples, in workers
    assert found["median_ms"] < SCALE * 3.0 / 2  # a lookup: Spell itself sleeps 12 ms


def test_a_device_error_reading_the_device_stages_time_still_writes_the_result(
    run_cell, user_module, monkeypatch
):
    """N6 (#35): the device stages' time is read from CUDA events after the window, inside the
    runner's guarded read of the device's clocks. Their read raising as after a CUDA error (here on
    the CPU, where it reads host times) keeps what was measured: the result is written, the host
    phases and the what-if's facts are kept, the time is null, and the adjustments say why."""

    def unreadable(self, skip):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(whatif.DeviceStages, "ms_per_batch", unreadable)
    code, result = _random_cell(run_cell, user_module)
    assert code == 0 and result["status"] == "ok", result["error"]
    assert result["metrics"]["steps"] == 3 and result["metrics"]["samples_per_s"] > 0
    found = result["metrics"]["whatif"]
    assert (
        found["device_stages"] == ["RandomHorizontalFlip", "ToDtype"]
        and found["device_ms_per_batch"] is None
    )
    assert any(
        note.startswith(
            "GPU phases not recorded: the device's clocks could not be read "
            "(RuntimeError: CUDA error"
        )
        for note in result["adjustments"]
    )
