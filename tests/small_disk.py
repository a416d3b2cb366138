"""A real small disk to fill: a tmpfs of a few megabytes, mounted for one test (as root) and unmounted after."""
from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(folder: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of size_mb at folder; the test is skipped, saying why, where it cannot be mounted (not root)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"a full disk needs a small tmpfs, and mount failed ({done.stderr.strip() or done.returncode}): "
                    "run as root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Write a filler file until the disk holding folder has no space left; returns it (delete it to free the
    space)."""
    filler = folder / "filler"
    block = b"\0" * (64 << 10)
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    for size in (4096, 512, 1):  # the last partial blocks
        try:
            with open(filler, "ab", buffering=0) as out:
                while True:
                    out.write(b"\0" * size)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    assert os.statvfs(folder).f_bavail == 0
    return filler
