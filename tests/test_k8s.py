"""The Kubernetes manifests and images: every manifest validates against the Kubernetes
schemas (strict), the SparkApplication against the fields of its CRD, the overlays render,
and every Spark property, config key, file and environment variable they name exists.
Nothing here talks to a cluster (none can run in the test environment)."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from featureline.config import load_config
from featureline.core.redis import REDIS_URL_ENV
from featureline.etl.incremental import dated
from featureline.etl.session import read_properties, spark_conf_dir
from featureline.feature_store.feature_log import REPORT_METRICS
from featureline.feature_store.repo import CONNECTION_ENV
from featureline.hps.config import load_hps_config
from featureline.hps.volatile import HPS_REDIS_URL_ENV
from featureline.serving import CONFIG_ENV, OUTPUT_ENV

REPO = Path(__file__).resolve().parent.parent
K8S = REPO / "k8s"
KUBERNETES_VERSION = "1.33.0"
CONFIG_FILES = {"featureline.yaml", "hps.yaml"}
OVERLAYS = ("cpu", "gpu")

# The v1beta2 SparkApplication fields these manifests may use, with their types, as the
# kubeflow spark-operator CRD (sparkoperator.k8s.io_sparkapplications.yaml) defines them.
# additionalProperties: false — a misspelt or invented field fails.
_POD = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "cores": {"type": "integer", "minimum": 1}, "coreLimit": {"type": "string"},
        "coreRequest": {"type": "string"}, "memory": {"type": "string"},
        "memoryOverhead": {"type": "string"}, "image": {"type": "string"},
        "instances": {"type": "integer", "minimum": 1}, "serviceAccount": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "env": {"type": "array"}, "envFrom": {"type": "array"},
        "volumeMounts": {"type": "array", "items": {
            "type": "object", "required": ["name", "mountPath"]}},
        "tolerations": {"type": "array"}, "nodeSelector": {"type": "object"},
        "affinity": {"type": "object"}, "securityContext": {"type": "object"},
        "podSecurityContext": {"type": "object"}, "javaOptions": {"type": "string"},
        "deleteOnTermination": {"type": "boolean"},
        "gpu": {"type": "object", "additionalProperties": False,
                "required": ["name", "quantity"],
                "properties": {"name": {"type": "string"}, "quantity": {"type": "integer"}}},
    },
}
SPARK_APPLICATION_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "sparkoperator.k8s.io/v1beta2"},
        "kind": {"const": "SparkApplication"},
        "spec": {
            "type": "object", "additionalProperties": False,
            "required": ["type", "mode", "sparkVersion", "mainApplicationFile", "driver",
                         "executor"],
            "properties": {
                "type": {"enum": ["Java", "Scala", "Python", "R"]},
                "pythonVersion": {"enum": ["2", "3"]},
                "mode": {"enum": ["cluster", "client"]},
                "image": {"type": "string"}, "imagePullPolicy": {"type": "string"},
                "sparkVersion": {"type": "string"}, "mainApplicationFile": {"type": "string"},
                "mainClass": {"type": "string"},
                "arguments": {"type": "array", "items": {"type": "string"}},
                "sparkConf": {"type": "object", "additionalProperties": {"type": "string"}},
                "hadoopConf": {"type": "object", "additionalProperties": {"type": "string"}},
                "volumes": {"type": "array"}, "timeToLiveSeconds": {"type": "integer"},
                "deps": {"type": "object", "additionalProperties": False, "properties": {
                    k: {"type": "array", "items": {"type": "string"}}
                    for k in ("jars", "files", "pyFiles", "packages", "repositories",
                              "archives", "excludePackages")}},
                "restartPolicy": {"type": "object", "additionalProperties": False,
                                  "properties": {
                                      "type": {"enum": ["Never", "Always", "OnFailure"]},
                                      **{k: {"type": "integer"} for k in (
                                          "onFailureRetries", "onFailureRetryInterval",
                                          "onSubmissionFailureRetries",
                                          "onSubmissionFailureRetryInterval")}}},
                "driver": _POD, "executor": _POD,
            },
        },
    },
}


# The Prometheus Operator's kinds (monitoring.coreos.com/v1), the fields k8s/monitoring uses,
# as its CRDs define them; a misspelt field fails.
_METADATA = {"type": "object", "required": ["name"]}
OPERATOR_SCHEMAS = {
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _METADATA,
            "spec": {"type": "object", "additionalProperties": False,
                     "required": ["selector", "endpoints"], "properties": {
                         "selector": {"type": "object", "properties": {
                             "matchLabels": {"type": "object"}}},
                         "endpoints": {"type": "array", "minItems": 1, "items": {
                             "type": "object", "additionalProperties": False,
                             "properties": {"port": {"type": "string"},
                                            "path": {"type": "string"},
                                            "interval": {"type": "string"},
                                            "scheme": {"enum": ["http", "https"]}}}}}}}},
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _METADATA,
            "spec": {"type": "object", "additionalProperties": False, "required": ["groups"],
                     "properties": {"groups": {"type": "array", "items": {
                         "type": "object", "additionalProperties": False,
                         "required": ["name", "rules"], "properties": {
                             "name": {"type": "string"}, "interval": {"type": "string"},
                             "rules": {"type": "array", "items": {
                                 "type": "object", "additionalProperties": False,
                                 "required": ["expr"], "properties": {
                                     "alert": {"type": "string"},
                                     "record": {"type": "string"},
                                     "expr": {"type": "string"}, "for": {"type": "string"},
                                     "labels": {"type": "object"},
                                     "annotations": {"type": "object"}}}}}}}}}}},
}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _manifests() -> list[Path]:
    files = sorted(K8S.rglob("*.yaml"))
    return [p for p in files if p.name != "kustomization.yaml" and p.name not in CONFIG_FILES
            and p.parent.name not in OVERLAYS]


def _validate(document: dict[str, Any]) -> None:
    if document["kind"] == "SparkApplication":
        jsonschema.validate(document, SPARK_APPLICATION_SCHEMA)
    elif document["kind"] in OPERATOR_SCHEMAS:
        jsonschema.validate(document, OPERATOR_SCHEMAS[document["kind"]])
    else:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("path", _manifests(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_manifest_validates_strictly(path):
    documents = _documents(path)
    assert documents
    for document in documents:
        _validate(document)


def test_a_wrong_field_fails_validation():
    (application,) = _documents(K8S / "base" / "etl-sparkapplication.yaml")
    application["spec"]["executor"]["gpus"] = 1  # the CRD's field is `gpu`
    with pytest.raises(jsonschema.ValidationError, match="gpus"):
        _validate(application)
    (deployment, *_) = _documents(K8S / "base" / "api.yaml")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)


def _render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (its built-in kustomize) is not installed")
    done = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_render_and_validate(overlay):
    documents = _render(overlay)
    kinds = {d["kind"] for d in documents}
    assert kinds >= {"SparkApplication", "CronJob", "Job", "StatefulSet", "Deployment",
                     "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap",
                     "Secret", "ServiceAccount", "Role", "RoleBinding"}
    for document in documents:
        assert document["metadata"].get("namespace", "featureline") == "featureline"
        _validate(document)


def test_the_gpu_overlay_asks_for_gpus():
    documents = {(d["kind"], d["metadata"]["name"]): d for d in _render("gpu")}
    application = documents[("SparkApplication", "featureline-etl")]["spec"]
    assert application["executor"]["gpu"] == {"name": "nvidia.com/gpu", "quantity": 1}
    assert application["sparkConf"]["spark.plugins"] == "com.nvidia.spark.SQLPlugin"
    cron = documents[("CronJob", "featureline-etl-daily")]
    command = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0][
        "command"]
    assert command[command.index("--properties-file") + 1] == "spark_conf/k8s-gpu.conf"
    api = documents[("Deployment", "featureline-api")]["spec"]["template"]["spec"]
    assert api["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    cpu = {(d["kind"], d["metadata"]["name"]): d for d in _render("cpu")}
    assert "gpu" not in cpu[("SparkApplication", "featureline-etl")]["spec"]["executor"]


def _all_yaml_text() -> str:
    return "\n".join(p.read_text() for p in sorted(K8S.rglob("*.yaml")))


def test_every_spark_property_exists_in_a_profile():
    known = set()
    for conf in spark_conf_dir().glob("*.conf"):
        known |= set(read_properties(conf))
    used = set(re.findall(r"^\s+(spark\.[\w.]+):", _all_yaml_text(), re.MULTILINE))
    assert used, "no Spark property found: the pattern is broken"
    assert used <= known, f"not in any spark_conf/*.conf: {sorted(used - known)}"
    for name in re.findall(r"spark_conf/([\w-]+\.conf)", _all_yaml_text()):
        assert (spark_conf_dir() / name).is_file(), name


def test_profiles_name_files_that_exist():
    for name in ("k8s-cpu", "k8s-gpu"):
        properties = read_properties(spark_conf_dir() / f"{name}.conf")
        for key in ("spark.kubernetes.driver.podTemplateFile",
                    "spark.kubernetes.executor.podTemplateFile"):
            template = REPO / properties[key]
            assert template.is_file(), template
            (pod,) = _documents(template)
            _validate(pod)
        account = properties["spark.kubernetes.authenticate.driver.serviceAccountName"]
        accounts = [d for d in _documents(K8S / "base" / "spark-rbac.yaml")
                    if d["kind"] == "ServiceAccount"]
        assert [a["metadata"]["name"] for a in accounts] == [account]


def test_cluster_configuration_is_valid():
    config = load_config(K8S / "base" / "featureline.yaml")
    assert config.api.host == "0.0.0.0" and config.api.auth.enabled
    assert config.etl.spark.profile == "k8s-cpu"
    hps = load_hps_config(K8S / "base" / "hps.yaml")
    assert hps.volatile_db.type == "redis"
    assert hps.persistent_db.path.startswith("/tmp/")  # the pod's writable emptyDir
    mounts = {m["mountPath"] for d in _documents(K8S / "base" / "api.yaml")
              if d["kind"] == "Deployment"
              for m in d["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert str(Path(config.api.auth.keys_file).parent) in mounts
    assert any(Path(config.api.hps).is_relative_to(mount) for mount in mounts - {"/"})


def test_the_daily_train_step_writes_the_parameter_server_configuration_the_api_reads():
    config = load_config(K8S / "base" / "featureline.yaml")
    (cronjob,) = _documents(K8S / "base" / "daily-cronjob.yaml")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    steps = pod["initContainers"]
    assert [step["name"] for step in steps + pod["containers"]] == [
        "etl", "train", "promote", "publish", "reload", "trim", "consistency"]
    # The ETL extends the output with yesterday's raw files, late arrivals accepted.
    etl = steps[0]["command"]
    assert "--incremental" in etl
    assert dated(etl[etl.index("--input") + 1], datetime(2026, 3, 2, 1, tzinfo=timezone.utc)
                 ) == "/data/raw/events-2026-03-01*.jsonl"
    assert config.etl.incremental.allow_late
    # The consistency step writes its metrics where every API pod exports them from.
    script = pod["containers"][1]["command"][2]
    assert script.startswith("exec featureline consistency ")
    assert (f"--metrics-file {config.api.feature_logging.path}/{REPORT_METRICS}" in script
            and f'--log "{config.api.feature_logging.path}/date=' in script)
    # The stream is trimmed after every API process has the new tables, by what they hold.
    assert pod["containers"][0]["command"][:3] == ["featureline", "hps", "trim-updates"]
    train = steps[1]
    arguments = dict(zip(train["command"][2::2], train["command"][3::2], strict=True))
    assert train["command"][:2] == ["featureline", "train"]
    # Each run trains into a folder of its own, which the gate then judges against the
    # model the API's api.hps is in (promote's default --served).
    promote = steps[2]
    assert promote["command"][:3] == ["featureline", "promote", arguments["--out"]]
    assert "--served" not in promote["command"] and "$(POD_NAME)" in arguments["--out"]
    assert all(step["env"] == train["env"] for step in (train, promote))
    assert train["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert Path(arguments["--out"]).parent != Path(config.api.hps).parent
    mounts = {m["name"]: m["mountPath"] for m in train["volumeMounts"]}
    # The template is the ConfigMap's hps.yaml, and a valid configuration.
    assert Path(arguments["--hps-template"]) == Path(mounts["config"]) / "hps.yaml"
    load_hps_config(K8S / "base" / "hps.yaml")
    assert Path(arguments["--out"]).is_relative_to(mounts["data"])


def test_environment_variables_are_the_ones_the_code_reads():
    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    (env,) = [g for g in kustomization["configMapGenerator"] if g["name"] == "featureline-env"]
    names = {literal.split("=", 1)[0] for literal in env["literals"]}
    assert names == {REDIS_URL_ENV, HPS_REDIS_URL_ENV, CONNECTION_ENV, CONFIG_ENV, OUTPUT_ENV}


@pytest.mark.parametrize("dockerfile", sorted((REPO / "docker").glob("*.Dockerfile")),
                         ids=lambda p: p.name)
def test_dockerfiles_copy_files_that_exist(dockerfile):
    copies = 0
    for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile.read_text().replace(
            "\\\n", " "), re.MULTILINE):
        *sources, _ = [part for part in line.split() if not part.startswith("--")]
        for source in sources:
            assert (REPO / source).exists(), f"{dockerfile.name}: COPY {source}"
            copies += 1
    assert copies
