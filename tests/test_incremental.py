"""Incremental ETL runs: the last days' raw files and the output's state give every table a
full run over every raw file gives, when both extend the same vocabularies; an incompatible
output is refused (a killed day run leaving the previous output whole is
tests/test_daily_chain.py's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from featureline.core.drift import PROFILE_FILE
from featureline.etl import job
from featureline.etl.config import EtlConfig
from featureline.etl.errors import IncompatibleStateError
from featureline.etl.incremental import LATE_EVENT, STATE_DIR
from tests.job_config import make_config

NEW_DAYS = ("2026-01-09", "2026-01-10")
# Aggregations keyed by the user and by the item (an item's value reads other users'
# events): an incremental run computes them as a full run does.
AGGREGATIONS = [{"name": "user_recent", "keys": ["user_id"], "features": [
                    {"op": "count", "windows": ["1d"]}, {"op": "last_k", "column": "item_id",
                                                        "k": 2},
                    # On days (a day's run reads the earlier days' partials): a frame of
                    # exits, the lifetime's, and whole hops with the head.
                    {"op": "mean", "column": "label", "windows": ["30d", "all"]},
                    {"op": "max", "column": "value", "windows": ["30d"]}]},
                {"name": "item_recent", "keys": ["item_id"], "features": [
                    {"op": "sum", "column": "value", "windows": ["7d"]}]},
                # Windows short enough that a day's run reads the stored events from an hour
                # before its first changed day only: every plan of the backfill.
                {"name": "item_hour", "keys": ["item_id"], "features": [
                    {"op": "count", "windows": ["1h"]},
                    {"op": "mean", "column": "value", "windows": ["1h"]},
                    {"op": "approx_distinct", "column": "user_id", "windows": ["1h"]},
                    {"op": "last", "column": "category", "windows": ["1h"]}]}]


def _split_log(log: Path, folder: Path) -> dict[str, Path]:
    """The small log as two raw files, the days before the new ones (and every line without
    a readable day) and the new days, plus in the new file: an exact copy of an old event
    (a duplicate across runs), an old event of a new item (late), the first event of a new
    user with a new category, and two events of a user back after weeks away (their new
    events' history and item recency read events older than every time window, some at one
    instant)."""
    folder.mkdir()
    old, new = [], []
    for line in log.read_text().splitlines():
        try:
            day = json.loads(line)["ts"][:10]
        except (ValueError, KeyError, TypeError):
            day = ""
        (new if day in NEW_DAYS else old).append(line)
    first = json.loads(old[0])
    late = {**first, "item_id": "i-late", "ts": "2026-01-06T12:00:00Z"}
    # In the training split once the new days are in (vocabularies are fitted on it).
    newcomer = {**json.loads(new[-1]), "user_id": "u-new", "category": "c-new",
                "ts": "2026-01-09T20:00:00Z"}
    away = [{**event, "user_id": "u-back", "ts": f"2025-12-1{index % 3}T10:{index // 2:02d}:00Z"}
            for index, event in enumerate(_events(old[:200])[:25])]
    back = [{**away[3], "ts": "2026-01-09T08:00:00Z"}, {**away[20], "ts": "2026-01-10T09:00:00Z"}]
    old += map(json.dumps, away)
    new += [old[0], json.dumps(late), json.dumps(newcomer), *map(json.dumps, back)]
    paths = {"old": folder / "events-old.jsonl", "new": folder / "events-new.jsonl"}
    paths["old"].write_text("\n".join(old) + "\n")
    paths["new"].write_text("\n".join(new) + "\n")
    return paths


def _events(lines: list[str]) -> list[dict]:
    """The lines that are JSON objects, parsed (the small log holds broken ones too)."""
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _table(path: Path) -> pa.Table:
    """Every Parquet file under ``path`` as one table, rows in a canonical order."""
    table = pq.read_table(path)
    for index, field in enumerate(table.schema):  # a partition column comes as a dictionary
        if pa.types.is_dictionary(field.type):
            table = table.set_column(index, field.name,
                                     table[field.name].cast(field.type.value_type))
    keys = [(name, "ascending") for name in table.column_names
            if not pa.types.is_list(table.schema.field(name).type)]
    return table.sort_by(keys)


def _same(ours: object, theirs: object, path: str = "") -> None:
    """Equal, floats to 1e-12 relative: the continuous columns' statistics are sums of the
    same values in another order (the examples they produce are equal bit for bit)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), path
        for key in ours:
            _same(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(ours, list) and isinstance(theirs, list):
        assert len(ours) == len(theirs), path
        for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _same(a, b, f"{path}[{index}]")
    elif isinstance(ours, float):
        assert ours == pytest.approx(theirs, rel=1e-12), path
    else:
        assert ours == theirs, path


def _profile(output: Path) -> dict:
    """The profile a run wrote (profile.json) less its own row accounting (an incremental
    run's is its own); compared with ``_same``: its moments are sums of the same rows."""
    written = json.loads((output / PROFILE_FILE).read_text())
    return {key: value for key, value in written.items() if key != "rows"}


def _comparable(metadata: dict) -> dict:
    """metadata.json less what differs from run to run (when, the run's own id and input,
    its timings, the reference its validation checked it against, its fit's id) and this
    run's own row accounting."""
    left = {k: v for k, v in metadata.items()
            if k not in ("created_at", "dataset", "timings_s", "source", "config_hash",
                         "mode", "vocabularies", "checks")}
    left["rows"] = {k: v for k, v in metadata["rows"].items() if k != "this_run"}
    left["vocabularies"] = {column: entry["path"]
                            for column, entry in metadata["vocabularies"].items()}
    # Each run fits anew: its fit is its own (version, when), of the same training split.
    left["fit"] = {k: v for k, v in metadata["fit"].items() if k not in ("version", "fitted_at")}
    return left


@pytest.fixture(scope="module")
def runs(spark, small_log, tmp_path_factory):
    """The old days' run, then an incremental run of the new days (late events allowed) that
    fits anew (``--refit``: a daily run keeps its fit by default); and a full run over both
    files extending the old run's vocabularies."""
    root = tmp_path_factory.mktemp("incremental")
    files = _split_log(small_log, root / "raw")
    config = make_config(root, files["old"], incremental={"allow_late": True},
                         aggregations=AGGREGATIONS)
    base = job.run(config, spark, progress=lambda _: None)
    shutil.copytree(base.output, root / "base")  # the vocabularies both runs extend
    incremental = job.run(config.model_copy(update={
        "mode": "incremental", "fit": config.fit.model_copy(update={"refit": True}),
        "source": config.source.model_copy(update={"path": str(files["new"])})}), spark,
        progress=lambda _: None)
    full = job.run(make_config(root / "full", root / "raw", incremental={"allow_late": True},
                               vocabulary={"previous": str(root / "base")},
                               aggregations=AGGREGATIONS),
                   spark, progress=lambda _: None)
    return {"root": root, "files": files, "config": config, "base": base.metadata,
            "incremental": incremental, "full": full}


@pytest.mark.parametrize("table", ["examples", "entities/user", "entities/item",
                                   "quarantine", f"{STATE_DIR}/events",
                                   f"{STATE_DIR}/entity_rows/user",
                                   f"{STATE_DIR}/entity_rows/item",
                                   f"{STATE_DIR}/day_partials/user_recent",
                                   "artifacts/categorify/user_id",
                                   "artifacts/categorify/category",
                                   "aggregations/user_recent", "aggregations/item_recent",
                                   "tiles/user_recent/item_id_last_k",
                                   "tiles/user_recent/label_mean_30d",
                                   "tiles/user_recent/label_mean_all",
                                   "tiles/user_recent/value_max_30d",
                                   "tiles/item_recent/value_sum_7d"])
def test_every_table_equals_the_full_runs(runs, table):
    ours = same_table(runs["incremental"].output, runs["full"].output, table)
    if table == "examples":
        assert {"user_recent__count_1d", "item_recent__value_sum_7d"} <= set(ours.column_names)


def same_table(ours: Path, theirs: Path, table: str) -> pa.Table:
    """Assert the ``table`` of two outputs holds the same rows (and is not empty); ours."""
    mine, other = _table(ours / table), _table(theirs / table)
    assert mine.num_rows > 0
    # Names, types and nullability (what a file's reader sees as required).
    assert ([(f.name, f.type, f.nullable) for f in mine.schema]
            == [(f.name, f.type, f.nullable) for f in other.schema])
    if table.startswith(("aggregations/", "tiles/")):
        # Sums of doubles: a tile's is summed in another order by the other run's plan.
        assert mine.to_pylist() == [pytest.approx(row, rel=1e-12)
                                    for row in other.to_pylist()], table
    else:
        assert mine.to_pylist() == other.to_pylist(), table
    return mine


def test_tfrecords_and_metadata_equal_the_full_runs(runs):
    same_records_and_metadata(runs["incremental"], runs["full"])


def same_records_and_metadata(ours: job.JobResult, theirs: job.JobResult) -> None:
    """Assert two runs wrote the same TFRecords (byte for byte), metadata.json (less what
    differs from run to run) and profile."""
    for path in sorted((theirs.output / "tfrecord").rglob("*")):
        if path.is_file():
            relative = path.relative_to(theirs.output)
            assert (ours.output / relative).read_bytes() == path.read_bytes(), relative
    _same(_comparable(ours.metadata), _comparable(theirs.metadata))
    _same(_profile(ours.output), _profile(theirs.output))


def test_rows_add_up_across_runs_and_this_runs_own(runs):
    rows = runs["incremental"].metadata["rows"]
    base = runs["base"]["rows"]
    this_run = rows["this_run"]
    new_lines = len(runs["files"]["new"].read_text().splitlines())
    assert this_run["read"] == new_lines
    assert rows["read"] == base["read"] + new_lines
    for accounting in (rows, this_run):
        assert accounting["read"] == (accounting["accepted"] + accounting["duplicates"]
                                      + sum(accounting["quarantined"].values()))
    assert this_run["duplicates"] >= 1  # the old event sent again
    assert rows["accepted"] == pq.read_table(
        runs["incremental"].output / STATE_DIR / "events").num_rows
    # The validation split moved to the new last day; the new user and category are in.
    assert runs["incremental"].metadata["split"]["valid_from"].startswith(NEW_DAYS[-1])
    examples = pq.read_table(runs["incremental"].output / "examples")
    assert "u-new" in examples["user_id"].to_pylist()
    vocabulary = pq.read_table(runs["incremental"].output / "artifacts/categorify/category")
    assert "c-new" in vocabulary["value"].to_pylist()
    duplicates = pq.read_table(runs["incremental"].output / "duplicates").to_pylist()
    assert any(row["kept_file"] == f"{STATE_DIR}/events" for row in duplicates)


def _new_day(runs: dict, output: Path, allow_late: bool) -> EtlConfig:
    """The incremental run of the new days' file into ``output``, fitting anew as the
    fixture's does."""
    config = runs["config"]
    return config.model_copy(update={
        "mode": "incremental", "fit": config.fit.model_copy(update={"refit": True}),
        "incremental": config.incremental.model_copy(update={"allow_late": allow_late}),
        "output": config.output.model_copy(update={"path": str(output)}),
        "source": config.source.model_copy(update={"path": str(runs["files"]["new"])})})


@pytest.mark.slow
def test_late_events_are_quarantined_unless_allowed(runs, spark):
    output = runs["root"] / "late"
    shutil.copytree(runs["root"] / "base", output)
    result = job.run(_new_day(runs, output, allow_late=False), spark, progress=lambda _: None)
    assert result.metadata["rows"]["this_run"]["quarantined"][LATE_EVENT] >= 1
    late = pq.read_table(output / "quarantine").to_pylist()
    assert any(row["reason"] == LATE_EVENT and "i-late" in row["record"] for row in late)
    examples = pq.read_table(output / "examples")
    assert "i-late" not in examples["item_id"].to_pylist()


@pytest.mark.slow
def test_a_day_run_twice_changes_nothing(runs, spark):
    """Its rows are duplicates of the events the first run stored (not late ones, though
    they are older than the output's latest); no stored day changes, so every state file
    is the one before (linked into the new output, not written again)."""
    output = runs["root"] / "twice"
    shutil.copytree(runs["incremental"].output, output)

    def state_files() -> dict[Path, int]:
        return {path.relative_to(output): path.stat().st_ino
                for path in (output / STATE_DIR / "events").rglob("*.parquet")}

    before = state_files()
    again = job.run(_new_day(runs, output, allow_late=False), spark, progress=lambda _: None)
    assert before and state_files() == before
    first, this_run = runs["incremental"].metadata["rows"]["this_run"], again.metadata[
        "rows"]["this_run"]
    assert this_run["accepted"] == 0 and this_run["quarantined"][LATE_EVENT] == 0
    assert this_run["duplicates"] == first["accepted"] + first["duplicates"]
    for table in ("examples", "entities/user", f"{STATE_DIR}/events"):
        assert _table(output / table).equals(_table(runs["incremental"].output / table))


def test_an_incompatible_output_is_refused_naming_what_differs(runs, spark, tmp_path):
    config = runs["config"]
    incremental = config.model_copy(update={
        "mode": "incremental",
        "source": config.source.model_copy(update={"path": str(runs["files"]["new"])})})
    other = incremental.model_copy(update={
        "split": incremental.split.model_copy(update={"valid_days": 2})})
    with pytest.raises(IncompatibleStateError, match="other settings"):
        job.run(other.model_copy(update={"output": config.output.model_copy(
            update={"path": str(runs["root"] / "base")})}), spark, progress=lambda _: None)
    with pytest.raises(IncompatibleStateError, match="no ETL output there"):
        job.run(incremental.model_copy(update={"output": config.output.model_copy(
            update={"path": str(tmp_path / "nothing")})}), spark, progress=lambda _: None)
    refit = incremental.model_copy(update={
        "vocabulary": incremental.vocabulary.model_copy(update={"refit": True}),
        "output": config.output.model_copy(update={"path": str(runs["root"] / "base")})})
    with pytest.raises(IncompatibleStateError, match="refit-vocabularies"):
        job.run(refit, spark, progress=lambda _: None)


@pytest.fixture(scope="module")
def kept(runs, spark):
    """The new days' incremental run keeping the old days' fit (``etl.fit.refit_every``), and
    a full run over every raw file transforming with that same fit (``--fit-from``); the
    inodes of the old output's example and TFRecord files before the incremental run."""
    root = runs["root"]
    output = root / "kept"
    shutil.copytree(root / "base", output)
    inodes, snapshots = _inodes(output), _snapshot_inodes(output)
    partials = _snapshot_inodes(output, f"{STATE_DIR}/day_partials")
    config = _new_day(runs, output, allow_late=True)
    incremental = job.run(config.model_copy(update={"fit": config.fit.model_copy(
        update={"refit_every": "30d", "refit": False})}), spark, progress=lambda _: None)
    full = job.run(make_config(root / "kept-full", root / "raw", incremental={"allow_late": True},
                               fit={"from_output": str(root / "base")},
                               aggregations=AGGREGATIONS), spark, progress=lambda _: None)
    return {"incremental": incremental, "full": full, "inodes": inodes, "output": output,
            "snapshot_inodes": snapshots, "partial_inodes": partials}


def _snapshot_inodes(output: Path, folder: str = "aggregations"
                     ) -> dict[tuple[str, str], int]:
    """(day, path) → inode of the files of a table written a file per day under ``folder``
    (the aggregations' snapshots; the state's day partials)."""
    return {(path.name[:10], str(path.relative_to(output))): path.stat().st_ino
            for path in (output / folder).rglob("????-??-??-part-*.parquet")}


def _inodes(output: Path) -> dict[tuple[str, str], int]:
    """(day, file name) → inode of the examples' and TFRecords' files under ``output``."""
    inodes = {}
    for path in (output / "examples").rglob("*.parquet"):
        inodes[(path.parent.name.partition("=")[2], path.name)] = path.stat().st_ino
    for path in (output / "tfrecord").rglob("*.tfrecord*"):
        inodes[(path.name[:10], path.name)] = path.stat().st_ino
    return inodes


@pytest.mark.slow
def test_a_kept_fit_writes_only_the_days_it_changes(kept):
    """With the output's fit kept, the incremental run's output equals a full run's with
    that fit, table by table and TFRecord byte by byte; the days before the earliest one
    its events change keep their files (the same inodes: not written again), whichever
    split they are in now."""
    ours, theirs = kept["incremental"], kept["full"]
    assert ours.metadata["fit"]["version"] == theirs.metadata["fit"]["version"]
    # The split from the state and the new events: a full run's, from every event.
    assert ours.metadata["split"] == theirs.metadata["split"]
    for table in ("examples", "entities/user", "artifacts/categorify/user_id",
                  "artifacts/target_encode/item_id"):
        assert _table(ours.output / table).to_pylist() == _table(theirs.output / table
                                                                 ).to_pylist(), table
    # The aggregations' snapshots: the days after the first changed one computed, the
    # earlier days' files the output's (sums of doubles: in another order).
    for group in AGGREGATIONS:
        table = f"aggregations/{group['name']}"
        assert _table(ours.output / table).to_pylist() == [
            pytest.approx(row, rel=1e-12) for row in _table(theirs.output / table).to_pylist()]
    # The day partials a day's run starts from: the full run's.
    assert _table(ours.output / STATE_DIR / "day_partials/user_recent").to_pylist() == _table(
        theirs.output / STATE_DIR / "day_partials/user_recent").to_pylist()
    # The snapshot days up to the first changed one keep their files, and the partials of
    # the days before it theirs; the later ones not.
    for folder, before in (("aggregations", "snapshot_inodes"),
                           (f"{STATE_DIR}/day_partials", "partial_inodes")):
        after = _snapshot_inodes(kept["output"], folder)
        same = {day for key, inode in kept[before].items() if after.get(key) == inode
                for day in [key[0]]}
        written = {key[0] for key, inode in after.items() if kept[before].get(key) != inode}
        assert same and written and max(same) < min(written), folder
    files = {f["path"] for f in theirs.metadata["tfrecord"]["files"]}
    assert files == {f["path"] for f in ours.metadata["tfrecord"]["files"]}
    for path in files:
        assert (ours.output / path).read_bytes() == (theirs.output / path).read_bytes(), path
    # Its profile read the newest day's events alone and every day's count from the state.
    _same(_profile(ours.output), _profile(theirs.output))
    after = _inodes(kept["output"])
    same = {day for key, inode in kept["inodes"].items() if after.get(key) == inode
            for day in [key[0]]}
    written = {key[0] for key, inode in after.items() if kept["inodes"].get(key) != inode}
    assert same and written >= set(NEW_DAYS)
    assert max(same) < min(written)  # every day from the earliest changed one is written
    assert not same & written
