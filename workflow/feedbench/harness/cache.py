"""The page-cache state of a dataset's files when the measurement starts.

DS-Analyzer separates the two halves of a data stall: the fetch stall (files
not in memory) and the prep stall (decoding and augmenting). That needs the
same run from a warm cache (every file read once beforehand: fully cached)
and from a cold one (every file evicted). Evicting takes root for
/proc/sys/vm/drop_caches; without it posix_fadvise(DONTNEED) asks the kernel
to drop each file's clean pages, which it does unless another process maps
them. Whatever happened is recorded, and a cold cache that could not be made
says so: it must never pass for one. Reading every file once does not prove
they are cached either (a dataset larger than memory evicts its own first
files), so after warming the share of the files' pages resident in the page
cache is measured with mincore(2), as util-linux `fincore` does, and recorded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os

DROP_CACHES = "/proc/sys/vm/drop_caches"
CHUNK = 1 << 20


def dataset_files(dataset) -> list[str]:
    """The files an ImageFolder-like dataset reads per sample (its `samples` paths); [] when it
    reads none."""
    inner = getattr(dataset, "dataset", dataset)  # through the Delayed wrapper
    return [path for path, _ in getattr(inner, "samples", [])]


def warm(paths: list[str]) -> int:
    """Read every file once so the measured run finds them all in the page cache; returns the bytes
    read."""
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(CHUNK):
                total += len(chunk)
    return total


@functools.cache
def _libc():
    """libc's mmap, mincore and munmap: Python's mmap module does not expose mincore(2)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mmap.restype = ctypes.c_void_p
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def resident_pages(path: str) -> tuple[int, int]:
    """(pages of `path` in the page cache, pages of `path`): map it, ask mincore(2), unmap; mapping
    reads nothing."""
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    if size == 0:
        return 0, 0
    libc = _libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            error = ctypes.get_errno()
            raise OSError(error, f"mmap of {path} failed: {os.strerror(error)}")
        try:
            vector = (ctypes.c_ubyte * pages)()
            if libc.mincore(address, size, vector) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"mincore of {path} failed: {os.strerror(error)}")
            return sum(v & 1 for v in vector), pages
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def resident_fraction(paths: list[str]) -> float | None:
    """The share of the files' pages in the page cache (0..1); None for no files or where mincore is
    unavailable."""
    cached = total = 0
    try:
        for path in paths:
            c, t = resident_pages(path)
            cached, total = cached + c, total + t
    except (OSError, AttributeError):
        return None
    return cached / total if total else None


def _fadvise_out(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold(paths: list[str], drop_caches: str = DROP_CACHES) -> tuple[str, str | None]:
    """Evict the files from the page cache; returns (method, note): 'drop_caches', 'fadvise' or
    'none' (could not)."""
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
    return (
        "fadvise",
        f"cold cache by posix_fadvise(DONTNEED) per file: {why}; pages another "
        "process maps stay cached",
    )


def prepare(dataset, mode: str) -> dict:
    """Put the dataset's files in the page-cache state `mode` asks for; the record for
    result.json."""
    paths = dataset_files(dataset)
    record = {
        "requested": mode,
        "effective": "asis",
        "method": None,
        "files": len(paths),
        "bytes": None,
        "note": None,
        "resident_fraction": None,
    }
    if mode == "warm":
        record.update(effective="warm", method="read", bytes=warm(paths))
        record["resident_fraction"] = resident_fraction(paths)
    elif mode == "cold":
        method, note = cold(paths)
        record.update(effective="cold" if method != "none" else "asis", method=method, note=note)
        record["resident_fraction"] = resident_fraction(paths)
    return record
