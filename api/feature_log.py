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
    STATUS_SUFFIX,
    TIMESTAMP_SUFFIX,
    log_schema,
)
from featureline.feature_store.online import OnlineFeatures

logger = logging.getLogger("featureline.api")

_HASH_SPACE = 2.0**64
# Requests turned into one Arrow record batch at a time in the background.
BATCH_REQUESTS = 16


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
        self.rows = 0
        self.dropped = 0
        self.files = 0
        self._sequence = 0
        self._number = 0
        self._thread = threading.Thread(target=self._run, name="feature-log", daemon=True)
        self._thread.start()

    # In the request thread: a tuple of references to what the request built, queued.

    def log(self, service: str | None, keys: Mapping[str, Sequence[Any]],
            result: OnlineFeatures) -> None:
        """A ``/v1/features`` request's sampled rows: ``keys`` (join key → id per row) and
        what the reader answered for them."""
        rows = None
        if self.config.sample < 1.0:
            sampling = keys.get("user_id") or next(iter(keys.values()))
            rows = [row for row, key in enumerate(sampling) if sampled(key, self.config.sample)]
            if not rows:
                return
        self._put(("features", service, time.time(), keys, result, rows))

    def log_ranking(self, user: Any, items: Sequence[Any], result: OnlineFeatures) -> None:
        """A ranking request (``result`` read for one user and the candidates): the user's
        row and one row per candidate."""
        if sampled(user, self.config.sample):
            self._put(("ranking-inputs", "ranking", time.time(), user, items, result))

    def _put(self, request: tuple[Any, ...]) -> None:
        try:
            self.queue.put_nowait(request)
        except queue.Full:
            self.dropped += 1

    # In the background thread: requests' values are appended to Python lists per column
    # (C-speed extends), turned into a record batch every BATCH_REQUESTS requests (Arrow,
    # one call per column, the GIL handed over between columns: a request thread waiting
    # for it would otherwise wait up to the interpreter's 5 ms switch interval), the batches
    # written as one file per roll (Parquet writes without the GIL).

    def _run(self) -> None:
        columns = self._empty()
        batches: list[pa.RecordBatch] = []
        requests = pending = 0
        versions = self.versions()
        deadline = time.monotonic() + self.config.roll_s
        while True:
            try:
                request = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                request = ()
            closing = request is None
            if request:
                before = len(columns["request_id"])
                try:
                    self._add(columns, request, versions)
                    pending += 1
                except Exception:  # a request this code cannot lay out: counted, logged
                    logger.exception("feature logging: a request not logged")
                    self.dropped += 1
                    for column in columns.values():  # without its partial rows
                        del column[before:]
            if pending and (pending >= BATCH_REQUESTS or closing
                            or time.monotonic() >= deadline):
                try:
                    batches.append(self._convert(columns))
                    requests += pending
                except Exception:  # a value of a type the schema does not take
                    logger.exception("feature logging: %d requests not logged", pending)
                    self.dropped += pending
                columns, pending = self._empty(), 0
            if closing or time.monotonic() >= deadline:
                self._write(batches, requests)
                if closing:
                    return
                batches, requests = [], 0
                versions = self.versions()
                deadline = time.monotonic() + self.config.roll_s

    def _empty(self) -> dict[str, list[Any]]:
        return {name: [] for name in self.schema.names}

    def _add(self, columns: dict[str, list[Any]], request: tuple[Any, ...],
             versions: tuple[str, str]) -> None:
        """Append one request's rows to ``columns``."""
        endpoint, service, at = request[:3]
        if endpoint == "ranking-inputs":
            user, items, result = request[3:]
            n = len(items) + 1
            keys = {"user_id": [user] * n, "item_id": [None, *items]}
            nothing = [None] * (n - 1)

            def spread(column: Sequence[Any], view: str) -> list[Any]:
                if self.view_keys[view] == "user_id":  # the user's row, then the candidates'
                    return [*column, *nothing]
                return [None, *column]

            values = {name: spread(result.values[name], self.view_of[name])
                      for name in result.names}
            status = {name: spread(result.status[name], self.view_of[name])
                      for name in result.names}
            stamps = {view: spread(column, view) for view, column in result.timestamps.items()}
        else:
            keys, result, rows = request[3:]
            values, status, stamps = result.values, result.status, result.timestamps
            if rows is not None:
                keys, values, status, stamps = (
                    {k: [v[r] for r in rows] for k, v in part.items()}
                    for part in (keys, values, status, stamps))
            n = len(next(iter(keys.values())))
        self._number += 1
        constants = {"request_id": f"{self.worker}-{self._number}",
                     "request_time": int(at * 1_000_000), "endpoint": endpoint,
                     "service": service, "dataset_version": versions[0],
                     "embedding_versions": versions[1]}
        missing = [None] * n
        for name, column in columns.items():
            if name in constants:
                column += [constants[name]] * n
            elif name in KEYS:
                column += keys.get(name, missing)
            elif name.endswith(TIMESTAMP_SUFFIX):
                column += stamps.get(name[:-len(TIMESTAMP_SUFFIX)], missing)
            elif name.endswith(STATUS_SUFFIX):
                column += status.get(name[:-len(STATUS_SUFFIX)], missing)
            else:
                column += values.get(name, missing)

    def _convert(self, columns: dict[str, list[Any]]) -> pa.RecordBatch:
        arrays = []
        for field in self.schema:
            values = columns[field.name]
            if pa.types.is_timestamp(field.type):  # Unix seconds, or µs (request_time)
                array = pa.array(values, pa.int64()).cast(field.type)
            elif field.name in KEYS:  # ids of any type, as text
                array = pa.array(values).cast(pa.string())
            else:  # a status is a str (Status is a str enum)
                array = pa.array(values, field.type)
            arrays.append(array)
            time.sleep(0)  # lets a request thread waiting for the GIL take it now
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _write(self, batches: list[pa.RecordBatch], requests: int) -> None:
        if not batches:
            return
        self._sequence += 1
        table = pa.Table.from_batches(batches, schema=self.schema)
        day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        name = f"features-{self.worker}-{int(time.time() * 1000)}-{self._sequence}.parquet"
        try:
            write_whole(self.folder / f"date={day}" / name,
                        lambda path: pq.write_table(table, path))
        except OSError:  # a full disk must not take the API down: counted, logged
            logger.exception("feature logging: %d requests not written", requests)
            self.dropped += requests
            return
        self.files += 1
        self.rows += table.num_rows

    def close(self) -> None:
        """Write what is queued, then stop."""
        self.queue.put(None)
        self._thread.join(timeout=30)
