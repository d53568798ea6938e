"""Label joins: impressions are the examples, labelled by a positive of the same user and
item within the window after them. A brute force over a generated log with hand-made cases
(several impressions before one click, clicks without an impression, positives exactly at
the window's end and just past it, windows open at the log's end, ties, duplicates) equals
the ETL's examples row for row, and its row accounting; an incremental day equals a full run
with the same fit; no feature of an example reads the positive that labels it."""

from __future__ import annotations

import json
import random
import shutil
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from featureline.etl import job
from featureline.etl.datagen import generate_events
from tests.job_config import make_config

WITHIN = timedelta(minutes=30)
JOIN = {"of": "event_type in (view)", "positive": "event_type in (click, purchase)",
        "within": "30m"}
POSITIVES = {"click", "purchase"}
LAST_DAY = "2026-01-08"
NEW_DAY = "2026-01-09"


def _at(day: str, clock: str) -> str:
    return f"{day}T{clock}Z"


def _hand_cases(template: dict) -> list[dict]:
    """Events of hand-made pairs (user h-<n>, item x-<n>) around the cases the rule names."""
    def event(case: int, kind: str, when: str, **extra: object) -> dict:
        return {**template, "user_id": f"h-{case}", "item_id": f"x-{case}",
                "event_type": kind, "ts": when, **extra}

    day = "2026-01-06"
    return [
        # Several impressions before one click: the latest is labelled.
        event(1, "view", _at(day, "10:00:00")), event(1, "view", _at(day, "10:05:00")),
        event(1, "view", _at(day, "10:10:00")), event(1, "click", _at(day, "10:20:00")),
        # A click without an impression.
        event(2, "click", _at(day, "11:00:00")),
        # A click exactly at the window's end labels; one a second past it does not.
        event(3, "view", _at(day, "12:00:00")), event(3, "click", _at(day, "12:30:00")),
        event(4, "view", _at(day, "13:00:00")), event(4, "click", _at(day, "13:30:01")),
        # Two impressions at one time (another device): both labelled; an exact copy: one.
        event(5, "view", _at(day, "14:00:00"), device="mobile"),
        event(5, "view", _at(day, "14:00:00"), device="desktop"),
        event(5, "view", _at(day, "14:00:00"), device="desktop"),
        event(5, "purchase", _at(day, "14:10:00")),
        # A click at an impression's own time labels the impression before it.
        event(6, "view", _at(day, "14:50:00")), event(6, "view", _at(day, "15:00:00")),
        event(6, "click", _at(day, "15:00:00")),
        # Two clicks after one impression: one example, labelled once.
        event(7, "view", _at(day, "17:00:00")), event(7, "click", _at(day, "17:05:00")),
        event(7, "click", _at(day, "17:10:00")),
        # A window across midnight.
        event(8, "view", _at(day, "23:50:00")), event(8, "click", "2026-01-07T00:10:00Z"),
        # At the log's end (its latest event at 23:59:00): open windows are held, unless
        # labelled already; one closing a second before the latest event is an example.
        event(9, "view", _at(LAST_DAY, "23:40:00")),
        event(10, "view", _at(LAST_DAY, "23:29:00")),
        event(11, "view", _at(LAST_DAY, "23:28:59")),
        event(12, "view", _at(LAST_DAY, "23:45:00")), event(12, "click", _at(LAST_DAY, "23:50:00")),
        event(13, "add_to_cart", _at(LAST_DAY, "23:59:00")),
        # The new day's: it closes some of those windows, labels one, and holds its own.
        event(9, "click", _at(NEW_DAY, "00:05:00")),
        event(14, "view", _at(NEW_DAY, "09:00:00")), event(14, "click", _at(NEW_DAY, "09:01:00")),
        event(15, "view", _at(NEW_DAY, "23:50:00")),
        event(16, "click", _at(NEW_DAY, "23:59:30")),
    ]


def _log(folder: Path) -> dict[str, Path]:
    """A generated log of four days and the hand-made cases, as two raw files: the days to
    ``LAST_DAY`` and ``NEW_DAY``'s (generated events of that day too)."""
    generated = generate_events(events=2500, users=60, items=40, days=5, seed=5)
    # None for a missing number; none after the hand-made latest event of LAST_DAY.
    records = [{k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
               for row in generated.to_dict("records")
               if not row["ts"].startswith(f"{LAST_DAY}T23:59")]
    records += _hand_cases(records[0])
    random.Random(3).shuffle(records)
    folder.mkdir()
    old = [r for r in records if r["ts"][:10] <= LAST_DAY]
    new = [r for r in records if r["ts"][:10] > LAST_DAY]
    paths = {"old": folder / "events-old.jsonl", "new": folder / "events-new.jsonl"}
    for name, rows in (("old", old), ("new", new)):
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def _seconds(ts: object) -> float:
    if isinstance(ts, datetime):
        return (ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)).timestamp()
    return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()


