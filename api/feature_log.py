"""Feature logging: what ``/v1/features`` and ``/v1/ranking-inputs`` served, written as
Parquet for ``featureline consistency`` and ``featureline training-set --from-log``
(docs/ARCHITECTURE.md, "Feature logging").

A sample of entities is chosen by hashing the row's user id (its first join key where it has
no user): every request of a sampled entity is logged, none of the others. The request
thread only appends references to the values it already built to a bounded queue (a full
queue drops the request and counts it); a background thread, working while no request is
in flight, turns them into Arrow columns and writes one file per worker and roll interval,
row group by row group under a hidden name, renamed once whole, so a killed process leaves
only whole files and loses at most the interval it had not written.

One row per entity row served (the format: ``feature_store/feature_log.py``):
``/v1/features`` logs each row of the request (its join keys and the requested features);
``/v1/ranking-inputs`` logs the user as one row (its user features) and each candidate as one
row (the user id, the item id, its item features).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from featureline.api.settings import FeatureLoggingConfig
from featureline.core.files import partial_path
from featureline.feature_store.feature_log import (
    INPUT_PREFIX,
    INPUTS_CONTEXT,
    STATUS_SUFFIX,
    TIMESTAMP_SUFFIX,
    key_columns,
    log_schema,
)
from featureline.feature_store.online import OnlineFeatures

logger = logging.getLogger("featureline.api")

_HASH_SPACE = 2.0**64
# Requests turned into one Arrow record batch at a time in the background.
BATCH_REQUESTS = 16
# The endpoints whose rows are the model inputs served (``log_inputs``).
INPUT_ENDPOINTS = ("model-inputs", "rank")
# The background thread works when a response has gone and no request is in flight; it
# looks at least this often (a logger no middleware drives, a request still in flight).
POLL_S = 0.05
# Before each step of its work it waits for a moment without requests in flight, at most
# this long; with more than BACKLOG_REQUESTS queued it does not wait.
IDLE_WAIT_S = 0.01
BACKLOG_REQUESTS = 64


class Activity:
    """Requests in flight in this process, counted by the serving middleware in the event
    loop's thread: ``idle`` is set while there are none, ``answered`` when the last one
    ends (background work clears it when it wakes)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.idle = threading.Event()
        self.idle.set()
        self.answered = threading.Event()

    def started(self) -> None:
        self.in_flight += 1
        if self.in_flight == 1:
            self.idle.clear()

    def finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()
            self.answered.set()


