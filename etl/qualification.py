"""Will the job run on the GPU? NVIDIA's Qualification tool on an event log of our job.

The RAPIDS Accelerator's Qualification tool reads a Spark event log and says which operators
the plugin would run on the GPU — on a machine without one. Its jar comes in the
``spark-rapids-user-tools`` wheel; its Java side needs Spark 3.5 / Scala 2.12 jars, which the
``pyspark`` 3.5 source distribution carries under ``deps/jars/``. Both are fetched with pip on
first use (pinned versions below) into a cache outside the repository and reused.

The report is per stage of our job: each Spark job is tagged with the stage that ran it
(``STAGE_PROPERTY``, set by ``featureline.etl.job.StageTimer``), so every Spark stage the
tool measures is attributed to ingest, features, write_examples, … ; each unsupported operator
comes with the place in our code that produces it (docs/ARCHITECTURE.md, "GPU").

The same tags attribute wall and task time: :func:`stage_times` lists a log's Spark stages,
slowest first, with the stage of our job that ran each (``bench_etl.py --profile``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import shutil
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from featureline.core.errors import FeaturelineError
from featureline.etl.stages import JOB_STAGES, STAGE_PROPERTY, UNTAGGED

TOOLS_VERSION = "26.8.4"  # spark-rapids-user-tools on PyPI (its jar: 26.08.4)
SPARK_JARS_VERSION = "3.5.7"  # pyspark sdist whose deps/jars the tool runs on
MAIN_CLASS = "com.nvidia.spark.rapids.tool.qualification.QualificationMain"
# Where the tool's operator lists come from (its jar's supportedExecs/Exprs.csv).
TOOL_SPARK_VERSION = "3.5"
# Rows of unsupported_operators.csv the tool itself marks as costing nothing, and the rows
# of an operator that is unsupported only for an expression listed on its own row.
_IGNORED_ACTIONS = {"IgnoreNoPerf", "IgnorePerf"}
_COVERED_DETAILS = {"Contains unsupported expr"}
ETL_SOURCES = Path(__file__).resolve().parent
# The modules that name operators without calling them.
_PLAN_CHECKS = {Path(__file__).name, "gpu_plan.py"}
# How an operator the tool names shows up in our code, where the name alone is not a call.
CALLS = {
    "Scan text": r"\.read\.text\(",
    "Scan json": r"\.read\.json\(",
    "Scan csv": r"\.read\.csv\(|\.csv\(",
    "Scan parquet": r"\.read\.parquet\(",
    "BroadcastHashJoin": r"\w\.join\((?:F\.broadcast\(|\w+[,.])",
    "SortMergeJoin": r"\w\.join\((?:F\.broadcast\(|\w+[,.])",
    "Window": r"Window\.",
    "Generate": r"F\.(posexplode|explode)",
    "TIMEZONE hour()": r"F\.hour\b",
    "StructsToJsonEvaluator": r"F\.to_json\(",
}


class QualificationError(FeaturelineError):
    """The Qualification tool could not be fetched or run; the message says which part."""


def run_tool(classpath: str, event_log: Path, work: Path) -> Path:
    """Run the tool (its Java ``classpath``, ``featureline.tools.qualification_classpath``) on
    ``event_log`` (a file or folder); its ``qual_core_output`` folder."""
    java = shutil.which("java")
    if java is None:
        raise QualificationError("java is not on PATH (the tool is a Java program)")
    done = subprocess.run([java, "-cp", classpath, MAIN_CLASS, "--platform", "onprem",
                           "-o", str(work), str(event_log)],
                          capture_output=True, text=True, check=False)
    output = work / "qual_core_output"
    if done.returncode != 0 or not (output / "apps_summary.csv").is_file():
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise QualificationError(f"the Qualification tool failed on {event_log}: {tail}")
    return output


def _event_files(event_log: Path) -> list[Path]:
    if event_log.is_file():
        return [event_log]
    return sorted(p for p in event_log.rglob("*") if p.is_file() and not p.name.startswith("."))


def _lines(path: Path) -> Iterator[str]:
    """The JSON lines of an event log file, plain or compressed with Spark's default zstd."""
    if path.suffix == ".zstd":
        import zstandard

        with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as data:
            yield from io.TextIOWrapper(data, errors="replace")
    elif path.suffix in (".lz4", ".snappy", ".lzf"):
        raise QualificationError(f"{path}: event logs compressed with {path.suffix[1:]} "
                                 "are not read here; use zstd (Spark's default) or none")
    else:
        with path.open(errors="replace") as lines:
            yield from lines