def brute_force(paths: list[Path]) -> tuple[list[tuple], dict[str, int]]:
    """The examples (user, item, seconds, label), sorted, and the accounting, from the rule
    as the docs state it, per positive: it labels the latest impression strictly before it
    (all of those at that time) where at most ``WITHIN`` before it."""
    lines = {line for path in paths for line in path.read_text().splitlines()}
    events = [json.loads(line) for line in lines]
    latest = max(_seconds(e["ts"]) for e in events)
    within = WITHIN.total_seconds()
    pairs: dict[tuple, list[dict]] = defaultdict(list)
    for event in events:
        pairs[(event["user_id"], event["item_id"])].append(event)
    examples, rows = [], {"positives": 0, "positives_without_impression": 0, "held_open": 0}
    for (user, item), theirs in pairs.items():
        shown = [_seconds(e["ts"]) for e in theirs if e["event_type"] == "view"]
        labelled = set()
        for event in theirs:
            if event["event_type"] not in POSITIVES:
                continue
            at = _seconds(event["ts"])
            before = [t for t in shown if t < at]
            matched = bool(before) and at - max(before) <= within
            if matched:
                labelled.add(max(before))
            rows["positives"] += 1
            rows["positives_without_impression"] += not matched
        for t in shown:
            if t not in labelled and t + within >= latest:
                rows["held_open"] += 1
            else:
                examples.append((user, item, t, int(t in labelled)))
    rows["examples"] = len(examples)
    rows["other"] = len(events) - sum(rows[k] for k in ("examples", "positives", "held_open"))
    return sorted(examples), rows


def examples_of(output: Path) -> list[tuple]:
    table = pq.read_table(output / "examples", columns=["user_id", "item_id", "ts", "label"])
    return sorted((r["user_id"], r["item_id"], _seconds(r["ts"]), r["label"])
                  for r in table.to_pylist())


@pytest.fixture(scope="module")
def runs(spark, tmp_path_factory):
    """The days to ``LAST_DAY`` run in full; the new day run incrementally keeping that
    fit; a full run over both files with that fit (``--fit-from``)."""
    root = tmp_path_factory.mktemp("label-join")
    files = _log(root / "raw")
    config = make_config(root, files["old"], label=JOIN)
    base = job.run(config, spark, progress=lambda _: None)
    shutil.copytree(base.output, root / "base")
    base = job.JobResult(root / "base", base.metadata)  # the incremental run replaces out/
    incremental = job.run(config.model_copy(update={
        "mode": "incremental",
        "fit": config.fit.model_copy(update={"refit_every": "30d"}),
        "source": config.source.model_copy(update={"path": str(files["new"])})}), spark,
        progress=lambda _: None)
    full = job.run(make_config(root / "full", root / "raw", label=JOIN,
                               fit={"from_output": str(root / "base")}), spark,
                   progress=lambda _: None)
    return {"root": root, "files": files, "base": base, "incremental": incremental,
            "full": full}


@pytest.mark.parametrize("run, files", [("base", ["old"]), ("full", ["old", "new"])])
def test_examples_and_rows_equal_the_brute_force(runs, run, files):
    expected, rows = brute_force([runs["files"][name] for name in files])
    output = runs[run].output
    ours = examples_of(output)
    assert ours == expected
    accounting = runs[run].metadata["rows"]
    assert {k: accounting["label_join"][k] for k in rows} == rows
    assert sum(accounting["label_join"][k] for k in ("examples", "positives", "held_open",
                                                     "other")) == accounting["accepted"]
    split = runs[run].metadata["split"]["rows"]
    assert sum(split.values()) == len(expected)
    # The cases the rule names, as the brute force gives them.
    labels = {(u, datetime.fromtimestamp(t, timezone.utc).strftime("%d %H:%M:%S")): label
              for u, _, t, label in ours if u.startswith("h-")}
    assert labels["h-1", "06 10:10:00"] == 1 and labels["h-1", "06 10:05:00"] == 0
    assert labels["h-3", "06 12:00:00"] == 1 and labels["h-4", "06 13:00:00"] == 0
    assert [label for (u, _), label in labels.items() if u == "h-5"] == [1]
    assert labels["h-6", "06 14:50:00"] == 1 and labels["h-6", "06 15:00:00"] == 0
    assert labels["h-8", "06 23:50:00"] == 1
    assert labels["h-11", "08 23:28:59"] == 0 and labels["h-12", "08 23:45:00"] == 1
    if run == "base":
        assert ("h-9", "08 23:40:00") not in labels and ("h-10", "08 23:29:00") not in labels
    else:
        assert labels["h-9", "08 23:40:00"] == 1 and labels["h-10", "08 23:29:00"] == 0
        assert ("h-15", "09 23:50:00") not in labels