def _request_time(result: OnlineFeatures) -> int:
    """The row's request time (µs): the one its aggregations were merged at, or now."""
    return result.at_us if result.at_us is not None else int(time.time() * 1_000_000)


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
                 versions: Callable[[], tuple[str, str]],
                 activity: Activity | None = None,
                 aggregations: tuple[Mapping[str, tuple[str, pa.DataType]],
                                     Mapping[str, Sequence[str]]] = ({}, {}),
                 inputs: Mapping[str, pa.DataType] | None = None) -> None:
        assert config.path is not None
        self.config = config
        self.folder = Path(config.path)
        grouped, group_keys = aggregations  # feature_store.feature_log.logged_aggregations
        self.schema = log_schema(features, grouped, group_keys, inputs)
        self.keys = set(key_columns(group_keys))
        self.view_of = {name: view for name, (view, _) in {**features, **grouped}.items()}
        # A view or group keyed by one column → that join key (a ranking request's rows).
        self.view_keys = {**view_keys, **{group: columns[0] for group, columns
                                          in group_keys.items() if len(columns) == 1}}
        self.versions = versions  # () → (dataset version, embedding versions as JSON)
        self.activity = activity or Activity()
        # Appended by request threads without waking the background thread (a deque's
        # append and popleft are atomic): it wakes when a response has gone.
        self.queue: deque[tuple[Any, ...]] = deque()
        self._closing = False
        self._part: _Part | None = None  # this roll's file, while it is written
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
        self._put(("features", service, _request_time(result), keys, result, rows))

    def log_ranking(self, user: Any, items: Sequence[Any], result: OnlineFeatures) -> None:
        """A ranking request (``result`` read for one user and the candidates): the user's
        row and one row per candidate."""
        if sampled(user, self.config.sample):
            self._put(("ranking-inputs", "ranking", _request_time(result), user, items,
                       result))

    def log_inputs(self, endpoint: str, user: Any, items: Sequence[Any],
                   context: Mapping[str, Any], item_context: Mapping[str, Sequence[Any]],
                   at_us: int, features: Mapping[str, Any]) -> None:
        """A model-inputs request's rows (``/v1/model-inputs``, ``/v1/rank``): one per
        candidate, its features as served."""
        if sampled(user, self.config.sample):
            self._put((endpoint, None, at_us, user, items, context, item_context, features,
                       time.time()))

    def _put(self, request: tuple[Any, ...]) -> None:
        if len(self.queue) >= self.config.queue_requests:
            self.dropped += 1
        else:
            self.queue.append(request)

    # In the background thread: requests' values are appended to Python lists per column
    # (C-speed extends), turned into a record batch every BATCH_REQUESTS requests (Arrow,
    # one call per column) and written as one row group (Parquet writes without the GIL).
    # Each step waits for a moment when no request is in flight, then hands the GIL over
    # (a thread wanting it back would otherwise wait up to the interpreter's 5 ms switch
    # interval): a request meets this work only when it arrives during one step
    # (docs/ARCHITECTURE.md, "Feature logging").

    def _step(self) -> None:
        """Before one step of background work: a moment without requests, unless a backlog
        is waiting."""
        if len(self.queue) <= BACKLOG_REQUESTS:
            self.activity.idle.wait(IDLE_WAIT_S)
        time.sleep(0)

    def _run(self) -> None:
        _lowest_priority()
        columns = self._empty()
        pending = 0
        versions = self.versions()
        deadline = time.monotonic() + self.config.roll_s
        while True:
            if not self.queue and not self._closing:
                self.activity.answered.wait(min(POLL_S, max(0.0, deadline - time.monotonic())))
                self.activity.answered.clear()
            request = self.queue.popleft() if self.queue else ()
            closing = self._closing and not self.queue
            if request:
                self._step()
                before = len(columns["request_id"])
                try:
                    self._add(columns, request, versions)
                    pending += 1
                except Exception:  # a request this code cannot lay out: counted, logged
                    logger.exception("feature logging: a request not logged")
                    self.dropped += 1
                    for column in columns.values():  # without its partial rows
                        del column[before:]
            rolling = closing or time.monotonic() >= deadline
            if pending and (pending >= BATCH_REQUESTS or rolling):
                try:
                    batch = self._convert(columns)
                except Exception:  # a value of a type the schema does not take
                    logger.exception("feature logging: %d requests not logged", pending)
                    self.dropped += pending
                else:
                    self._write(batch, pending)
                columns, pending = self._empty(), 0
            if rolling:
                self._publish()
                if closing:
                    return
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

            # The views' features and the aggregations keyed by the user or the item.
            logged = [name for name in result.names if self.view_of.get(name) in self.view_keys]
            values = {name: spread(result.values[name], self.view_of[name]) for name in logged}
            status = {name: spread(result.status[name], self.view_of[name]) for name in logged}
            stamps = {view: spread(column, view) for view, column in result.timestamps.items()}
        elif endpoint in INPUT_ENDPOINTS:
            user, items, context, item_context, features, served_at = request[3:]
            n = len(items)
            keys = {"user_id": [user] * n, "item_id": list(items)}
            values = {f"{INPUT_PREFIX}{name}": np.asarray(column).tolist()
                      for name, column in features.items()}
            values[INPUTS_CONTEXT] = [orjson.dumps({
                "context": context, "served_at": served_at,
                "item_context": {column: row[i] for column, row in item_context.items()},
            }).decode() for i in range(n)]
            status, stamps = {}, {}
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
                     "request_time": at, "endpoint": endpoint,
                     "service": service, "dataset_version": versions[0],
                     "embedding_versions": versions[1]}
        missing = [None] * n
        for name, column in columns.items():
            if name in constants:
                column += [constants[name]] * n
            elif name in self.keys:
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
            elif field.name in self.keys:  # ids of any type, as text
                array = pa.array(values).cast(pa.string())
            else:  # a status is a str (Status is a str enum)
                array = pa.array(values, field.type)
            arrays.append(array)
            self._step()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _write(self, batch: pa.RecordBatch, requests: int) -> None:
        """Append ``batch`` to this roll's file (opened by the first) as one row group: the
        Parquet work in steps of ~1 ms, not one burst at the end of the roll (the conversion's
        last step waited for an idle moment)."""
        try:
            if self._part is None:
                self._sequence += 1
                day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
                name = (f"features-{self.worker}-{int(time.time() * 1000)}-"
                        f"{self._sequence}.parquet")
                self._part = _Part(self.folder / f"date={day}" / name, self.schema)
            self._part.write(pa.Table.from_batches([batch], schema=self.schema), requests)
        except OSError:  # a full disk must not take the API down: counted, logged
            self._fail(requests)

    def _publish(self) -> None:
        """This roll's file, renamed to its published name."""
        if self._part is None:
            return
        part, self._part = self._part, None
        try:
            part.publish()
        except OSError:
            self._part = part
            self._fail(0)
            return
        self.files += 1
        self.rows += part.rows

    def _fail(self, requests: int) -> None:
        lost = requests + (self._part.requests if self._part is not None else 0)
        logger.exception("feature logging: %d requests not written", lost)
        self.dropped += lost
        if self._part is not None:
            self._part.discard()
            self._part = None

    def close(self) -> None:
        """Write what is queued, then stop."""
        self._closing = True
        self.activity.answered.set()
        self._thread.join(timeout=30)


def _lowest_priority() -> None:
    """The calling thread's CPU priority lowered to the least (Linux: nice is per thread),
    so that a core both want goes to request threads; elsewhere nothing changes."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class _Part:
    """One roll's file, written a row group at a time under a hidden name beside its
    published one and renamed onto it whole at the end of the roll."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.partial = partial_path(path)
        self.writer = pq.ParquetWriter(self.partial, schema)
        self.rows = self.requests = 0

    def write(self, table: pa.Table, requests: int) -> None:
        self.writer.write_table(table)
        self.rows += table.num_rows
        self.requests += requests

    def publish(self) -> None:
        self.writer.close()
        os.replace(self.partial, self.path)

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()
        self.partial.unlink(missing_ok=True)
