"""``featureline demo`` once — small, the API and the stream processor left running — and
everything that reads what it leaves: its own account of the run, the embeddings the API
serves, the notebooks (nbclient, a real kernel; their plots render) and the metrics the
Grafana dashboard queries. One module, so that one xdist worker runs the demo (the fixture is
the worker's: ``demo_run`` in tests/conftest.py)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import nbformat
import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from nbclient import NotebookClient

from featureline.hps.config import load_hps_config
from featureline.hps.formats import read_hugectr

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
MONITORING = REPO / "k8s" / "monitoring"
METRIC = re.compile(r"\b(featureline_[a-z0-9_]+)")


def test_demo_command_runs_end_to_end(demo_run):
    out, result, url = demo_run
    assert result.exit_code == 0, result.output
    assert "rows: read 4,000 = accepted" in result.output
    assert "tfrecord:" in result.output and "demo finished" in result.output
    metadata = json.loads((out / "output" / "metadata.json").read_text())
    # Every bad row of the log quarantined: the served output's, the next day's run's.
    whole = json.loads((out / "next-day" / "metadata.json").read_text())["rows"]
    assert sum(whole["quarantined"].values()) == 40 - whole["duplicates"]
    assert metadata["rows"]["read"] < whole["read"] == 4000
    # Published: the sample rows it prints are what Redis now serves.
    assert f"online store {url}" in result.output
    users = pq.read_table(out / "output" / "entities" / "user").column("user_id")
    first = users.unique()[0].as_py()
    assert any(line.split()[:1] == [first] for line in result.output.splitlines())
    # Served: every endpoint answered (the demo stops at the first error) and says how.
    answers = [line for line in result.output.splitlines() if line.startswith("  → ")]
    assert len(answers) == 11 and all(a.startswith("  → 200") for a in answers[:10])
    # The trained model ranks candidates; the best five are shown, best first.
    (ranked,) = [line for line in result.output.splitlines() if " ranked for " in line]
    scores = [float(part.split()[-1]) for part in ranked.split(": ", 1)[1].split(", ")]
    assert len(scores) == 5 and scores == sorted(scores, reverse=True)
    # Then three events pushed (202) and served: the user's count grew by exactly three.
    assert answers[10] == '  → 202 {"accepted":3,"rejected":[]}'
    (fresh,) = [line for line in result.output.splitlines() if line.startswith("fresh features")]
    before, after = (int(n) for n in fresh.split("user_events ")[1].split(",")[0].split(" → "))
    assert after == before + 3
    # The demo's aggregations (defined by the demo: featureline.yaml has none) follow the
    # push at the request time, each saying when the pushed events leave its window.
    lines = result.output.splitlines()
    shown = lines[lines.index(next(line for line in lines if line.startswith(
        "aggregations of"))) + 1:]
    values = {line.split()[0]: line.split()[1:4] for line in shown[:5]}
    assert list(values) == [f"user_activity:{name}" for name in (
        "count_1h", "count_1d", "count_7d", "purchases_7d", "value_sum_7d")]
    # Three events pushed (values 1.0), one a purchase.
    for name, added in [("count_1h", 3), ("count_1d", 3), ("count_7d", 3),
                        ("purchases_7d", 1), ("value_sum_7d", 3)]:
        old, arrow, new = values[f"user_activity:{name}"]
        assert (arrow, float(new)) == ("→", float(old) + added), name
    assert all("(the pushed events count until " in line for line in shown[:5])
    # The 5 latest items: the pushed item three times, then the 2 latest before the push.
    name, old, arrow, new = shown[5].split()
    old, new = json.loads(old), json.loads(new)
    assert (name, arrow, len(old), len(new)) == ("user_activity:item_id_last_k", "→", 5, 5)
    assert new[:3] == [new[0]] * 3 and new[3:] == old[:2]
    assert metadata["tiles"]["groups"][0]["name"] == "user_activity"
    assert "authentication OFF" in result.output


def test_the_served_model_input_equals_the_row_the_next_days_run_wrote(demo_run):
    """The log's last day is held back: the API serves an impression of it at its own time,
    then the day's incremental run writes its TFRecord row — every feature the same."""
    out, result, _ = demo_run
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    (held,) = [line for line in lines if line.startswith("the last day, ")]
    day = held.split()[3].rstrip(",")
    assert (out / "raw" / f"events-{day}.jsonl").is_file()
    assert (f"etl run --incremental --input {out / 'raw' / f'events-{day}.jsonl'} --output "
            f"{out / 'next-day'}") in result.output
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("the model's input served for "))
    assert f"({'tfrecord/valid/' + day}-part-" in lines[start]
    assert lines[start + 1].split() == ["feature", "served", "written"]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("  ") or len(line.split()) != 3:
            break
        rows.append(line.split())
    metadata = json.loads((out / "next-day" / "metadata.json").read_text())
    # Every example feature, the ids and the lists among them.
    assert [name for name, _, _ in rows] == [
        name for group in metadata["tfrecord"]["groups"].values() for name in group["columns"]
        if name != "label"]
    assert all(served == written for _, served, written in rows), rows
    assert lines[start + 2 + len(rows)] == (f"  {len(rows)} features equal (ids exact, floats "
                                            f"within 1e-06)")
    # The copy now holds the day; the output the API serves does not.
    assert any(f["day"] == day for f in metadata["tfrecord"]["files"])
    served = json.loads((out / "output" / "metadata.json").read_text())
    assert not any(f["day"] == day for f in served["tfrecord"]["files"])


