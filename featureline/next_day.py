"""The demo's next day: the log's last day is held back from the first run. The API serves
the model's input of one of that day's impressions at its own time; the day's run
(``etl run --incremental``) then writes the impression's TFRecord row, and the demo prints
the two side by side (docs/ARCHITECTURE.md, "Model inputs")."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from featureline.core.events import matcher, micros_of, parse_rule, parse_timestamp
from featureline.core.metadata import Metadata, read_metadata
from featureline.etl.config import EtlConfig
from featureline.etl.datagen import last_day_apart
from featureline.etl.tfrecord.reader import layout
from featureline.etl.tfrecord.records import read_file

# How close a served float is to the written one: float32 values, computed in two engines.
REL_TOL = 1e-6


@dataclass
class NextDay:
    """The held-back day's raw events; once asked, the impression and what the API served
    for it (``/v1/model-inputs``' answer)."""

    path: Path
    day: str
    event: dict[str, Any] | None = None
    served: dict[str, Any] | None = None


def hold_out(raw: Path) -> NextDay:
    """``raw`` without its last UTC day, which moves to ``<stem>-<day><suffix>`` beside it."""
    whole = raw.replace(raw.with_name(f"{raw.stem}-whole{raw.suffix}"))
    held = raw.with_name(f"{raw.stem}-held{raw.suffix}")
    day = last_day_apart(whole, raw, held)
    whole.unlink()
    return NextDay(held.replace(raw.with_name(f"{raw.stem}-{day}{raw.suffix}")), day)


def _at(event: dict[str, Any], metadata: Metadata) -> datetime | None:
    """The event's time as the ETL reads it (None: no time it accepts)."""
    unit = metadata.events.ts_unit if metadata.events else "auto"
    return None if event.get("ts") is None else parse_timestamp(str(event["ts"]), unit)


def _numbers_ok(event: dict[str, Any], columns: list[str]) -> bool:
    return all(event.get(c) is None or (isinstance(event[c], int | float)
                                         and math.isfinite(event[c])) for c in columns)


def first_impression(day: NextDay, output: Path, metadata: Metadata, etl: EtlConfig
                     ) -> dict[str, Any]:
    """The day's first impression (an example: ``etl.label``'s ``of``, or any event) whose
    user and item the published output (``metadata``) knows and have no earlier event that
    day: its served row reads the published tiles alone, nothing of the day pushed before
    it."""
    assert metadata.events is not None
    known = {entity: set(pq.read_table(output / table.path, columns=[table.join_key])
                         .column(0).to_pylist())
             for entity, table in metadata.entities.items()}
    join = etl.label_join
    example = ((lambda _: True) if join is None
               else matcher(parse_rule(str(join.of)), metadata.events))
    numeric = ["value", *metadata.events.continuous]
    request = _request_columns(metadata)
    events = []
    for line in day.path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        at = _at(event, metadata) if isinstance(event, dict) else None
        if at is not None and event.get("user_id") and event.get("item_id"):
            events.append((at, event))
    events.sort(key=lambda pair: pair[0])
    seen: set[tuple[str, str]] = set()
    for _, event in events:
        user, item = str(event["user_id"]), str(event["item_id"])
        if (("user", user) not in seen and ("item", item) not in seen
                and user in known["user"] and item in known["item"] and example(event)
                and _numbers_ok(event, numeric)
                and all(event.get(c) is not None for c in request)):
            return event
        seen.update({("user", user), ("item", item)})
    raise RuntimeError(f"{day.path}: no impression of a known user and item without an "
                       f"earlier event of theirs that day")


def _request_columns(metadata: Metadata) -> list[str]:
    roles = metadata.events.roles if metadata.events else {}
    return [column for column, role in roles.items() if role == "request"]


def model_inputs_body(event: dict[str, Any], metadata: Metadata) -> dict[str, Any]:
    """``/v1/model-inputs`` for ``event`` at its own time: its user, item and request
    columns (the item's attributes served from the published output)."""
    return {"user_id": str(event["user_id"]), "item_ids": [str(event["item_id"])],
            "context": {c: event[c] for c in _request_columns(metadata)},
            "at": event["ts"]}


def ask(day: NextDay, base: str, output: Path, etl: EtlConfig,
        call: Callable[[str, str, str, dict[str, Any]], tuple[int, str]],
        echo: Callable[[str], None]) -> None:
    """The model's input of the day's first impression, asked at its own time before the
    day's run (``call``: the demo's HTTP call)."""
    metadata = read_metadata(output)
    day.event = first_impression(day, output, metadata, etl)
    body = model_inputs_body(day.event, metadata)
    status, text = call(base, "POST", "/v1/model-inputs", body)
    if status != 200:
        raise RuntimeError(f"POST /v1/model-inputs answered {status}: {text[:500]}")
    day.served = json.loads(text)
    echo(f"the next day's first impression, {day.event['user_id']} × {day.event['item_id']} "
         f"at {day.event['ts']}: its model input asked of the API now, before the day's run")


def written_row(output: Path, event: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
    """The TFRecord row the output holds for ``event``: its file, its index there and its
    values by feature — found by the examples' row of the event's user, item and time."""
    metadata = read_metadata(output)
    at = _at(event, metadata)
    assert at is not None
    table = ds.dataset(output / "examples", format="parquet", partitioning="hive").to_table(
        filter=(ds.field("user_id") == str(event["user_id"]))
        & (ds.field("item_id") == str(event["item_id"])))
    rows = [row for row in table.to_pylist()
            if micros_of(row["ts"].replace(tzinfo=timezone.utc)) == micros_of(at)]
    if len(rows) != 1:
        raise RuntimeError(f"the day's run wrote {len(rows)} examples for {event} (one "
                           f"expected)")
    example = rows[0]
    groups, section = layout(metadata)
    day = at.strftime("%Y-%m-%d")
    for file in section.files:
        if file.day != day:
            continue
        columns = read_file(output / file.path, groups, section.compression)
        names = [name for name in columns if name in example]
        match = np.ones(len(columns[names[0]]), dtype=bool)
        for name in names:
            expected = np.asarray(example[name])
            values = columns[name]
            match &= (values == expected).reshape(len(values), -1).all(axis=1)
        for index in np.flatnonzero(match):
            return file.path, int(index), {name: columns[name][index] for name in names}
    raise RuntimeError(f"no TFRecord row of {day} holds the example of {event}")


def _same(served: Any, written: Any) -> bool:
    served, written = np.asarray(served), np.asarray(written)
    if written.dtype.kind == "f":
        return bool(np.allclose(served, written, rtol=REL_TOL, atol=REL_TOL))
    return bool(np.array_equal(served, written))


def _shown(value: Any) -> str:
    value = np.asarray(value)
    if value.ndim:
        return json.dumps(value.tolist(), separators=(",", ":"))
    return f"{value:.6g}" if value.dtype.kind == "f" else str(value)


def show_rows(day: NextDay, output: Path, echo: Callable[[str], None]) -> None:
    """The served row beside the written one, feature by feature; a difference stops the
    demo (RuntimeError naming the features)."""
    assert day.event is not None and day.served is not None
    path, index, written = written_row(output, day.event)
    served = {name: values[0] for name, values in day.served["features"].items()}
    echo(f"the model's input served for {day.event['user_id']} × {day.event['item_id']} at "
         f"{day.event['ts']}, before the day's run, beside the row the run wrote "
         f"({path}, row {index}):")
    shown = [name for name in written if name in served]
    differ = [name for name in shown if not _same(served[name], written[name])]
    width = max(map(len, written))
    echo(f"  {'feature':<{width}}  {'served':>14}  {'written':>14}")
    for name in shown:
        echo(f"  {name:<{width}}  {_shown(served[name]):>14}  {_shown(written[name]):>14}")
    if differ:
        raise RuntimeError(f"the served row differs from the written one in {differ}")
    echo(f"  {len(shown)} features equal (ids exact, floats within {REL_TOL:g})")
