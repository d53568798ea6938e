"""The GPU plan, checked by the RAPIDS Accelerator itself: the real plugin jar (fetched with
Maven on first use) plans the job in explain-only mode on this CPU, and no operator or
expression of any stage is off the GPU. The test skips only where Java, Maven or Maven
Central is not there. Also: the plugin's plan log is read per stage, and every file that
names the plugin's release agrees with the pin."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from featureline import tools
from featureline.etl import gpu_plan, rapids
from featureline.etl.errors import GpuPlanError, PluginFetchError
from featureline.etl.session import read_properties, spark_conf_dir
from featureline.etl.stages import JOB_STAGES

REPO = Path(__file__).resolve().parent.parent

# As the plugin logs it (26.08.1, explain-only), shortened; our stage markers between plans.
PLAN_LOG = """\
@@featureline featureline.stage ingest
{plan}
*Exec <ProjectExec> will run on GPU
  *Expression <Alias> _verdict#49.reason AS reason#50 will run on GPU
  ^Expression <JsonToStructs> from_json(StructField(user_id,StringType,true)) will run on \
GPU via CPU bridge because JsonToStructs does not support Corrupt Record
  *Exec <FileSourceScanExec> will run on GPU
*Exec <ObjectHashAggregateExec> will run on GPU. The data type of following expressions will \
be converted in GPU runtime: buf: Converted BinaryType to ArrayType(IntegerType,false)

