"""File chores every layer shares: atomic writes, fsync, content hashes, a data file's identity.

Ground floor: imports nothing of distil but errors, so data, tasks, eval, teacher and train
use one implementation each (a checkpoint, a teacher cache, a report and a data file are all
written through a temporary name and renamed, so a reader never sees half a file).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(
    path: str | os.PathLike, write: Callable[[str], Any], *, mode: int = 0o644
) -> None:
    """Call `write(tmp)` on a temporary file beside `path`, then rename it onto `path`.

    The temporary file is removed when `write` raises; `mode` is applied before the rename
    (mkstemp creates 0600; data files and reports are for everyone to read)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file's data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory's entries (a rename inside it) to the disk, where the platform can."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file's bytes, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def file_info(path: str | os.PathLike, *, rows: int) -> dict[str, Any]:
    """{"path" (absolute), "rows", "bytes", "sha256"}: enough to tell two data files apart."""
    return {
        "path": os.path.abspath(path),
        "rows": rows,
        "bytes": os.path.getsize(path),
        "sha256": sha256(path),
    }
