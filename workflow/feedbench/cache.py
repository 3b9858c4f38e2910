"""The page-cache state of a dataset's files when the measurement starts.

DS-Analyzer separates the two halves of a data stall: the fetch stall (files
not in memory) and the prep stall (decoding and augmenting). That needs the
same run from a warm cache (every file read once beforehand: fully cached)
and from a cold one (every file evicted). Evicting takes root for
/proc/sys/vm/drop_caches; without it posix_fadvise(DONTNEED) asks the kernel
to drop each file's clean pages, which it does unless another process maps
them. Whatever happened is recorded, and a cold cache that could not be made
says so: it must never pass for one.
"""

from __future__ import annotations

import os

DROP_CACHES = "/proc/sys/vm/drop_caches"
CHUNK = 1 << 20


def dataset_files(dataset) -> list[str]:
    """The files an ImageFolder-like dataset reads per sample (its `samples` paths); [] when it reads none."""
    inner = getattr(dataset, "dataset", dataset)  # through the Delayed wrapper
    return [path for path, _ in getattr(inner, "samples", [])]


def warm(paths: list[str]) -> int:
    """Read every file once so the measured run finds them all in the page cache; returns the bytes read."""
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(CHUNK):
                total += len(chunk)
    return total


def _fadvise_out(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold(paths: list[str], drop_caches: str = DROP_CACHES) -> tuple[str, str | None]:
    """Evict the files from the page cache; returns (method, note): 'drop_caches', 'fadvise' or 'none' (could not)."""
    os.sync()
    try:
        with open(drop_caches, "w") as f:
            f.write("3\n")
        return "drop_caches", None
    except OSError as error:
        why = f"{drop_caches} is not writable ({error.strerror or error})"
    if not hasattr(os, "posix_fadvise"):
        return "none", f"cold cache could not be made: {why} and this system has no posix_fadvise"
    try:
        _fadvise_out(paths)
    except OSError as error:
        return "none", f"cold cache could not be made: {why} and posix_fadvise failed ({error})"
    return "fadvise", f"cold cache by posix_fadvise(DONTNEED) per file: {why}; pages another process maps stay cached"


def prepare(dataset, mode: str) -> dict:
    """Put the dataset's files in the page-cache state `mode` asks for; the record for result.json."""
    paths = dataset_files(dataset)
    record = {"requested": mode, "effective": "asis", "method": None, "files": len(paths), "bytes": None, "note": None}
    if mode == "warm":
        record.update(effective="warm", method="read", bytes=warm(paths))
    elif mode == "cold":
        method, note = cold(paths)
        record.update(effective="cold" if method != "none" else "asis", method=method, note=note)
    return record