def _events(event_log: Path, kinds: tuple[str, ...]
            ) -> Iterator[tuple[Path, str | None, dict[str, Any]]]:
    """The log's events of ``kinds`` in the order written, each with its application's log
    (one file, or one folder of rolled files: Spark 4's v2 logs) and its App ID once the
    application's start event has been read (None before)."""
    app_ids: dict[Path, str | None] = {}
    for path in sorted(_event_files(event_log), key=_rolling_order):
        if path.name.startswith("appstatus_"):
            continue
        log = path.parent if path.parent.name.startswith("eventlog_v2_") else path
        with contextlib.closing(_lines(path)) as lines:  # type: ignore[type-var]
            for line in lines:
                if '"SparkListenerApplicationStart"' in line:
                    app_ids[log] = json.loads(line).get("App ID")
                elif any(f'"{kind}"' in line for kind in kinds):
                    yield log, app_ids.get(log), json.loads(line)


def _owners(event: dict[str, Any], property_name: str = STAGE_PROPERTY) -> Iterator[
        tuple[int, str]]:
    """(Spark stage id, the stage of our job) for each Spark stage of a job-start event."""
    owner = (event.get("Properties") or {}).get(property_name) or UNTAGGED
    return ((int(stage), owner) for stage in event.get("Stage IDs", []))


def job_stages(event_log: Path) -> dict[str, dict[int, str]]:
    """Per application, Spark stage id → the stage of our job whose Spark job ran it first."""
    stages: dict[str, dict[int, str]] = defaultdict(dict)
    for _, app, event in _events(event_log, ("SparkListenerJobStart",)):
        if app is not None:
            for stage, owner in _owners(event):
                stages[app].setdefault(stage, owner)
    return dict(stages)


# Task metrics of a completed Spark stage, as its event names them → stage_times' keys.
_STAGE_METRICS = {"internal.metrics.executorRunTime": "task_s",
                  "internal.metrics.jvmGCTime": "gc_s",
                  "internal.metrics.shuffle.write.bytesWritten": "shuffle_write_mb",
                  "internal.metrics.memoryBytesSpilled": "spilled_memory_mb",
                  "internal.metrics.diskBytesSpilled": "spilled_disk_mb"}


def stage_times(event_log: Path, property_name: str = STAGE_PROPERTY) -> list[dict[str, Any]]:
    """Every completed Spark stage of the log, slowest first: the value of ``property_name``
    its first job was submitted with (by default the stage of our job), its name (the call
    that ran it), wall and task seconds, GC seconds, shuffle written and spilled megabytes.
    Where a run's time went, Spark stage by Spark stage (``bench_etl.py --profile``)."""
    owners: dict[tuple[Path, int], str] = {}
    stages = []
    for log, _, event in _events(event_log, ("SparkListenerJobStart",
                                             "SparkListenerStageCompleted")):
        if event["Event"] == "SparkListenerJobStart":
            for stage, owner in _owners(event, property_name):
                owners.setdefault((log, stage), owner)
            continue
        info = event["Stage Info"]
        if "Submission Time" not in info or "Completion Time" not in info:
            continue  # skipped: its output was reused
        metrics = {a["Name"]: a.get("Value") for a in info.get("Accumulables", [])}
        entry = {"owner": owners.get((log, int(info["Stage ID"])), UNTAGGED),
                 "stage_id": info["Stage ID"], "name": info["Stage Name"],
                 "tasks": info["Number of Tasks"], "submitted_ms": info["Submission Time"],
                 "wall_s": (info["Completion Time"] - info["Submission Time"]) / 1e3}
        for metric, key in _STAGE_METRICS.items():
            value = int(metrics.get(metric) or 0)
            entry[key] = round(value / 1e3, 3) if key.endswith("_s") else round(value / 2**20, 1)
        stages.append(entry)
    return sorted(stages, key=lambda s: -s["wall_s"])


def _rolling_order(path: Path) -> tuple[str, int, str]:
    """Rolled files of a v2 log in the order written (``events_2_…`` before ``events_10_…``)."""
    match = re.match(r"events_(\d+)_", path.name)
    return str(path.parent), int(match.group(1)) if match else 0, path.name


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def place_in_code(operator: str, calls: dict[str, str] = CALLS) -> list[str]:
    """``file:line`` of the calls in ``etl/`` that produce ``operator`` (``calls``: how an
    operator shows up in our code, where its name alone is not a call)."""
    pattern = re.compile(calls.get(operator) or rf"\b{re.escape(operator)}\b")
    places = []
    for path in sorted(ETL_SOURCES.rglob("*.py")):
        if path.name in _PLAN_CHECKS:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if pattern.search(line) and not line.lstrip().startswith("#"):
                places.append(f"etl/{path.relative_to(ETL_SOURCES)}:{number}")
    return places