def test_tied_impressions_are_each_an_example(runs):
    tied = [row for row in pq.read_table(runs["full"].output / "examples").to_pylist()
            if row["user_id"] == "h-5"]
    assert len(tied) == 2 and {row["label"] for row in tied} == {1}


def test_an_incremental_day_equals_a_full_run_with_its_fit(runs):
    ours, theirs = runs["incremental"], runs["full"]
    assert examples_of(ours.output) == examples_of(theirs.output)
    order = ["user_id", "item_id", "ts"]
    for split in ("train", "valid"):
        mine, full = (pq.read_table(run.output / "examples" / f"split={split}").to_pandas()
                      .drop(columns="day").sort_values(order, kind="stable")
                      .reset_index(drop=True) for run in (ours, theirs))
        assert mine.astype(str).equals(full.astype(str)), split
    assert ours.metadata["rows"]["label_join"] == theirs.metadata["rows"]["label_join"]
    assert ours.metadata["split"]["rows"] == theirs.metadata["split"]["rows"]


def test_no_feature_reads_the_positive_that_labels_its_example(runs, spark):
    """The log again without the positives that label each user's last labelled example
    in the fit's training split, with that fit: those examples' features are what they were
    (their label now 0). Only later examples of the user could read them, and none of those
    is compared; their ids are the fit's (numbered from its training split)."""
    root = runs["root"]
    lines = [json.loads(line) for path in runs["files"].values()
             for line in path.read_text().splitlines()]
    trained_until = _seconds(runs["base"].metadata["split"]["valid_from"])
    last: dict[str, tuple] = {}
    for user, item, t, label in examples_of(runs["full"].output):
        if label and t < trained_until and (user not in last or t > last[user][2]):
            last[user] = (user, item, t)
    chosen = set(last.values())
    shown = defaultdict(list)
    for event in lines:
        if event["event_type"] == "view":
            shown[event["user_id"], event["item_id"]].append(_seconds(event["ts"]))

    def labels_one(event: dict) -> bool:
        if event["event_type"] not in POSITIVES:
            return False
        at = _seconds(event["ts"])
        before = [t for t in shown[event["user_id"], event["item_id"]] if t < at]
        return bool(before) and (event["user_id"], event["item_id"], max(before)) in chosen

    kept = [event for event in lines if not labels_one(event)]
    assert len(kept) < len(lines)
    (root / "without").mkdir()
    (root / "without" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    without = job.run(make_config(root / "without-out", root / "without" / "events.jsonl",
                                  label=JOIN, fit={"from_output": str(root / "base")}), spark,
                      progress=lambda _: None)

    def rows(output: Path) -> dict[tuple, dict]:
        """Examples by their keys; impressions sharing theirs left out."""
        by_key: dict[tuple, list[dict]] = defaultdict(list)
        for r in pq.read_table(output / "examples").to_pylist():
            by_key[r["user_id"], r["item_id"], _seconds(r["ts"])].append(r)
        return {key: found[0] for key, found in by_key.items() if len(found) == 1}

    before, after = rows(runs["full"].output), rows(without.output)
    compared = 0
    for key, row in before.items():
        if key not in chosen or key not in after:
            continue
        assert after[key]["label"] == 0
        features = {k: v for k, v in row.items() if k not in ("label", "split", "day")}
        assert features == {k: v for k, v in after[key].items()
                            if k not in ("label", "split", "day")}, key
        compared += 1
    assert compared >= 10


def test_a_new_day_run_twice_changes_no_example(runs, spark):
    """Its events are all duplicates: no window closes, no day is written again."""
    output = runs["root"] / "twice"
    shutil.copytree(runs["incremental"].output, output)
    inodes = {p: p.stat().st_ino for p in (output / "examples").rglob("*.parquet")}
    config = make_config(runs["root"], runs["files"]["new"], label=JOIN)
    again = job.run(config.model_copy(update={
        "mode": "incremental", "fit": config.fit.model_copy(update={"refit_every": "30d"}),
        "output": config.output.model_copy(update={"path": str(output)})}), spark,
        progress=lambda _: None)
    assert again.metadata["rows"]["this_run"]["accepted"] == 0
    assert examples_of(output) == examples_of(runs["incremental"].output)
    assert again.metadata["rows"]["label_join"] == runs["incremental"].metadata["rows"][
        "label_join"]
    assert {p: p.stat().st_ino for p in (output / "examples").rglob("*.parquet")} == inodes
