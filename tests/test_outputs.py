"""The output folder's swap: atomic, one run at a time, and what a killed run leaves behind is
cleared by the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from featureline.core.errors import OutputLockedError
from featureline.core.files import output_lock, publish_directory, staged_directory
from featureline.etl import job
from tests.job_config import make_config


def _folder(path: Path, **files: str) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def test_publish_exchanges_the_folders(tmp_path):
    final = _folder(tmp_path / "out", old="previous")
    staging = _folder(tmp_path / ".out.staging-1", new="complete")
    publish_directory(staging, final)
    assert sorted(p.name for p in final.iterdir()) == ["new"]
    assert not staging.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_second_run_fails_at_once_naming_the_holder(tmp_path):
    final = tmp_path / "out"
    with output_lock(final), pytest.raises(OutputLockedError) as error:  # noqa: SIM117
        with staged_directory(final):
            pytest.fail("entered a locked output")
    assert f'"pid": {os.getpid()}' in str(error.value)
    with staged_directory(final) as staging:  # released: the next run goes ahead
        (staging / "metadata.json").write_text("{}")
    assert (final / "metadata.json").is_file()


def test_a_job_on_a_locked_output_stops_before_touching_it(spark, small_log, tmp_path):
    config = make_config(tmp_path, small_log)
    final = Path(config.output.path)
    _folder(final, **{"metadata.json": json.dumps({"previous": True})})
    with output_lock(final), pytest.raises(OutputLockedError, match="another run"):
        job.run(config, spark, progress=lambda _: None)
    assert json.loads((final / "metadata.json").read_text()) == {"previous": True}
    assert [p.name for p in tmp_path.iterdir() if "staging" in p.name] == []


def test_a_killed_run_leaves_the_previous_output_and_the_next_clears_its_staging(tmp_path):
    final = _folder(tmp_path / "out", **{"metadata.json": "previous"})
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from featureline.core.files import staged_directory
        with staged_directory(Path({str(final)!r})) as staging:
            (staging / "metadata.json").write_text("half")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    killed = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert killed.returncode == -9
    assert (final / "metadata.json").read_text() == "previous"
    (left,) = [p for p in tmp_path.iterdir() if ".staging-" in p.name]
    with staged_directory(final) as staging:
        assert not left.exists()  # cleared as the next run starts
        (staging / "metadata.json").write_text("next")
    assert (final / "metadata.json").read_text() == "next"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]


def test_write_each_writes_every_table_with_the_callers_stage_and_raises_a_failure(spark,
                                                                                  tmp_path):
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    from featureline.etl.outputs import write_each
    from featureline.etl.stages import STAGE_PROPERTY

    @F.udf("string")
    def stage_of_task(_: int) -> str | None:
        task = TaskContext.get()
        return None if task is None else task.getLocalProperty(STAGE_PROPERTY)

    tables = [(spark.range(n).withColumn("stage", stage_of_task("id")), tmp_path / f"t{n}")
              for n in (3, 5, 7, 11, 13)]
    context = spark.sparkContext
    context.setLocalProperty(STAGE_PROPERTY, "entities")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. pyspark's "Tags will not be inherited"
            write_each(tables, workers=3)
        failing = spark.range(4).select(
            F.when(F.col("id") == 2, F.raise_error(F.lit("tile 2 broke"))).alias("x"))
        with pytest.raises(Exception, match="tile 2 broke"):
            write_each([(failing, tmp_path / "bad"), (spark.range(2), tmp_path / "after")])
    finally:
        context.setLocalProperty(STAGE_PROPERTY, None)
    for n in (3, 5, 7, 11, 13):
        rows = spark.read.parquet(str(tmp_path / f"t{n}")).collect()
        assert sorted(row.id for row in rows) == list(range(n))
        assert {row.stage for row in rows} == {"entities"}  # each thread's jobs carry it
        assert len(list((tmp_path / f"t{n}").glob("*.parquet"))) == 1
    # The other write ends before the failure is raised.
    assert spark.read.parquet(str(tmp_path / "after")).count() == 2
