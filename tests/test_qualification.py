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
    QualificationError,
    job_stages,
    stage_times,
    summarize,
)
from featureline.etl.stages import JOB_STAGES, UNTAGGED

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


def _stage_completed(stage: int, name: str, submitted: int | None, completed: int | None,
                     **metrics: int) -> str:
    info = {"Stage ID": stage, "Stage Name": name, "Number of Tasks": 2,
            "Accumulables": [{"Name": f"internal.metrics.{k}", "Value": v}
                             for k, v in metrics.items()]}
    if submitted is not None:
        info |= {"Submission Time": submitted, "Completion Time": completed}
    return _event("SparkListenerStageCompleted", **{"Stage Info": info})


def test_stage_times_lists_spark_stages_slowest_first_with_their_job_stage(tmp_path):
    folder = tmp_path / "eventlog_v2_app-1"
    folder.mkdir()
    first = [
        _event("SparkListenerJobStart", **{"Stage IDs": [0, 1],
                                            "Properties": {"featureline.stage": "ingest"}}),
        _stage_completed(0, "csv at ingest.py:99", 1_000, 3_500, executorRunTime=4_800,
                         jvmGCTime=120, **{"shuffle.write.bytesWritten": 3 * 2**20}),
        _event("SparkListenerJobStart", **{"Stage IDs": [2],
                                            "Properties": {"featureline.stage": "features"}}),
    ]
    # Rolled files are read in the order written (events_10 after events_2): stage 2's job
    # started in the first file and the stage completed in the later one.
    later = [
        _stage_completed(2, "first at model_ready.py:68", 4_000, 14_000,
                         executorRunTime=19_500, memoryBytesSpilled=5 * 2**20),
        _stage_completed(1, "count at job.py:150", None, None),  # skipped: no times
        _event("SparkListenerJobStart", **{"Stage IDs": [3], "Properties": {}}),
        _stage_completed(3, "json at bench.py:1", 14_000, 14_500),
    ]
    (folder / "events_2_app-1").write_text("\n".join(first))
    (folder / "events_10_app-1").write_text("\n".join(later))
    (folder / "appstatus_app-1").write_text("")
    stages = stage_times(tmp_path)
    assert [(s["stage_id"], s["owner"], s["wall_s"]) for s in stages] == [
        (2, "features", 10.0), (0, "ingest", 2.5), (3, UNTAGGED, 0.5)]
    assert stages[0]["task_s"] == 19.5 and stages[0]["spilled_memory_mb"] == 5.0
    assert stages[1]["gc_s"] == 0.12 and stages[1]["shuffle_write_mb"] == 3.0
    assert stages[1]["name"] == "csv at ingest.py:99" and stages[1]["tasks"] == 2
    assert stages[0]["submitted_ms"] == 4_000  # a run's own stages: those submitted in it


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


@pytest.mark.slow
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
    from featureline import tools

    monkeypatch.setenv(tools.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(tools, "TOOLS_VERSION", "0.0.0-no-such-version")
    with pytest.raises(QualificationError, match="cannot fetch spark-rapids-user-tools"):
        tools.qualification_classpath()
    assert list(tmp_path.iterdir()) == []  # no half-fetched folder left
