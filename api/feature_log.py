"""Feature logging: what ``/v1/features`` and ``/v1/ranking-inputs`` served, written as
Parquet for ``featureline consistency`` and ``featureline training-set --from-log``
(docs/ARCHITECTURE.md, "Feature logging").

A sample of entities is chosen by hashing the row's user id (its first join key where it has
no user): every request of a sampled entity is logged, none of the others. The request
thread only appends references to the values it already built to a bounded queue (a full
queue drops the request and counts it); a background thread turns them into Arrow columns
and writes one file per worker and roll interval, published whole (written under a hidden
name, then renamed), so a killed process leaves only whole files and loses at most the
interval it had not written.

One row per entity row served (the format: ``feature_store/feature_log.py``):
``/v1/features`` logs each row of the request (its join keys and the requested features);
``/v1/ranking-inputs`` logs the user as one row (its user features) and each candidate as one
row (the user id, the item id, its item features).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from featureline.api.settings import FeatureLoggingConfig
from featureline.core.files import write_whole
from featureline.feature_store.feature_log import (
    KEYS,
    REQUEST_COLUMNS,
    STATUS_SUFFIX,
    TIMESTAMP_SUFFIX,
    log_schema,
)
from featureline.feature_store.online import OnlineFeatures

logger = logging.getLogger("featureline.api")

_HASH_SPACE = 2.0**64


def sampled(key: Any, sample: float) -> bool:
    """Whether ``key``'s requests are logged at ``sample``: the same answer in every process."""
    if sample >= 1.0:
        return True
    digest = hashlib.blake2b(str(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _HASH_SPACE < sample


class FeatureLogger:
    """Logs served rows of a sample of entities to Parquet files under ``config.path``."""

    def __init__(self, config: FeatureLoggingConfig,
                 features: Mapping[str, tuple[str, pa.DataType]], view_keys: Mapping[str, str],
                 versions: Callable[[], tuple[str, str]]) -> None:
        assert config.path is not None
        self.config = config
        self.folder = Path(config.path)
        self.schema = log_schema(features)
        self.view_of = {name: view for name, (view, _) in features.items()}
        self.view_keys = dict(view_keys)  # view → its join key
        self.versions = versions  # () → (dataset version, embedding versions as JSON)
        self.queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(config.queue_requests)
        self.worker = f"{socket.gethostname()}-{os.getpid()}"
        self.requests = 0
        self.rows = 0
        self.dropped = 0
        self.files = 0
        self._sequence = 0
        self._thread = threading.Thread(target=self._run, name="feature-log", daemon=True)
        self._thread.start()

    # In the request thread: cheap, never blocks.

    def log(self, service: str | None, keys: Mapping[str, Sequence[Any]],
            result: OnlineFeatures) -> None:
        """A ``/v1/features`` request's sampled rows: ``keys`` (join key → id per row) and
        what the reader answered for them."""
        sampling = keys.get("user_id") or next(iter(keys.values()))
        rows = [row for row, key in enumerate(sampling) if sampled(key, self.config.sample)]
        if rows:
            self._put(("features", service, time.time(), keys, result.values, result.status,
                       result.timestamps, rows))

    def log_ranking(self, user: Any, items: Sequence[Any], result: OnlineFeatures) -> None:
        """A ranking request (``result`` read for one user and the candidates): the user's
        row and one row per candidate."""
        if not sampled(user, self.config.sample):
            return
        now = time.time()
        n = len(items)
        keys = {"user_id": [user] * (n + 1), "item_id": [None, *items]}

        def spread(column: Sequence[Any], view: str) -> list[Any]:
            if self.view_keys[view] == "user_id":  # the user's row, then the candidates'
                return [*column, *([None] * n)]
            return [None, *column]

        values = {name: spread(result.values[name], self.view_of[name]) for name in result.names}
        status = {name: spread(result.status[name], self.view_of[name]) for name in result.names}
        stamps = {view: spread(column, view) for view, column in result.timestamps.items()}
        self._put(("ranking-inputs", "ranking", now, keys, values, status, stamps, None))

    def _put(self, request: tuple[Any, ...]) -> None:
        try:
            self.queue.put_nowait(request)
        except queue.Full:
            self.dropped += 1

    # In the background thread.

    def _run(self) -> None:
        pending: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + self.config.roll_s
        while True:
            try:
                request = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                request = ()
            if request is None:  # close()
                self._write(pending)
                return
            if request:
                pending.append(request)
            if time.monotonic() >= deadline:
                self._write(pending)
                pending = []
                deadline = time.monotonic() + self.config.roll_s

    def _write(self, requests: list[tuple[Any, ...]]) -> None:
        if not requests:
            return
        self._sequence += 1
        try:
            table = self._table(requests)
            day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
            folder = self.folder / f"date={day}"
            name = f"features-{self.worker}-{int(time.time() * 1000)}-{self._sequence}.parquet"
            write_whole(folder / name, lambda path: pq.write_table(table, path))
        except Exception:  # a full disk must not take the API down: counted, logged
            logger.exception("feature logging: %d requests not written", len(requests))
            self.dropped += len(requests)
            return
        self.files += 1
        self.requests += len(requests)
        self.rows += table.num_rows

    def _table(self, requests: list[tuple[Any, ...]]) -> pa.Table:
        """Columns for the schema from the requests' own lists (extended, not copied per
        value)."""
        dataset_version, embeddings = self.versions()
        columns: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        count = 0
        for number, (endpoint, service, at, keys, values, status, stamps, rows) in enumerate(
                requests):
            n = len(next(iter(keys.values())))
            if rows is not None and len(rows) != n:
                keys, values, status, stamps = ({k: [v[r] for r in rows] for k, v in part.items()}
                                                for part in (keys, values, status, stamps))
                n = len(rows)
            request_id = f"{self.worker}-{self._sequence}-{number}"
            columns["request_id"] += [request_id] * n
            columns["request_time"] += [int(at * 1_000_000)] * n
            columns["endpoint"] += [endpoint] * n
            columns["service"] += [service] * n
            columns["dataset_version"] += [dataset_version] * n
            columns["embedding_versions"] += [embeddings] * n
            for key in KEYS:
                ids = keys.get(key)
                columns[key] += ([None] * n if ids is None
                                 else [None if i is None else str(i) for i in ids])
            for name in self.schema.names[len(REQUEST_COLUMNS) + len(KEYS):]:
                if name.endswith(TIMESTAMP_SUFFIX):
                    columns[name] += stamps.get(name[:-len(TIMESTAMP_SUFFIX)], [None] * n)
                elif name.endswith(STATUS_SUFFIX):
                    column = status.get(name[:-len(STATUS_SUFFIX)])
                    columns[name] += ([None] * n if column is None
                                      else [getattr(s, "value", s) for s in column])
                else:
                    columns[name] += values.get(name, [None] * n)
            count += n
        arrays = [pa.array(columns[f.name], pa.int64()).cast(f.type)
                  if pa.types.is_timestamp(f.type) else pa.array(columns[f.name], f.type)
                  for f in self.schema]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def close(self) -> None:
        """Write what is queued, then stop."""
        self.queue.put(None)
        self._thread.join(timeout=30)
