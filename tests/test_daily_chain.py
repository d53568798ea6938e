"""A log run day by day as the daily chain runs it: incremental days keeping the output's fit
between scheduled refits equal full runs over the same days with the same fit, and leave the
earlier days' files as they were (docs/ARCHITECTURE.md, "Incremental runs")."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from featureline.core.metadata import OOV_ID
from featureline.etl import job
from featureline.etl.incremental import read_state
from tests.job_config import make_config
from tests.test_incremental import _inodes, _profile, _same, _table

# The entity tables' window: 2 days (hourly hops), so a day's run reads 4 days of events
# and starts from the lifetime partials of the days before them.
ENTITIES = {"recent_days": 2}
# A refit when the fit's training split ended 3 days or more before the run's.
FIT = {"refit_every": "3d"}


def _days(log: Path, folder: Path) -> list[Path]:
    """The log as a raw file per UTC day, in order (a line without a readable day, or with
    one of a few lines only — the log's broken ones —, goes with the first day)."""
    days: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        try:
            day = str(json.loads(line)["ts"])[:10]
        except (ValueError, KeyError, TypeError):
            day = ""
        days.setdefault(day, []).append(line)
    undated = [line for day in [d for d in days if len(days[d]) < 100]
               for line in days.pop(day)]
    folder.mkdir()
    paths = []
    for index, day in enumerate(sorted(days)):
        path = folder / f"events-{day}.jsonl"
        path.write_text("\n".join([*days[day], *(undated if index == 0 else [])]) + "\n")
        paths.append(path)
    return paths


def _run(root: Path, name: str, sources: list[Path], spark, **overrides):
    """A full run over ``sources`` (linked into a folder of their own) into ``root/name``."""
    folder = root / f"{name}-raw"
    folder.mkdir()
    for source in sources:
        (folder / source.name).symlink_to(source)
    config = make_config(root / name, folder, entities=ENTITIES, **overrides)
    return job.run(config, spark, progress=lambda _: None)


def _entity_inodes(output: Path) -> dict[str, int]:
    return {str(path.relative_to(output)): path.stat().st_ino
            for path in (output / "entities").rglob("*.parquet")}


@pytest.fixture(scope="module")
def chain(spark, small_log, tmp_path_factory):
    """Days 1–2 by a full run (the first fit), then a run per day keeping that fit (day 5
    refits: its fit is 3 days old); the outputs after days 3, 4 and 5 copied, the entity
    tables' inodes and the examples' and TFRecords' before and after each day."""
    root = tmp_path_factory.mktemp("chain")
    days = _days(small_log, root / "raw")
    first = _run(root, "out", days[:2], spark, fit=FIT)
    config = make_config(root / "out", days[0], entities=ENTITIES, fit=FIT)
    output = first.output
    copies: dict[int, Path] = {}
    results, inodes, example_inodes = {2: first}, {}, {}
    for number in range(3, len(days) + 1):
        before, examples_before = _entity_inodes(output), _inodes(output)
        results[number] = job.run(config.model_copy(update={
            "mode": "incremental",
            "source": config.source.model_copy(update={"path": str(days[number - 1])})}),
            spark, progress=lambda _: None)
        inodes[number] = (before, _entity_inodes(output))
        example_inodes[number] = (examples_before, _inodes(output))
        if number in (3, 4, 5):
            copies[number] = root / f"after-{number}"
            shutil.copytree(output, copies[number])
    return {"root": root, "days": days, "results": results, "copies": copies,
            "inodes": inodes, "example_inodes": example_inodes, "output": output}


@pytest.fixture(scope="module")
def full(chain, spark):
    """Full runs over days 1–4 and over every day, each transforming with the fit of the
    output the chain's day extended (day 3's: the first fit, its vocabularies extended as the
    chain extended them; day 5's: the refit)."""
    days, copies = chain["days"], chain["copies"]
    return {4: _run(chain["root"], "full-4", days[:4], spark,
                    fit={"from_output": str(copies[3])}),
            len(days): _run(chain["root"], "full-last", days, spark,
                            fit={"from_output": str(copies[5])})}


@pytest.mark.slow
def test_the_chain_keeps_fits_between_refits(chain):
    results = chain["results"]
    fits = {number: result.metadata["fit"]["version"] for number, result in results.items()}
    assert fits[3] == fits[4] == fits[2]
    assert fits[5] != fits[4] and fits[6] == fits[5]


@pytest.mark.slow
@pytest.mark.parametrize("day", [4, 6])
def test_a_kept_day_equals_the_full_run_with_its_fit(chain, full, day):
    """Row for row (the entity tables, their lifetime tiles and the examples) and TFRecord
    byte for byte: day 4 read the lifetime partials day 3 wrote, day 6 those of the refit."""
    ours = chain["copies"].get(day, chain["output"])
    theirs = full[day].output
    for table in ("examples", "entities/user", "entities/item", "tiles/user/user_events",
                  "tiles/user/user_positive_rate", "tiles/item/item_events_2d",
                  "state/entity_rows/user", "state/entity_rows/item"):
        assert _table(ours / table).to_pylist() == _table(theirs / table).to_pylist(), table
    files = {f["path"] for f in full[day].metadata["tfrecord"]["files"]}
    for path in files:
        assert (ours / path).read_bytes() == (theirs / path).read_bytes(), path
    _same(_profile(ours), _profile(theirs))


@pytest.mark.slow
def test_a_kept_day_writes_only_the_entity_days_it_changes(chain):
    """The entity tables' files of the days before the run's are the previous output's (the
    same inodes), every later one written; the lifetime partials the next day starts from
    hold the days before its window."""
    output = chain["output"]
    for number in (3, 4, 6):
        before, after = chain["inodes"][number]
        for entity in ("user", "item"):
            days = {path: Path(path).name[:10] for path in after if f"/{entity}/" in path}
            kept = {day for path, day in days.items() if before.get(path) == after[path]}
            written = set(days.values()) - kept
            assert kept and written, (number, entity)
            assert max(kept) < min(written), (number, entity)
    # Each key's lifetime count is its events before where the partials end.
    state = read_state(output)
    events = pq.read_table(output / "state" / "events").to_pylist()
    for entity, key in (("user", "user_id"), ("item", "item_id")):
        before = datetime.fromtimestamp(state.lifetimes[entity] / 1e6, timezone.utc).replace(
            tzinfo=None)  # the table's naive UTC times
        counts = Counter(event[key] for event in events if event["ts"] < before)
        lifetime = pq.read_table(output / "state" / "lifetime" / entity).to_pylist()
        assert counts and {row[key]: row[f"{entity}__{entity}_events__n"]
                           for row in lifetime} == counts


@pytest.mark.slow
def test_a_kept_fit_numbers_a_value_when_it_first_sees_it(chain):
    """Day 3 kept the fit and numbered every value it held, its validation day's too (day 2
    was a new fit's validation day: its new values are numbered then, and its files written
    again), so day 4 writes its own day's examples and TFRecords only: day 3's, training
    rows now, keep their files (the same inodes). No user or item of the output is OOV."""
    day = {number: path.name.removeprefix("events-").removesuffix(".jsonl")
           for number, path in enumerate(chain["days"], start=1)}
    for number, days in ((3, {day[2], day[3]}), (4, {day[4]})):
        before, after = chain["example_inodes"][number]
        written = {key[0] for key, inode in after.items() if before.get(key) != inode}
        assert written == days, number
    examples = pq.read_table(chain["copies"][4] / "examples",
                             columns=["user_id_cat", "item_id_cat"]).to_pydict()
    assert all(ids and OOV_ID not in ids for ids in examples.values())


def _files(output: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``output``: its inode and bytes, by path."""
    return {str(path.relative_to(output)): (path.stat().st_ino, path.read_bytes())
            for path in output.rglob("*") if path.is_file()}


def _day_run(chain: dict, output: Path, day: int, spark):
    """The chain's run of ``day`` on ``output`` (a copy of one of its outputs)."""
    config = make_config(output.parent, chain["days"][day - 1], entities=ENTITIES, fit=FIT)
    return job.run(config.model_copy(update={"mode": "incremental"}), spark,
                   progress=lambda _: None)


@pytest.mark.slow
def test_a_killed_kept_day_leaves_the_previous_output_whole(chain, spark, tmp_path,
                                                           monkeypatch):
    """Killed as it writes the state, its last step — after every earlier day's file was
    linked into the new output —, day 4's run leaves day 3's output as it was: every file,
    its bytes and its inode; nothing of the run (its staging folder) is left beside it."""
    output = tmp_path / "out"
    shutil.copytree(chain["copies"][3], output)
    before = _files(output)

    def killed(*_args, **_kwargs):
        raise RuntimeError("killed while writing the state")

    monkeypatch.setattr(job, "write_state", killed)
    with pytest.raises(RuntimeError, match="killed"):
        _day_run(chain, output, 4, spark)
    assert _files(output) == before
    assert {path.name for path in tmp_path.iterdir()} == {"out", ".out.lock"}  # the lock stays


@pytest.mark.slow
def test_a_kept_day_run_twice_changes_nothing(chain, spark, tmp_path):
    """The last day's file again, on the output it made: every event a duplicate, the fit
    kept; every example, TFRecord, entity table and stored event file is the one before (the
    same inode: linked, not written) and every table written anew holds the same rows."""
    output = tmp_path / "out"
    shutil.copytree(chain["output"], output)
    before = _files(output)
    last = chain["results"][len(chain["days"])].metadata
    again = _day_run(chain, output, len(chain["days"]), spark)
    rows = again.metadata["rows"]["this_run"]
    assert rows["accepted"] == 0
    assert rows["duplicates"] == last["rows"]["this_run"]["accepted"] + last["rows"][
        "this_run"]["duplicates"]
    assert {**again.metadata["fit"], "from": None} == {**last["fit"], "from": None}
    after = _files(output)
    for folder in ("examples", "tfrecord", "entities", "state/events", "state/entity_rows"):
        ours = {path: inode for path, (inode, _) in after.items() if path.startswith(folder)
                and not Path(path).name.startswith((".", "_"))}  # Spark's checksums, markers
        assert ours and ours == {path: before.get(path, (0, b""))[0] for path in ours}, folder
    for table in ("artifacts/categorify/item_id", "artifacts/target_encode/item_id",
                  "tiles/user/user_events", "state/lifetime/user", "state/lifetime/item"):
        assert _table(output / table).equals(_table(chain["output"] / table)), table
