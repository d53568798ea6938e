"""The daemon the job's Python tasks run under (etl/python_daemon.py): an archive on the path
read once until it changes, the imports' objects frozen after the task that made them — and
the suite's own Spark workers running under it."""

from __future__ import annotations

import gc
import sys
import types
import zipfile
import zipimport

import pytest

from featureline.etl import python_daemon
from featureline.etl.config import SparkSettings
from featureline.etl.session import PYTHON_DAEMON, spark_properties


def _zip(path, *names):
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(f"{name}.py", f"NAME = {name!r}\n")


@pytest.fixture
def archives_read_once(monkeypatch):
    """The patch applied for the test only (the suite's own imports keep the stock one)."""
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches",
                        zipimport.zipimporter.invalidate_caches)
    reads = []
    read_directory = zipimport._read_directory

    def counting(archive):
        reads.append(archive)
        return read_directory(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counting)
    python_daemon.read_archives_once()
    return reads


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="zipimport is lazy from 3.12 on")
def test_an_archive_is_read_again_only_once_it_changed(tmp_path, archives_read_once):
    archive = tmp_path / "lib.zip"
    _zip(archive, "first")
    importer = zipimport.zipimporter(str(archive))
    archives_read_once.clear()
    for _ in range(3):  # what PySpark's worker does before every task
        importer.invalidate_caches()
    assert archives_read_once == [str(archive)]  # the first call reads; the others find it
    assert importer.find_spec("first") is not None and importer.find_spec("second") is None
    _zip(archive, "first", "second")  # a bigger file: changed
    importer.invalidate_caches()
    assert archives_read_once == [str(archive)] * 2
    assert importer.find_spec("second") is not None


def test_a_task_that_imports_freezes_what_is_left_after_a_collection():
    def task(infile, outfile):
        import colorsys  # noqa: F401 - not imported by the suite before

        return "done"

    daemon = types.SimpleNamespace(worker_main=task)
    python_daemon.freeze_after_imports(daemon)
    sys.modules.pop("colorsys", None)
    frozen = gc.get_freeze_count()
    try:
        assert daemon.worker_main(None, None) == "done"
        assert gc.get_freeze_count() > frozen
        gc.unfreeze()
        # A task that imports nothing leaves the collector as it was.
        assert daemon.worker_main(None, None) == "done"
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_every_profile_runs_its_python_tasks_under_the_daemon():
    assert spark_properties(SparkSettings())["spark.python.daemon.module"] == PYTHON_DAEMON
    # A user's own choice stays.
    own = SparkSettings(properties={"spark.python.daemon.module": "mine.daemon"})
    assert spark_properties(own)["spark.python.daemon.module"] == "mine.daemon"


def test_the_suites_workers_run_under_it(spark):
    def importing(_):
        import fractions  # noqa: F401 - the worker's first task imports, at the least

        yield 0

    def seen(_):
        import zipimport as imported

        yield (sys.argv[0], imported.zipimporter.invalidate_caches.__name__,
               gc.get_freeze_count() > 0)

    spark.sparkContext.parallelize(range(4), 4).mapPartitions(importing).collect()
    results = spark.sparkContext.parallelize(range(4), 4).mapPartitions(seen).collect()
    for argv0, invalidate, _ in results:
        assert argv0.endswith("etl/python_daemon.py")
        assert invalidate == ("invalidate_caches" if sys.version_info >= (3, 12)
                              else "invalidate_changed")
    # Workers are reused: one that imported in the job before has frozen since.
    assert any(frozen for *_, frozen in results)
