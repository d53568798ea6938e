"""The command line: flags that retarget the job, clear errors, and the spark-submit path (the
demo command: tests/test_demo.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from featureline.cli import main
from featureline.feature_store.redis_server import free_port
from tests.feast_data import write_handmade_output

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent


def test_flags_point_the_job_at_another_log(spark, small_log, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [
        "etl", "run", "--input", str(small_log), "--output", str(out),
        "--label", "value >= 20", "--categorical", "device", "--continuous", "price",
    ], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "rows: read 6,000" in result.output
    metadata = json.loads((out / "metadata.json").read_text())
    names = {f["name"] for f in metadata["features"]}
    assert metadata["label"]["rule"] == "value >= 20.0"
    assert {"device_cat", "price_norm"} <= names
    # The label's column is not a feature, and the undeclared context column is not read.
    assert "value_norm" not in names and "category_cat" not in names
    examples = pq.read_table(out / "examples").to_pandas()
    assert 0 < examples["label"].mean() < 1


def _featureline(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "featureline"), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_config_errors_stop_before_spark_with_the_key(tmp_path):
    bad_label = _featureline("etl", "run", "--label", "value >>= 4", "--output", str(tmp_path))
    assert bad_label.returncode == 2
    assert "--label: cannot parse 'value >>= 4'" in bad_label.stderr
    config = tmp_path / "featureline.yaml"
    config.write_text("etl:\n  features:\n    - op: categorify\n      columns: [genre]\n")
    bad_column = _featureline("etl", "run", "--config", str(config))
    assert bad_column.returncode == 2
    assert "etl.features[0].columns: unknown column 'genre'" in bad_column.stderr
    assert "Spark" not in bad_column.stderr  # no session was started


def test_the_flags_declare_columns_before_the_file_is_checked(tmp_path):
    """A spec over a column that only ``--categorical`` declares: the flags apply first, so
    the run gets past the configuration (to the missing input); without the flag the first
    setting that reads the column is named."""
    config = tmp_path / "my.yaml"
    config.write_text(
        "aggregations:\n  - name: user_genre\n    keys: [user_id, genre]\n"
        "    features: [{op: count, windows: [30d]}]\n"
        "  - name: genre_ratings\n    keys: [genre]\n"
        "    features: [{op: mean, column: rating, name: mean_rating}]\n"
        "etl:\n  features:\n    - op: categorify\n      columns: [user_id, item_id, genre]\n")
    missing = tmp_path / "ratings.csv"
    flagged = _featureline("etl", "run", "--config", str(config), "--input", str(missing),
                           "--categorical", "genre", "--continuous", "rating")
    assert flagged.returncode == 2
    assert "no file or folder matches the source path" in flagged.stderr, flagged.stderr
    unflagged = _featureline("etl", "run", "--config", str(config), "--input", str(missing))
    assert unflagged.returncode == 2
    assert "etl.features[0].columns: unknown column 'genre'" in unflagged.stderr


def _one_error(result: subprocess.CompletedProcess, code: int) -> list[str]:
    """The command failed with ``code``, printing one error line and one hint, no traceback
    and no Spark or Java output; those two lines."""
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[")]
    assert [line.split(":")[0] for line in lines] == ["error", "hint"], result.stderr
    for noise in ("Traceback", "Exception", "WARN", "Spark", "at org.", "uvicorn"):
        assert noise not in result.stderr, result.stderr
    return lines


@pytest.mark.slow
def test_each_front_door_error_is_one_line_a_hint_and_its_exit_code(tmp_path):
    missing = _one_error(_featureline("etl", "run", "--input", str(tmp_path / "no/*.jsonl"),
                                      "--output", str(tmp_path / "out")), 2)
    assert "no file or folder matches" in missing[0] and "--input" in missing[1]
    assert not (tmp_path / "out").exists()
    nowhere = tmp_path / "nowhere"
    config = tmp_path / "serve.yaml"
    config.write_text(f"api:\n  data: {nowhere}\n")
    for command in (("serve", "--config", str(config)), ("publish", "--data", str(nowhere)),
                    ("training-set", "--data", str(nowhere), "--entities", "rows.parquet",
                     "--out", str(tmp_path / "ts.parquet"))):
        error, hint = _one_error(_featureline(*command), 2)
        assert f"{nowhere}: no metadata.json" in error and "featureline etl run" in hint
    config.write_text("api:\n  port: eighty\n")
    error, _ = _one_error(_featureline("serve", "--config", str(config)), 2)
    assert error.startswith("error: api.port:")
    # A runtime failure: the online store does not answer.
    output = write_handmade_output(tmp_path / "handmade")
    down = subprocess.run([str(BIN / "featureline"), "publish", "--data", str(output)],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    error, hint = _one_error(down, 1)
    assert "is unavailable" in error and "featureline redis start" in hint


def test_gpu_profile_without_the_rapids_jar_is_a_clear_error(tmp_path):
    env_without_jar = {k: v for k, v in os.environ.items() if k != "RAPIDS_JAR"}
    result = subprocess.run([str(BIN / "featureline"), "etl", "run", "--profile", "gpu",
                             "--output", str(tmp_path / "out")], capture_output=True, text=True,
                            cwd=REPO, env=env_without_jar, timeout=120)
    assert result.returncode == 2
    assert "etl.spark.rapids_jar" in result.stderr and "RAPIDS_JAR" in result.stderr
    assert not (tmp_path / "out").exists()


def test_datagen_command(tmp_path):
    result = _featureline("datagen", "--events", "500", "--users", "20", "--items", "30",
                          "--days", "2", "--out", str(tmp_path / "e.csv"), "--format", "csv",
                          "--bad-fraction", "0.1")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["rows"] == 500 and sum(report["bad_rows"].values()) == 50
    assert len((tmp_path / "e.csv").read_text().splitlines()) == 501


@pytest.mark.slow
def test_spark_submit_runs_the_same_job(small_log, tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    result = subprocess.run(
        [str(BIN / "spark-submit"), "--properties-file", "spark_conf/cpu.conf",
         "--master", "local[1]", "--conf", "spark.sql.shuffle.partitions=2",
         "--conf", "spark.driver.memory=1g", "etl/main.py",
         "--input", str(small_log), "--output", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rows: read 6,000" in result.stdout
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert metadata["rows"]["read"] == 6000


@pytest.mark.slow
def test_csv_and_parquet_logs_through_the_whole_job(spark, tmp_path):
    from featureline.etl.datagen import write_log

    for fmt in ("csv", "parquet"):
        log = write_log(tmp_path / f"events.{fmt}", events=3000, users=80, items=60, days=4,
                        seed=5, bad_fraction=0.03, fmt=fmt)
        out = tmp_path / f"out-{fmt}"
        result = CliRunner().invoke(main, ["etl", "run", "--input", str(log.path),
                                           "--output", str(out)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        rows = json.loads((out / "metadata.json").read_text())["rows"]
        bad = dict(log.bad_rows)
        assert rows["duplicates"] == bad.pop("duplicate")
        assert {k: v for k, v in rows["quarantined"].items() if v} == bad
        assert rows["accepted"] == 3000 - sum(log.bad_rows.values())
