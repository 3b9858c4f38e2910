"""page_cache warm / cold: the files really are in (or out of) the page cache when the window
starts.

The page cache is read back with util-linux's fincore, the kernel's own count
of a file's resident pages, so the tests check the state, not our record of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from feedbench.harness.cache import cold, dataset_files, prepare, resident_fraction, warm
from feedbench.harness.cache import resident_pages as mincore_pages
from feedbench.harness.images import make_images
from helpers.cells import TINY_LOADER

pytestmark = pytest.mark.skipif(
    shutil.which("fincore") is None, reason="needs util-linux fincore to read the page cache"
)


def resident_pages(paths) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "PAGES", *paths],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(int(line) for line in out.split())


@pytest.fixture
def images(tmp_path):
    make_images(str(tmp_path / "images"), count=24, size=96, classes=2, seed=1)
    from torchvision.datasets import ImageFolder

    folder = ImageFolder(str(tmp_path / "images" / "train"))
    return folder, dataset_files(folder)


def test_warm_reads_every_file_into_the_cache(images):
    folder, paths = images
    cold(paths)
    record = prepare(folder, "warm")
    assert record["effective"] == "warm" and record["files"] == 24
    assert record["bytes"] == sum(os.path.getsize(p) for p in paths)
    assert resident_pages(paths) >= sum(
        -(-os.path.getsize(p) // os.sysconf("SC_PAGE_SIZE")) for p in paths
    )


def test_cold_by_fadvise_when_drop_caches_is_out_of_reach(images, tmp_path):
    """Not root (here: a drop_caches path that cannot be opened): each file is evicted with
    posix_fadvise, and the note says so."""
    _, paths = images
    warm(paths)
    assert resident_pages(paths) > 0
    method, note = cold(paths, drop_caches=str(tmp_path / "no" / "drop_caches"))
    assert method == "fadvise" and "posix_fadvise" in note and "not writable" in note
    assert resident_pages(paths) == 0


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/proc/sys/vm/drop_caches", os.W_OK),
    reason="drop_caches needs root (CI runs as root)",
)
def test_cold_by_drop_caches_as_root(images):
    folder, paths = images
    warm(paths)
    record = prepare(folder, "cold")
    if record["method"] != "drop_caches":  # a container may keep /proc/sys read-only even for root
        pytest.skip(f"drop_caches refused here: {record['note']}")
    assert record["effective"] == "cold" and record["note"] is None
    assert resident_pages(paths) == 0


def total_pages(paths) -> int:
    return sum(-(-os.path.getsize(p) // os.sysconf("SC_PAGE_SIZE")) for p in paths)


def test_mincore_counts_the_pages_fincore_counts(images):
    """Our mincore(2) reading agrees with util-linux fincore, file by file, cold, half-warm and
    warm."""
    _, paths = images
    cold(paths, drop_caches="/nonexistent/drop_caches")
    warm(paths[: len(paths) // 2])
    fraction = resident_fraction(paths)
    assert 0.3 < fraction < 0.7
    # A cold cell as root elsewhere in the suite drops the machine's whole page cache at any moment
    # (drop_caches): pages may leave between two reads, and none come back, since nothing reads
    # these files. So fincore's count lies between ours before it and ours after it.
    for path in paths:
        before = mincore_pages(path)
        counted = resident_pages([path])
        assert before[1] == total_pages([path]) and before[0] >= counted >= mincore_pages(path)[0]
    counted = resident_pages(paths) / total_pages(paths)
    assert fraction >= counted >= resident_fraction(paths)


def test_warm_and_cold_record_the_residency_they_reached(images):
    folder, paths = images
    record = prepare(folder, "warm")
    assert record["resident_fraction"] == 1.0 == resident_pages(paths) / total_pages(paths)
    cold(paths, drop_caches="/nonexistent/drop_caches")
    assert resident_fraction(paths) == 0.0
    assert prepare(folder, "asis")["resident_fraction"] is None


def test_a_cell_records_its_page_cache_and_ignores_it_where_no_file_is_read(run_cell, tmp_path):
    make_images(str(tmp_path / "imgs"), count=16, size=48, classes=2, seed=0)
    common = dict(
        scenario="loader",
        dataset="images",
        data_dir=str(tmp_path / "imgs"),
        image_size=32,
        batch_size=4,
        steps=2,
        warmup_steps=1,
        device="cpu",
    )
    code, result = run_cell(page_cache="warm", **common)
    assert (
        code == 0
        and result["page_cache"]["effective"] == "warm"
        and result["page_cache"]["files"] == 16
    )
    assert result["page_cache"]["resident_fraction"] == 1.0
    code, result = run_cell(page_cache="cold", **common)
    assert (
        code == 0
        and result["page_cache"]["effective"] == "cold"
        and result["page_cache"]["method"] in ("drop_caches", "fadvise")
    )
    code, result = run_cell(**TINY_LOADER, page_cache="cold")
    assert (
        code == 0
        and result["page_cache"]["effective"] == "asis"
        and result["cell"]["page_cache"] == "asis"
    )
    assert "page_cache=cold ignored: dataset 'synthetic' reads no files" in result["adjustments"]
