"""Folders published whole: a reader of the path sees the complete previous folder or the
complete new one, never a mix, whatever happens to the writer.

The swap is one atomic exchange of two paths (Linux ``renameat2(RENAME_EXCHANGE)``); where
that is not available it falls back to two renames, and a crash between them leaves the
previous folder beside the path as ``.<name>.old-*``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import uuid
from pathlib import Path

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one atomic step; False where the system cannot."""
    rename = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if rename is None:
        return False
    done = rename(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second),
                  _RENAME_EXCHANGE)
    if done == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # old kernel or file system
        return False
    raise OSError(code, os.strerror(code), str(first))


def staging_folder(final: Path) -> Path:
    """A fresh folder beside ``final`` to write its next version into."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.staging-{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    return staging


def publish_directory(staging: Path, final: Path) -> None:
    """Put the complete folder ``staging`` at ``final``; the previous content goes."""
    if not final.exists():
        os.rename(staging, final)
        return
    if exchange(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # now the previous version
        return
    retired = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
    os.rename(final, retired)
    os.rename(staging, final)
    shutil.rmtree(retired, ignore_errors=True)
