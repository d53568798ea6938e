"""Will every stage run on the GPU? The RAPIDS Accelerator's own planner, in explain-only mode.

With ``spark.rapids.sql.mode=explainOnly`` the plugin loads on a machine without a GPU, plans
every query as it would on one and logs, node by node, what would run on the GPU and why
not; the queries themselves run on the CPU. :func:`explain_properties` gives the job those
settings on top of the gpu profile's own (no GPU requested) and routes the plugin's plan log
and our stage markers (``StageTimer`` logs each stage's name to ``STAGE_LOGGER``) into one
file; :func:`read_plan_log` reads it back per stage of the job: plan nodes planned, on the
GPU, and every one off it with the plugin's reason and the line of ours that produces it.

Adaptive query execution is off in this run: explain-only mode cannot look across adaptive
query stages (it reports each broadcast join under AQE as "explain only mode with AQE, we
cannot determine if the broadcast for this join is on the GPU too", and each shuffle whose
child stage it did not convert as not columnar), so each query is planned whole. On a GPU
the profiles keep AQE on (docs/ARCHITECTURE.md, "GPU").
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from featureline.etl import qualification
from featureline.etl.errors import GpuPlanError
from featureline.etl.rapids import CUDA_CLASSIFIER, RAPIDS_VERSION
from featureline.etl.stages import JOB_STAGES, STAGE_LOGGER, UNTAGGED

PLAN_LOGGER = "com.nvidia.spark.rapids.GpuOverrides"
_EVENT = "@@featureline "
# Spark's own console layout for everything else; the plan log and the stage markers go to
# the file only (thousands of lines per run).
_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
appender.plan.type = File
appender.plan.name = plan
appender.plan.fileName = {path}
appender.plan.append = false
appender.plan.layout.type = PatternLayout
appender.plan.layout.pattern = @@featureline %c %m%n
logger.plan.name = {plan_logger}
logger.plan.level = warn
logger.plan.additivity = false
logger.plan.appenderRef.plan.ref = plan
logger.stage.name = {stage_logger}
logger.stage.level = info
logger.stage.additivity = false
logger.stage.appenderRef.plan.ref = plan
"""
# One node of a logged plan: "*Exec <ProjectExec> will run on GPU", "!Expression <Max>
# max(x#1) cannot run on GPU because …", "^Expression <…> … will run on GPU via CPU bridge
# because …" (evaluated on the CPU inside a GPU plan), "! <X> cannot run …" (no GPU version).
_NODE = re.compile(r"^\s*(?P<mark>[*@!^#])(?P<kind>\w*) <(?P<name>[^>]+)> (?P<text>.*)$")
_OFF = re.compile(r"^(?:(?P<node>.*?) )?(?:cannot run on GPU|will run on GPU via CPU bridge) "
                  r"because (?P<reason>.*)$")
# A node the plugin drops from its plan ("#… could run on GPU but is going to be removed
# because replacing sortMergeJoin with shuffleHashJoin": its GPU join needs no sort) runs
# nowhere: it counts as planned on the GPU.
# "will run on GPU. The data type of following expressions will be converted in GPU
# runtime: …" (collect_list's buffer, say) is on the GPU too.
_ON = re.compile(r"^(?:(?P<node>.*?) )?(?:will|could) run on GPU"
                 r"(?: but is going to be removed because .*|\. .*)?$")
_OPERATOR_KINDS = {"Exec", "Output", ""}
_EXPRESSION_IDS = re.compile(r"#\d+L?\b")
# How a node the plugin names shows up in our code, where its name alone is not a call,
# beyond the operators the Qualification tool names (qualification.CALLS: an operator's name
# less "Exec", WindowExec → Window).
CALLS = {
    "SpecifiedWindowFrame": r"\.(?:rangeBetween|rowsBetween)\(",
    "JsonToStructs": r"F\.from_json\(",
    "CsvToStructs": r"F\.from_csv\(",
    "StructsToJson": qualification.CALLS["StructsToJsonEvaluator"],
    "FileSourceScanExec": r"\.read\b.*\.(?:csv|parquet|json|text)\(|\.(?:csv|parquet)\(",
    "InMemoryTableScanExec": r"\.(?:cache|persist)\(",
}
# Stages that run Spark jobs without a SQL plan, and what they run instead.
NO_PLAN_NOTES = {
    "write_tfrecord": "Python tasks encode the Parquet examples read with pyarrow (CPU)",
}


def explain_properties(plan_log: Path, work: Path) -> dict[str, str]:
    """Spark properties that turn a gpu-profile run into an explain-only one whose plan log
    and stage markers go to ``plan_log`` (``work`` holds the logging configuration)."""
    config = work / "log4j2-gpu-plan.properties"
    config.write_text(_LOG4J.format(path=plan_log.resolve(), plan_logger=PLAN_LOGGER,
                                    stage_logger=STAGE_LOGGER))
    return {
        "spark.rapids.sql.mode": "explainOnly",
        "spark.rapids.sql.explain": "ALL",
        "spark.executor.resource.gpu.amount": "0",
        "spark.task.resource.gpu.amount": "0",
        "spark.sql.adaptive.enabled": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={config.resolve().as_uri()}",
    }


@dataclass(frozen=True)
class Node:
    stage: str
    kind: str  # Exec, Expression, Partitioning, Output, or "" (an operator with no GPU version)
    name: str
    description: str  # the node as the plugin prints it, without expression ids
    reason: str | None  # None: planned on the GPU

    @property
    def is_operator(self) -> bool:
        return self.kind in _OPERATOR_KINDS


