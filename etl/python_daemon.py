"""The daemon the job's Python tasks run under (``spark.python.daemon.module``): PySpark's own,
with two fixed costs of every task taken out (docs/ARCHITECTURE.md, "Local runs"):

- before each task PySpark's worker calls ``importlib.invalidate_caches()``, which on Python
  before 3.12 re-reads the whole directory of every zip archive on the path (CPython
  gh-103200; pyspark.zip, py4j's zip, the spark-core jar): here an archive is read again only
  once its file changed;
- after each task the daemon's worker runs a full ``gc.collect()``, which walks every object
  the imports made (pyarrow, numba, the writer): here, after a task that imported modules,
  the worker collects once and freezes what is left, so later collections skip it.

Started by Spark as ``python -m featureline.etl.python_daemon pyspark.worker``; it forks every
worker, so it imports nothing heavy.
"""

from __future__ import annotations

import gc
import os
import sys
import zipimport
from typing import Any


def _archive_stamp(archive: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(archive)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def read_archives_once() -> None:
    """Make ``zipimporter.invalidate_caches`` re-read an archive only once it changed."""
    if sys.version_info >= (3, 12):  # pragma: no cover - lazy there already
        return
    invalidate = zipimport.zipimporter.invalidate_caches

    def invalidate_changed(self: Any) -> None:
        # Per importer: several (one per package prefix) can share one archive.
        stamp = _archive_stamp(self.archive)
        if stamp is not None and getattr(self, "_read_stamp", None) == stamp:
            return
        invalidate(self)
        self._read_stamp = stamp

    zipimport.zipimporter.invalidate_caches = invalidate_changed  # type: ignore[method-assign]


def freeze_after_imports(daemon: Any) -> None:
    """Wrap ``daemon``'s worker entry: after a task that imported modules, collect and
    freeze."""
    run = daemon.worker_main

    def main(infile: Any, outfile: Any) -> Any:
        modules = len(sys.modules)
        try:
            return run(infile, outfile)
        finally:
            if len(sys.modules) > modules:
                gc.collect()
                gc.freeze()

    daemon.worker_main = main


def main() -> None:
    read_archives_once()
    from pyspark import daemon

    freeze_after_imports(daemon)
    daemon.manager()


if __name__ == "__main__":
    main()
