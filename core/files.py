"""Folders published whole: a reader of the path sees the complete previous folder or the
complete new one, never a mix, whatever happens to the writer.

The swap is one atomic exchange of two paths (Linux ``renameat2(RENAME_EXCHANGE)``); where
that is not available it falls back to two renames, and a crash between them leaves the
previous folder beside the path as ``.<name>.old-*``. ``staged_directory`` writes a folder
that way under a lock file beside it (``.<name>.lock``): one writer at a time, a second
fails at once naming the holder, and the writer holding it first removes the staging and
retired folders killed writers left (the ETL's output, the trainer's HugeCTR tables).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from featureline.core.errors import OutputLockedError

CACHE_ENV = "FEATURELINE_CACHE"

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def cache_root() -> Path:
    """Where fetched tools and prepared archives live: ``FEATURELINE_CACHE``, else
    ``~/.cache/featureline``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "featureline"


def write_whole(path: Path, write: Callable[[Path], object]) -> None:
    """A file published whole: ``write`` fills a hidden file beside ``path``, renamed onto it
    once complete (removed if ``write`` fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def partial_path(path: Path) -> Path:
    """A hidden name beside ``path`` to write it under until it is complete."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")


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


def fetched_once(final: Path, complete: str, fetch: Callable[[Path], None]) -> Path:
    """``final``, holding ``complete`` once whole: the first call has ``fetch`` fill a staging
    folder and publishes it; a failed fetch leaves nothing behind."""
    if not (final / complete).is_file():
        staging = staging_folder(final)
        try:
            fetch(staging)
            publish_directory(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return final


@contextmanager
def output_lock(final: Path) -> Iterator[None]:
    """One writer at a time on ``final``; the lock file beside it says who holds it."""
    final.parent.mkdir(parents=True, exist_ok=True)
    path = final.parent / f".{final.name}.lock"
    with path.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise OutputLockedError(str(final), lock.read().strip() or "unknown") from None
        lock.truncate(0)
        lock.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                               "since": datetime.now(timezone.utc).isoformat()}))
        lock.flush()
        try:
            yield
        finally:
            lock.truncate(0)
            fcntl.flock(lock, fcntl.LOCK_UN)


def remove_leftovers(final: Path) -> list[Path]:
    """Staging and retired folders of writers that were killed (call holding the lock)."""
    leftovers = [p for pattern in (f".{final.name}.staging-*", f".{final.name}.old-*")
                 for p in final.parent.glob(pattern) if p.is_dir()]
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


@contextmanager
def staged_directory(final: Path) -> Iterator[Path]:
    """Yield a fresh staging folder; on success it replaces ``final``, on failure it goes.

    Holds the folder's lock throughout (a second writer fails at once, naming the holder),
    and first clears what killed writers left behind."""
    with output_lock(final):
        remove_leftovers(final)
        staging = staging_folder(final)
        try:
            yield staging
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        publish_directory(staging, final)
