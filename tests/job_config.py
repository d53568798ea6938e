"""The job configuration the tests run with: embedded defaults on a small local Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from featureline.etl.config import EtlConfig, SparkSettings, with_overrides

# Queries of the suite's size run interpreted: each generated class costs Janino and the JIT
# more than the thousands of rows it would process (a job run of the suite's small log in the
# shared session: 0.72x the CPU; benchmarks/README.md, "The suite"). Spark's own tests run both
# ways. The job processes the tests start get these too, as Java system properties
# (tests/conftest.py); the profiles keep code generation on.
INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}

TEST_SPARK = SparkSettings(
    master="local[2]",
    properties={
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.driver.memory": "2g",
        # One session runs the whole suite on rows in the thousands: Spark would size its
        # memory pages for the heap (32 MB at 2 GB and two cores), one per sort, aggregation
        # and window buffer of every running task, and a job with many windows held more
        # pages than the heap beside them could spare.
        "spark.buffer.pageSize": "2m",
        # Nor need the suite's hundreds of queries stay in the status store.
        "spark.sql.ui.retainedExecutions": "20",
        # Adaptive execution re-plans the rest of a query each time one of its stages ends:
        # on rows in the thousands that is a quarter of a job run (the incremental tests' new
        # days take 0.75× the time without it, benchmarks/README.md).
        # The profiles keep it on, and the runs from them run with it (the demo's,
        # spark-submit's with spark_conf/cpu.conf, the installed wheel's).
        "spark.sql.adaptive.enabled": "false",
        **INTERPRETED,
    },
)


# The tests' runs label each event by its own type (every event an example: their checks
# read every event); tests/test_label_join.py and the end-to-end runs use the default join.
PER_EVENT_LABEL = "event_type in (click, purchase)"


def make_config(tmp_path: Path, source: Path, **overrides: Any) -> EtlConfig:
    """The embedded defaults pointed at ``source`` and writing under ``tmp_path``, each event
    labelled by its own type unless ``label`` is given."""
    config = with_overrides(EtlConfig(), input_path=str(source), output=str(tmp_path / "out"))
    data = config.model_dump(mode="json")
    data["spark"] = TEST_SPARK.model_dump(mode="json")
    data["label"] = PER_EVENT_LABEL
    for key, value in overrides.items():
        data[key] = value
    return EtlConfig.model_validate(data)
