"""What the published report says about where it was made: paths shortened, hosts and paths withheld
when anonymized."""

from __future__ import annotations

import json
import os
import re
import socket
import sys

import pytest
from conftest import ROOT
from feedbench.analysis.aggregate import read_summary
from feedbench.analysis.disclosure import Disclosure
from helpers.real_results import EXPERIMENTS, real_matrix  # noqa: F401 (fixture)
from helpers.reports import text_report

# Stands for /home/<user>: the folder holding the virtual env, whose files a real traceback names.
HOME = os.path.dirname(sys.prefix)


@pytest.mark.parametrize(
    "text, shown",
    [
        (
            'File "/work/run/results/cells/x/result.json", line 3',
            'File "results/cells/x/result.json", line 3',
        ),  # the cwd
        ("/work/run", "."),
        ("open /home/me/data/images/a.jpg", "open ~/data/images/a.jpg"),  # $HOME
        ("/home/alice/venv/lib/torch/nn.py:12", "~/venv/lib/torch/nn.py:12"),  # someone's home
        ("/Users/bob/x", "~/x"),
        # no user in it
        (
            "/usr/lib/python3/site-packages/torch/nn.py",
            "/usr/lib/python3/site-packages/torch/nn.py",
        ),
        ("https://example.com/a/b and 1/5/50 and samples/s and load / transfer",) * 2,  # not paths
    ],
)
def test_paths_are_relative_or_from_home(text, shown):
    assert Disclosure(cwd="/work/run", home="/home/me").text(text) == shown


def test_paths_under_the_configs_folder_read_as_the_config_writes_them():
    """#49: a project run with --directory elsewhere printed its python_path absolute; under the
    config's folder a path is shown relative to it, after the working directory's."""
    d = Disclosure(cwd="/work/run", home="/home/me", config_dir="/proj/feedbench")
    assert d.text("python_path: [/proj/feedbench/src]") == "python_path: [./src]"
    assert d.text('File "/proj/feedbench/src/reviews/data.py"') == 'File "./src/reviews/data.py"'
    assert d.text("/proj/feedbench and /proj/other") == "./ and /proj/other"
    assert d.text("/work/run/results/x.json") == "results/x.json"


def test_anonymize_cuts_other_paths_and_withholds_hosts():
    d = Disclosure.of({"report": {"anonymize": True}}, hosts=["gpu7.cluster.example.org", None])
    d = Disclosure(anonymize=True, cwd="/work/run", home="/home/me", hosts=d.hosts)
    assert (
        d.text('File "/usr/lib/python3/site-packages/torch/nn.py", line 1') == "File "
        '"…/nn.py", '
        "line 1"
    )
    assert d.text("/work/run/results/x.json and ~/y") == "results/x.json and ~/y"
    assert (
        d.text("NCCL error on gpu7.cluster.example.org:4242 (gpu7)") == "NCCL error on "
        "[host]:4242 "
        "([host])"
    )
    assert d.text("gpu7_count stays") == "gpu7_count stays"
    assert not Disclosure.of({}).anonymize and not Disclosure.of({"report": {}}).anonymize


@pytest.fixture(scope="module")
def config():
    experiments = json.loads(json.dumps(EXPERIMENTS))
    experiments["broken"] = {
        "title": "A dataset with a truncated JPEG",
        "base": {"dataset": "images"},
        "matrix": {"model": ["resnet18"]},
    }
    # A data_dir under the pretend home: the config as run is printed in the report.
    return {
        "defaults": {"steps": 6, "data_dir": os.path.join(HOME, "images")},
        "experiments": experiments,
    }


def test_tracebacks_show_no_user_folder(real_matrix, config, tmp_path, monkeypatch):  # noqa: F811
    """A real failed cell's traceback names files of the virtual env: rendered with HOME at the
    env's folder (standing in for /home/<user>), they read ~/..., and the folder's absolute path is
    nowhere in the page."""
    monkeypatch.setenv("HOME", HOME)
    monkeypatch.chdir(tmp_path)
    with open(real_matrix.failing) as f:
        traceback = json.load(f)["error"]["traceback"]
    # the result keeps the full path: the report shortens it when rendering
    assert f'File "{HOME}/' in traceback
    html = text_report(str(tmp_path), real_matrix.paths, config)
    assert "File &#34;~/" in html and "data_dir: ~/images" in html
    assert HOME + "/" not in html
    assert socket.gethostname() in html  # not anonymized: the host stays


def test_anonymize_withholds_the_host_and_every_absolute_path(
    real_matrix,  # noqa: F811
    config,
    tmp_path,
    monkeypatch,
):
    monkeypatch.chdir(tmp_path)
    html = text_report(str(tmp_path), real_matrix.paths, {**config, "report": {"anonymize": True}})
    assert socket.gethostname() not in html
    assert "Anonymized" in html
    # the traceback's frames keep their file names
    assert re.search(r"File &#34;…/\w+\.py&#34;, line \d+", html)
    text = html.split("<main", 1)[1]
    assert not [
        line
        for line in text.splitlines()
        if "/work/" in line or "/home/" in line or "/tmp/" in line
    ]
    # the summary keeps it
    assert read_summary(os.path.join(tmp_path, "summary.csv"))["host"].notna().all()


def test_the_config_key_defaults_to_false_and_refuses_other_values():
    from feedbench.plan.config import schema_error
    from snakemake.utils import validate

    schema = os.path.join(ROOT, "config", "schema.yaml")
    config = {"experiments": {"e": {}}}
    validate(config, schema)
    assert config["report"] == {"anonymize": False}
    with pytest.raises(Exception) as raised:
        validate({"experiments": {"e": {}}, "report": {"anonymize": "yes"}}, schema)
    line = schema_error(raised.value.__context__)
    assert line == "report.anonymize: value 'yes' has the wrong type; allowed: true or false"
