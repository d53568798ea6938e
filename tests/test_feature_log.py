"""The feature logger's background work: it waits for moments without requests in flight,
yet a server that is never idle still logs every request; files are written a row group
per 16 requests and published whole; a full queue drops and counts. The logger runs
in-process over hand-built answers (the API's own logging is tested end to end in
test_consistency.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from featureline.api.feature_log import BATCH_REQUESTS, Activity, FeatureLogger
from featureline.api.settings import FeatureLoggingConfig
from featureline.feature_store.online import OnlineFeatures, Status

FEATURES = {"age": ("user", pa.int64()), "price": ("item", pa.float64())}
VIEW_KEYS = {"user": "user_id", "item": "item_id"}
CANDIDATES = 3


def _answer(user: int) -> OnlineFeatures:
    return OnlineFeatures(
        names=["age", "price"],
        values={"age": [user], "price": [user + 0.5] * CANDIDATES},
        status={"age": [Status.PRESENT], "price": [Status.PRESENT] * CANDIDATES},
        timestamps={"user": [1_700_000_000], "item": [1_700_000_000] * CANDIDATES})


def _logger(path: Path, activity: Activity, **config) -> FeatureLogger:
    return FeatureLogger(FeatureLoggingConfig(path=str(path), **config), FEATURES, VIEW_KEYS,
                         lambda: ("v1", "{}"), activity)


def _log(logger: FeatureLogger, users: range) -> None:
    for user in users:
        logger.log_ranking(f"u{user}", [f"i{k}" for k in range(CANDIDATES)], _answer(user))


def _published(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*.parquet") if not p.name.startswith("."))


def test_a_server_never_idle_still_logs_every_request(tmp_path):
    activity = Activity()
    activity.started()  # a request in flight for the whole test
    logger = _logger(tmp_path, activity, roll_s=0.5)
    try:
        _log(logger, range(40))
        # Each step waits at most IDLE_WAIT_S for an idle moment that never comes: 40 adds,
        # 3 conversions of 14 columns and 3 writes, ~1 s.
        deadline = time.monotonic() + 20
        while logger.rows < 40 * (1 + CANDIDATES) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        logger.close()
    assert logger.rows == 40 * (1 + CANDIDATES) and logger.dropped == 0
    table = pq.read_table(_published(tmp_path)[0].parent)
    ages = table.filter(pc.is_valid(table["age"]))["age"].to_pylist()
    assert sorted(ages) == list(range(40))
    assert activity.in_flight == 1  # the logger only reads it


def test_work_waits_for_no_request_in_flight(tmp_path):
    activity = Activity()
    logger = _logger(tmp_path, activity, roll_s=0.2)
    try:
        activity.started()
        _log(logger, range(4 * BATCH_REQUESTS))
        # Rolls pass, but each step waits IDLE_WAIT_S first: ~120 steps take over 1 s.
        time.sleep(0.6)
        rows_while_busy = logger.rows
        activity.finished()  # the response has gone: the logger works now
        deadline = time.monotonic() + 10
        while logger.rows < 4 * BATCH_REQUESTS * (1 + CANDIDATES) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        logger.close()
    assert rows_while_busy < 4 * BATCH_REQUESTS * (1 + CANDIDATES)
    assert logger.rows == 4 * BATCH_REQUESTS * (1 + CANDIDATES)


def test_a_file_holds_a_row_group_per_sixteen_requests_and_is_published_whole(tmp_path):
    logger = _logger(tmp_path, Activity(), roll_s=3600)
    try:
        _log(logger, range(3 * BATCH_REQUESTS + 5))
        deadline = time.monotonic() + 10
        while logger.queue and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        assert _published(tmp_path) == []  # the roll has not ended: nothing published
        assert [p.name.startswith(".") for p in tmp_path.rglob("*.partial")] == [True]
    finally:
        logger.close()  # the last 5 requests, then the file, renamed
    (path,) = _published(tmp_path)
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_row_groups == 4
    assert [metadata.row_group(i).num_rows for i in range(4)] == [
        BATCH_REQUESTS * (1 + CANDIDATES)] * 3 + [5 * (1 + CANDIDATES)]
    assert not list(tmp_path.rglob("*.partial"))
    assert logger.files == 1 and logger.rows == metadata.num_rows


def test_a_full_queue_drops_and_counts(tmp_path):
    activity = Activity()
    activity.started()
    logger = _logger(tmp_path, activity, queue_requests=5, roll_s=3600)
    logger.close()  # the background thread gone: nothing drains the queue
    _log(logger, range(8))
    assert len(logger.queue) == 5 and logger.dropped == 3