@@featureline featureline.stage features
{plan}
!Exec <WindowExec> cannot run on GPU because not all expressions can be replaced
  @Expression <WindowExpression> max(_w0#12) windowspecdefinition(user_id#1) could run on GPU
    !Expression <Max> max(_w0#12) cannot run on GPU because expression Max max(_w0#12) \
produces an unsupported type StructType
  *Partitioning <HashPartitioning> will run on GPU
  *Exec <SortExec> will run on GPU
  #Exec <SortExec> could run on GPU but is going to be removed because replacing \
sortMergeJoin with shuffleHashJoin
{plan}
!Exec <WindowExec> cannot run on GPU because not all expressions can be replaced
  !Expression <Max> max(_w0#97) cannot run on GPU because expression Max max(_w0#97) \
produces an unsupported type StructType
{stage_ends}
@@featureline featureline.stage write_tfrecord
{stage_ends}
""".format(plan="@@featureline com.nvidia.spark.rapids.GpuOverrides ",  # the message's "\n…"
           stage_ends="@@featureline featureline.stage ")


def test_the_plan_log_is_read_per_stage_with_every_node_off_the_gpu(tmp_path):
    log = tmp_path / "plan.log"
    log.write_text(PLAN_LOG)
    report = gpu_plan.report(log, "jsonl")
    assert report["stages"] == {
        "ingest": {"plans": 1, "operators": 3, "on_gpu": 3, "off_gpu": 0,
                   "expressions_off_gpu": 1},
        "features": {"plans": 2, "operators": 4, "on_gpu": 2, "off_gpu": 2,
                     "expressions_off_gpu": 2},
        "write_tfrecord": {"plans": 0, "note": gpu_plan.NO_PLAN_NOTES["write_tfrecord"]},
    }
    off = [(e["stage"], e["kind"], e["name"], e["count"], e["reason"])
           for e in report["off_gpu"]]
    # The CPU bridge runs the expression on the CPU: it counts as off the GPU; a note after
    # "will run on GPU." (a buffer's type converted on the GPU) does not. Expression
    # ids are left out, so one node planned twice is one entry seen twice.
    assert off == [
        ("ingest", "Expression", "JsonToStructs", 1, "JsonToStructs does not support Corrupt "
                                                     "Record"),
        ("features", "Exec", "WindowExec", 2, "not all expressions can be replaced"),
        ("features", "Expression", "Max", 2, "expression Max max(_w0) produces an unsupported "
                                             "type StructType"),
    ]
    # Each entry names the lines of ours that produce it.
    window = report["off_gpu"][1]["code"]
    assert "etl/features/lag_features.py" in " ".join(window)
    assert all(re.fullmatch(r"etl/[\w/]+\.py:\d+", place) for place in window)
    text = gpu_plan.render(report)
    assert "off GPU in features: Exec WindowExec x2" in text
    assert "write_tfrecord" in text and "no SQL plan" in text


def test_a_log_without_plans_is_a_clear_error(tmp_path):
    log = tmp_path / "plan.log"
    log.write_text("@@featureline featureline.stage ingest\n")
    with pytest.raises(GpuPlanError, match="holds no plan"):
        gpu_plan.report(log, "jsonl")
    with pytest.raises(GpuPlanError, match="no plan log"):
        gpu_plan.report(tmp_path / "absent.log", "jsonl")


def test_every_file_that_names_the_plugin_follows_the_pin():
    jar = rapids.JAR_NAME
    assert jar == f"rapids-4-spark_2.13-{rapids.RAPIDS_VERSION}-{rapids.CUDA_CLASSIFIER}.jar"
    dockerfile = (REPO / "docker" / "etl.Dockerfile").read_text()
    assert f"ARG RAPIDS_VERSION={rapids.RAPIDS_VERSION}\n" in dockerfile
    assert f"ARG RAPIDS_CLASSIFIER={rapids.CUDA_CLASSIFIER}\n" in dockerfile
    k8s_gpu = read_properties(spark_conf_dir() / "k8s-gpu.conf")
    assert k8s_gpu["spark.jars"] == f"local://{rapids.IMAGE_JAR}"
    (overlay,) = yaml.safe_load_all((REPO / "k8s/overlays/gpu/sparkapplication-gpu.yaml")
                                    .read_text())
    assert overlay["spec"]["deps"]["jars"] == [f"local://{rapids.IMAGE_JAR}"]
    # The overlay's plugin settings are the profile's (the plan gpu-check proved).
    for key, value in overlay["spec"]["sparkConf"].items():
        if key.startswith("spark.rapids.") or key == "spark.sql.cache.serializer":
            assert k8s_gpu[key] == value, key
    local_gpu = read_properties(spark_conf_dir() / "gpu.conf")
    for key in ("spark.sql.cache.serializer", "spark.rapids.sql.castStringToTimestamp.enabled",
                "spark.rapids.sql.castStringToFloat.enabled",
                "spark.rapids.sql.expression.CollectList"):
        assert local_gpu[key] == k8s_gpu[key], key
    assert jar in (spark_conf_dir() / "gpu.conf").read_text()
    guide = (REPO / "docs" / "gpu.md").read_text()
    assert jar in guide and rapids.MAVEN_PACKAGE in guide
    # Every release named anywhere is the pinned one.
    for path in [REPO / "README.md", *(REPO / "docs").glob("*.md"),
                 REPO / "pyproject.toml", *spark_conf_dir().glob("*.conf")]:
        named = set(re.findall(r"rapids-4-spark_2\.13[-:](\d+\.\d+\.\d+)", path.read_text()))
        assert named <= {rapids.RAPIDS_VERSION}, (path, named)
    # pyspark stays on a Spark version the release supports (4.1.1–4.1.3).
    import pyspark

    assert re.fullmatch(r"4\.1\.[1-3]", pyspark.__version__), pyspark.__version__


def test_a_maven_failure_is_a_clear_error(tmp_path, monkeypatch):
    if shutil.which("mvn") is None:
        pytest.skip("no mvn on PATH")
    monkeypatch.setenv("FEATURELINE_CACHE", str(tmp_path))
    monkeypatch.setattr(tools, "MAVEN_ARTIFACT", "com.nvidia:no-such-artifact_2.13:0.0.0")
    monkeypatch.setattr(tools, "RAPIDS_VERSION", "0.0.0")
    with pytest.raises(PluginFetchError, match=r"cannot fetch com\.nvidia:no-such-artifact"):
        tools.plugin_jar()
    assert list(tmp_path.iterdir()) == []  # no half-fetched folder left


GPU_AGGREGATIONS = """
aggregations:
  - name: user_activity
    keys: [user_id]
    features:
      - {op: count, windows: [1h, 1d, 7d]}
      - {op: count, name: purchases, filter: "event_type in (purchase)", windows: [1d]}
      - {op: sum, column: value, windows: [7d, all]}
      - {op: mean, column: price, windows: [1d]}
      - {op: variance, column: price, windows: [1d]}
      - {op: min, column: price, windows: [1d]}
      - {op: max, column: value, windows: [10m], hop: 1m}
      - {op: approx_distinct, column: category, windows: [7d]}
      - {op: last, column: category, windows: [1d]}
      - {op: first, column: category, windows: [1d]}
      - {op: approx_percentile, column: price, edges: [5, 20, 100], q: 0.5, windows: [7d]}
      - {op: last_k, column: item_id, k: 3}
      - {op: last_k, column: item_id, k: 2, windows: [1d]}
      - {op: latest, windows: [7d]}
  - name: item_category
    keys: [item_id, category]
    features:
      - {op: count, windows: [30d]}
      - {op: approx_distinct, column: user_id}
# Every function of a derived feature's expression.
derive:
  - name: purchase_share
    expr: "ratio(user_activity:purchases_1d, user_activity:count_1d, prior=0.1, weight=5)"
  - name: shaped
    expr: "clip(log1p(price) - coalesce(user_activity:price_mean_1d, 0), -3, 3) * 2
           / (1 + bucketize(user_activity:count_7d, [1, 10, 100])) - -purchase_share"
  - {name: quiet_for, expr: "seconds_since(user_activity:latest_7d) / 3600"}
etl:
  fit:
    refit_every: 30d  # the last day's incremental run transforms with the kept fit
  spark:
    properties:
      # The plan's operators are the same at any number of partitions; the check runs its
      # queries on the CPU, where 16 partitions of a few rows are 16 tasks each.
      spark.sql.shuffle.partitions: "2"
"""


@pytest.fixture(scope="module")
def gpu_plan_log(tmp_path_factory) -> Path:
    """Four days of a few events each, bad lines among them: the plan is the job's whatever
    the rows, and the plugin's checks run its queries on the CPU."""
    from featureline.etl.datagen import write_log

    log = tmp_path_factory.mktemp("gpu-plan") / "events.jsonl"
    write_log(log, events=1200, users=80, items=60, days=4, seed=11, bad_fraction=0.02)
    return log


@pytest.fixture(scope="module")
def gpu_plan_bench(gpu_plan_log):
    """benchmarks/bench_gpu_plan.py once, on a small log with every operation of the
    aggregations' backfill (last_k over the lifetime and over a window), the full runs
    over every day but the last and a check of the last day's incremental run on the checked
    output: its timings for the benchmark's smoke test, its checks' own reports for the plan
    tests — one plugin run of each mode serves both (they are the suite's costliest JVMs)."""
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: Spark and the plugin are Java programs")
    try:
        tools.plugin_jar()
    except PluginFetchError as error:
        pytest.skip(f"the plugin jar cannot be fetched here: {error}")
    from tests.test_benchmarks import _load

    # The checks alone: their cpu baseline and its ratio are the benchmark's, not the suite's.
    return _load("bench_gpu_plan").run(0, pairs=1, log=gpu_plan_log, config=GPU_AGGREGATIONS,
                                       incremental=True, baseline=False)


@pytest.mark.slow
def test_every_stage_of_the_job_is_planned_on_the_gpu_by_the_plugin(gpu_plan_bench):
    report = gpu_plan_bench["check_report"]
    assert report["off_gpu"] == [], json.dumps(report["off_gpu"], indent=1)[:3000]
    assert gpu_plan_bench["check_exit"] == 0, gpu_plan_bench["check_stderr_tail"]
    planned = {name for name, stage in report["stages"].items() if stage["plans"]}
    assert planned == set(JOB_STAGES) - {"write_tfrecord"}
    for name in planned:
        stage = report["stages"][name]
        assert stage["operators"] == stage["on_gpu"] > 0, (name, stage)
        assert stage["off_gpu"] == stage["expressions_off_gpu"] == 0, (name, stage)
    assert report["stages"]["write_tfrecord"]["plans"] == 0


@pytest.mark.slow
def test_the_incremental_run_of_a_day_is_planned_on_the_gpu_by_the_plugin(gpu_plan_bench):
    """The daily run reads the stored history its windows need (reach, users_events, cuts)
    with plans of its own: every operator of them on the GPU too."""
    report = gpu_plan_bench["incremental_report"]
    assert report["off_gpu"] == [], json.dumps(report["off_gpu"], indent=1)[:3000]
    assert gpu_plan_bench["incremental_exit"] == 0, gpu_plan_bench["incremental_stderr_tail"]
    stages = report["stages"]
    planned = {name for name, stage in stages.items() if stage["plans"]}
    assert planned == set(JOB_STAGES) - {"write_tfrecord"}
    assert all(stages[name]["operators"] == stages[name]["on_gpu"] > 0 for name in planned)
    # The day's features read the stored events: more plans than the day's own.
    assert stages["features"]["plans"] > gpu_plan_bench["check_report"]["stages"][
        "features"]["plans"]


@pytest.mark.slow
def test_bench_gpu_plan_smoke(gpu_plan_bench):
    (check,) = gpu_plan_bench["gpu_check_s"]
    assert check > 0 and gpu_plan_bench["gpu_check_incremental_s"] > 0
    # Run without its cpu baseline: no cpu time, and no ratio made up.
    assert gpu_plan_bench["etl_run_cpu_s"] == []
    assert gpu_plan_bench["ratio_vs_etl_run_median"] is None
    json.dumps(gpu_plan_bench)