def _node(stage: str, line: str) -> Node | None:
    match = _NODE.match(line)
    if match is None:
        return None
    text = _EXPRESSION_IDS.sub("", match["text"])
    off = _OFF.match(text)
    if off is not None:
        # "! <X> … does not currently support the operator class …": its class says its kind.
        kind = match["kind"] or ("Expression" if ".expressions." in off["reason"] else "")
        return Node(stage, kind, match["name"], off["node"] or "", off["reason"])
    on = _ON.match(text)
    if on is not None:
        return Node(stage, match["kind"], match["name"], on["node"] or "", None)
    return Node(stage, match["kind"], match["name"], text, text)  # a verdict we do not know


def read_plan_log(path: Path) -> tuple[list[str], dict[str, int], list[Node]]:
    """The stages in the order they started, the plans logged per stage, and every node."""
    if not path.is_file():
        raise GpuPlanError(f"no plan log at {path}: the plugin did not load")
    stage, stages = UNTAGGED, []
    plans: Counter[str] = Counter()
    nodes: list[Node] = []
    with path.open(errors="replace") as lines:
        for line in lines:
            if line.startswith(_EVENT):
                logger, _, message = line[len(_EVENT):].rstrip("\n").partition(" ")
                if logger == STAGE_LOGGER:
                    stage = message or UNTAGGED
                    if message and message not in stages:
                        stages.append(message)
                elif logger == PLAN_LOGGER:
                    plans[stage] += 1
                continue
            node = _node(stage, line)
            if node is not None:
                nodes.append(node)
    if not plans:
        raise GpuPlanError(f"{path} holds no plan: was the job run with the plugin loaded "
                           "(spark.plugins) in explain-only mode?")
    return stages, dict(plans), nodes


def _place(name: str, kind: str, node: str) -> list[str]:
    evaluator = re.match(r"invoke\((\w+)Evaluator\(", node)
    if name == "Invoke" and evaluator:  # Spark 4 plans to_json as invoke(StructsToJsonEvaluator…)
        name = evaluator.group(1)
    if name in CALLS:
        return qualification.place_in_code(name, CALLS)
    if name.removesuffix("Exec") in qualification.CALLS:
        return qualification.place_in_code(name.removesuffix("Exec"))
    if kind == "Expression":  # Spark SQL's class name → its functions' name: StddevPop
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        return qualification.place_in_code(name, {name: rf"F\.{snake}\("})
    return []


def report(plan_log: Path, input_format: str) -> dict[str, Any]:
    """Per stage: plans, operators planned, on the GPU and off it; every node off the GPU
    (operators and expressions) with the plugin's reason, how often, and our calls."""
    stages, plans, nodes = read_plan_log(plan_log)
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    off: Counter[tuple[str, str, str, str, str]] = Counter()
    for node in nodes:
        if node.is_operator:
            counts[node.stage]["operators"] += 1
            counts[node.stage]["on_gpu" if node.reason is None else "off_gpu"] += 1
        elif node.reason is not None:
            counts[node.stage]["expressions_off_gpu"] += 1
        if node.reason is not None:
            off[(node.stage, node.kind, node.name, node.description, node.reason)] += 1
    # The job's stages in its order, then any other (UNTAGGED work).
    order = list(dict.fromkeys([*(s for s in JOB_STAGES if s in stages or s in plans),
                                *stages, *plans]))
    by_stage = {}
    for stage in order:
        if stage not in plans:
            by_stage[stage] = {"plans": 0, "note": NO_PLAN_NOTES.get(stage, "no SQL plan")}
            continue
        by_stage[stage] = {"plans": plans[stage],
                           **{key: counts[stage][key] for key in
                              ("operators", "on_gpu", "off_gpu", "expressions_off_gpu")}}
    return {
        "plugin": {"version": RAPIDS_VERSION, "classifier": CUDA_CLASSIFIER,
                   "mode": "explainOnly", "adaptive_query_execution": False},
        "input_format": input_format,
        "stages": by_stage,
        "off_gpu": [{"stage": stage, "kind": kind or "Exec", "name": name, "node": node,
                     "reason": reason, "count": count, "code": _place(name, kind, node)}
                    for (stage, kind, name, node, reason), count in sorted(
                        off.items(), key=lambda item: (order.index(item[0][0]), item[0]))],
    }


def render(report: dict[str, Any]) -> str:
    """The report as lines for a terminal."""
    plugin = report["plugin"]
    lines = [f"RAPIDS Accelerator {plugin['version']} ({plugin['classifier']}), explain-only "
             f"plan of the job on {report['input_format']} input",
             f"  {'stage':<16}{'plans':>6}{'operators':>11}{'on GPU':>8}{'off GPU':>9}"
             f"{'expressions off':>17}"]
    for name, stage in report["stages"].items():
        if stage["plans"] == 0:
            lines.append(f"  {name:<16}{0:>6}  no SQL plan: {stage['note']}")
            continue
        lines.append(f"  {name:<16}{stage['plans']:>6}{stage['operators']:>11}"
                     f"{stage['on_gpu']:>8}{stage['off_gpu']:>9}"
                     f"{stage['expressions_off_gpu']:>17}")
    for entry in report["off_gpu"]:
        node = entry["node"] if len(entry["node"]) <= 120 else entry["node"][:117] + "..."
        lines.append(f"  off GPU in {entry['stage']}: {entry['kind']} {entry['name']} "
                     f"x{entry['count']}: {entry['reason']}")
        lines.append(f"    {node}")
        lines.append(f"    at {', '.join(entry['code']) or 'no call of ours found'}")
    if not report["off_gpu"]:
        lines.append("every operator and expression of every stage is planned on the GPU")
    return "\n".join(lines)