def test_the_guides_transcript_is_todays_demo(demo_run):
    """docs/getting-started.md shows a run of today's demo (scripts/demo_transcript.py writes
    it): the same features, tables, categorical features and TFRecord groups, run by run."""
    _, result, _ = demo_run
    page = (REPO / "docs" / "getting-started.md").read_text()

    def shown(text: str) -> list[str]:
        kept = []
        for line in text.splitlines():
            if line.startswith("features: "):
                kept.append(line)
            elif line.startswith("tfrecord: "):
                kept.append(line.split(", prebatch")[1])
            elif re.match(r"^  \w+: [\d,]+ x \d+", line):
                kept.append(line.split(":")[0])
        return kept

    assert shown(page) == shown(result.output)
    assert len(shown(page)) > 10


def test_the_demo_serves_the_embeddings_it_trained(demo_run):
    """The ranking call returns the exported tables' rows, trained on this very output."""
    out, result, _ = demo_run
    assert result.exit_code == 0, result.output
    report = json.loads((out / "hps" / "training.json").read_text())
    metadata = json.loads((out / "output" / "metadata.json").read_text())
    assert report["dataset_version"] == metadata["dataset"]["version"]
    assert f"AUC {report['validation']['model']['auc']:.4f}" in result.output
    # The lift of the derived feature and the counts it reads, the training seed's first.
    described = {f["name"]: f for f in metadata["features"]}
    assert described["category_click_rate"]["derived"].startswith("ratio(user_category:")
    (lift,) = [line for line in result.output.splitlines() if line.startswith("lift of ")]
    assert lift.startswith("lift of category_click_rate, user_category__clicks_30d, "
                           "user_category__count_30d, category_click_rate_missing (3 seeds, ")
    (seed,) = re.findall(r"seed 0: model AUC (\d\.\d+) with", result.output)
    assert seed == f"{report['validation']['model']['auc']:.4f}"
    settings = yaml.safe_load((out / "featureline.yaml").read_text())["api"]
    user = pq.read_table(out / "output" / "entities" / "user").column("user_id")[0].as_py()
    items = pq.read_table(out / "output" / "entities" / "item").column("item_id")
    body = json.dumps({"user_id": user, "item_ids": items.unique()[:5].to_pylist()}).encode()
    request = urllib.request.Request(
        f"http://{settings['host']}:{settings['port']}/v1/ranking-inputs", data=body,
        headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        served = json.load(answer)
    hps = load_hps_config(report["hps_config"])
    sources = {t.name: (t.source, t.dim) for t in hps.models[0].tables}
    for feature, table, side in (("user_id_cat", "user", "user"), ("item_id_cat", "item", "items")):
        keys, vectors = read_hugectr(*sources[table])
        rows = dict(zip(keys.tolist(), vectors, strict=True))
        expected = np.stack([rows[k] for k in served[side]["encoded_ids"]])
        np.testing.assert_array_equal(
            np.array(served["embeddings"][feature]["vectors"], dtype=np.float32), expected)


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_runs_and_plots(path, demo_run, monkeypatch):
    out, result, url = demo_run
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("FEATURELINE_DEMO_DIR", str(out))
    monkeypatch.setenv("REDIS_URL", url)
    notebook = nbformat.read(path, as_version=4)
    # A failing cell raises CellExecutionError naming it.
    NotebookClient(notebook, kernel_name="python3", timeout=300,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} rendered no plot"


def _exported(text: str) -> set[str]:
    """Every series name a Prometheus text page can hold, from its TYPE lines."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE):
        names.add(name)
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",),
                    "summary": ("_count", "_sum")}.get(kind, ())
        names.update(name.removesuffix("_total") + s for s in suffixes)
    return names


def test_the_dashboard_queries_only_metrics_the_api_exports(demo_run):
    out, result, _ = demo_run
    assert result.exit_code == 0, result.output
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    queried = {name for p in panels for t in p["targets"] for name in METRIC.findall(t["expr"])}
    settings = yaml.safe_load((out / "featureline.yaml").read_text())
    api = settings["api"]
    # The API's /metrics, and the stream processor's (the demo's serve runs one).
    exported: set[str] = set()
    for url in (f"http://{api['host']}:{api['port']}/metrics",
                f"http://127.0.0.1:{settings['stream']['metrics_port']}/metrics"):
        with urllib.request.urlopen(url, timeout=30) as answer:
            exported |= _exported(answer.read().decode())
    assert queried and queried <= exported, sorted(queried - exported)
    # What the issue asks the dashboard to show is there.
    for wanted in ("featureline_api_request_seconds_bucket", "featureline_api_errors_total",
                   "featureline_hps_keys_share", "featureline_online_store_available",
                   "featureline_dataset_info", "featureline_hps_update_lag_seconds",
                   "featureline_feature_freshness_seconds_bucket",
                   "featureline_consistency_mismatch_ratio", "featureline_check_breaches",
                   "featureline_checks_run_timestamp_seconds"):
        assert wanted in queried