def summarize(output: Path, stages: dict[str, dict[int, str]]) -> dict[str, Any]:
    """The tool's verdict per application and per stage of our job."""
    applications = []
    for summary in _rows(output / "apps_summary.csv"):
        app = summary["App ID"]
        metrics = output / "qual_metrics" / app
        ours = stages.get(app, {})
        task_ms: dict[str, int] = defaultdict(int)
        unsupported_ms: dict[str, int] = defaultdict(int)
        measured: dict[int, tuple[int, int]] = {}
        for row in _rows(metrics / "stages.csv"):  # a stage may be listed more than once
            stage = int(row["Stage ID"])
            entry = (int(row["Stage Task Duration"]), int(row["Unsupported Task Duration"]))
            measured[stage] = max(measured.get(stage, entry), entry)
        for stage, (total, unsupported) in measured.items():
            name = ours.get(stage, UNTAGGED)
            task_ms[name] += total
            unsupported_ms[name] += unsupported
        operators: dict[tuple[str, str, str], set[str]] = defaultdict(set)
        for row in _rows(metrics / "unsupported_operators.csv"):
            if row["Action"] in _IGNORED_ACTIONS or row["Details"] in _COVERED_DETAILS:
                continue
            key = (row["Unsupported Type"], row["Unsupported Operator"], row["Details"])
            operators[key].add(ours.get(int(row["Stage ID"]), UNTAGGED))
        by_stage = {name: {"task_ms": task_ms[name], "unsupported_task_ms": unsupported_ms[name],
                           "supported_share": _share(task_ms[name], unsupported_ms[name])}
                    for name in sorted(task_ms, key=_stage_order)}
        total, unsupported = sum(task_ms.values()), sum(unsupported_ms.values())
        applications.append({
            "app_id": app, "app_name": summary["App Name"],
            "supported_share": _share(total, unsupported),
            "task_ms": total, "unsupported_task_ms": unsupported,
            "stages": by_stage,
            "unsupported_operators": [
                {"type": kind, "operator": operator, "details": details,
                 "stages": sorted(where, key=_stage_order), "code": place_in_code(operator)}
                for (kind, operator, details), where in sorted(operators.items())],
            "unsupported_formats": summary.get("Unsupported Read File Formats and Types", ""),
            "potential_problems": [{"problem": problem, "code": place_in_code(problem)}
                                   for problem in filter(None, summary.get(
                                       "Potential Problems", "").split(":"))],
        })
    return {"tool": {"package": f"spark-rapids-user-tools=={TOOLS_VERSION}",
                     "operator_lists_for_spark": TOOL_SPARK_VERSION,
                     "spark_jars": f"pyspark=={SPARK_JARS_VERSION}"},
            "applications": applications}


def _stage_order(name: str) -> int:
    return JOB_STAGES.index(name) if name in JOB_STAGES else len(JOB_STAGES)


def _share(total: int, unsupported: int) -> float:
    return round(1 - unsupported / total, 4) if total else 1.0


def qualify(classpath: str, event_log: Path) -> dict[str, Any]:
    """Run the tool on an event log and attribute its verdict to the stages of our job."""
    with tempfile.TemporaryDirectory(prefix="featureline-qualify-") as work:
        output = run_tool(classpath, event_log, Path(work))
        return summarize(output, job_stages(event_log))


def render(report: dict[str, Any]) -> str:
    """The report as lines for a terminal."""
    tool = report["tool"]
    lines = [f"Qualification tool {tool['package']} (operator lists of Spark "
             f"{tool['operator_lists_for_spark']})"]
    for app in report["applications"]:
        lines.append(f"{app['app_name']} {app['app_id']}: {app['supported_share']:.1%} of "
                     f"task time on supported operators ({app['task_ms']:,} ms of tasks)")
        for name, stage in app["stages"].items():
            lines.append(f"  {name:<15} {stage['supported_share']:7.1%}  "
                         f"({stage['task_ms']:,} ms, {stage['unsupported_task_ms']:,} ms "
                         "unsupported)")
        for operator in app["unsupported_operators"]:
            lines.append(f"  unsupported {operator['type']} {operator['operator']} "
                         f"({operator['details']}) in {', '.join(operator['stages'])}: "
                         f"{', '.join(operator['code']) or 'no call of ours found'}")
        for problem in app["potential_problems"]:
            lines.append(f"  potential problem {problem['problem']}: "
                         f"{', '.join(problem['code']) or 'no call of ours found'}")
    return "\n".join(lines)
