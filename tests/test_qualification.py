"""The GPU plan, checked by NVIDIA's Qualification tool: no operator of the job falls back to
the CPU. The tool is a real Java program fetched from PyPI on first use (no GPU needed); the
test skips only where Java or the package registry is not there."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from featureline.etl.qualification import (
    JOB_STAGES,
    UNTAGGED,
    QualificationError,
    job_stages,
    summarize,
)

BIN = Path(sys.executable).parent


def _event(name: str, **fields) -> str:
    return json.dumps({"Event": name, **fields})


def test_spark_stages_are_attributed_to_the_job_stage_that_ran_them_first(tmp_path):
    lines = [
        _event("SparkListenerApplicationStart", **{"App ID": "app-1"}),
        _event("SparkListenerJobStart", **{"Stage IDs": [0, 1],
                                            "Properties": {"featureline.stage": "ingest"}}),
        # A later job lists stage 1 again (skipped, reused): it stays ingest's.
        _event("SparkListenerJobStart", **{"Stage IDs": [1, 2],
                                            "Properties": {"featureline.stage": "features"}}),
        _event("SparkListenerJobStart", **{"Stage IDs": [3], "Properties": {}}),
    ]
    folder = tmp_path / "eventlog_v2_app-1"
    folder.mkdir()
    # Spark 4 compresses event logs with zstd by default.
    (folder / "events_1_app-1.zstd").write_bytes(
        zstandard.ZstdCompressor().compress("\n".join(lines).encode()))
    (folder / "appstatus_app-1").write_text("")
    assert job_stages(tmp_path) == {"app-1": {0: "ingest", 1: "ingest", 2: "features",
                                              3: UNTAGGED}}


def test_the_report_sums_task_time_per_job_stage(tmp_path):
    metrics = tmp_path / "qual_metrics" / "app-1"
    metrics.mkdir(parents=True)
    (tmp_path / "apps_summary.csv").write_text(
        "App Name,App ID,Potential Problems,Unsupported Read File Formats and Types\n"
        'featureline-etl,app-1,"TIMEZONE hour()",""\n')
    (metrics / "stages.csv").write_text(
        "Stage ID,Stage Task Duration,Unsupported Task Duration,Stage Estimated\n"
        "0,1000,250,false\n0,1000,250,false\n1,3000,0,false\n2,500,0,false\n")
    (metrics / "unsupported_operators.csv").write_text(
        "SQL ID,Stage ID,ExecId,Unsupported Type,Unsupported Operator,Details,Stage Duration,"
        "App Duration,Action\n"
        '0,0,1,Expr,"unix_micros","Unsupported",1000,9000,Triage\n'
        '0,0,2,Exec,"Project","Contains unsupported expr",1000,9000,Triage\n'
        '0,1,3,Exec,"AdaptiveSparkPlan","Unsupported",3000,9000,IgnoreNoPerf\n')
    report = summarize(tmp_path, {"app-1": {0: "features", 1: "write_examples"}})
    (app,) = report["applications"]
    assert app["stages"] == {
        "features": {"task_ms": 1000, "unsupported_task_ms": 250, "supported_share": 0.75},
        "write_examples": {"task_ms": 3000, "unsupported_task_ms": 0, "supported_share": 1.0},
        UNTAGGED: {"task_ms": 500, "unsupported_task_ms": 0, "supported_share": 1.0}}
    assert app["supported_share"] == round(1 - 250 / 4500, 4)
    (operator,) = app["unsupported_operators"]  # the Project row is the expression's
    assert operator["operator"] == "unix_micros" and operator["stages"] == ["features"]
    # The line of ours that calls hour() (the timezone-sensitive expression).
    source = (Path(__file__).resolve().parent.parent / "etl/features/cyclic_time.py")
    line = next(n for n, text in enumerate(source.read_text().splitlines(), start=1)
                if "F.hour" in text)
    assert app["potential_problems"][0]["code"] == [f"etl/features/cyclic_time.py:{line}"]


def test_every_stage_of_the_job_runs_on_supported_operators(small_log, tmp_path):
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: the Qualification tool is a Java program")
    done = subprocess.run([str(BIN / "featureline"), "etl", "qualify", "--input",
                           str(small_log), "--refit-vocabularies", "--json"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    if done.returncode != 0 and "cannot fetch" in done.stderr:
        pytest.skip(f"the package registry is not reachable: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    (app,) = json.loads(done.stdout)["applications"]
    assert app["unsupported_operators"] == [], app["unsupported_operators"]
    assert set(app["stages"]) >= set(JOB_STAGES) - {"write_tfrecord"}
    assert all(stage["supported_share"] == 1.0 for stage in app["stages"].values()), app
    assert app["supported_share"] == 1.0


def test_a_registry_failure_is_a_clear_error(tmp_path, monkeypatch):
    from featureline.etl import qualification

    monkeypatch.setenv(qualification.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(qualification, "TOOLS_VERSION", "0.0.0-no-such-version")
    with pytest.raises(QualificationError, match="cannot fetch spark-rapids-user-tools"):
        qualification.tool_classpath()
    assert list(tmp_path.iterdir()) == []  # no half-fetched folder left
