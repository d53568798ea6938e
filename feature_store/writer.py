"""Entity snapshots into the online store in Feast's Redis layout, without Feast's per-row
Python (docs/ARCHITECTURE.md, "Publishing").

Feast's materialization turns every value into a protobuf object in Python and reads each
key's stored timestamp before writing it: ~16k keys/s. This writer produces the very same
bytes in bulk — Feast's own encoder once per distinct value (counts, ids and timestamps
repeat), a NumPy encoding for floating-point values (byte-equal to the protobuf's; tested) —
and sends one Redis command per entity in pipelines, the way redis-py writes any hash. A Lua
script compares and sets each hash in Redis, so a replace learns how many entities changed
without reading the store back. What it writes is what ``FeatureStore.get_online_features``
reads (tested against Feast's own materialization).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from feast import FeatureView
from feast.infra.key_encoding_utils import serialize_entity_key, serialize_entity_key_prefix
from feast.infra.online_stores.helpers import _mmh3
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value
from feast.type_map import python_values_to_proto_values
from feast.value_type import ValueType
from google.protobuf.timestamp_pb2 import Timestamp

# Entities per pipelined round trip.
BATCH = 10_000
# Sets the hash's fields; returns 1 when a feature value differs from the stored one (or the
# entity is new), 0 otherwise. Field names starting with "_ts:" (the view's timestamp) are
# not compared: a snapshot re-stamped with the same values is not a change.
COMPARE_AND_SET = """
local changed = 0
for i = 1, #ARGV, 2 do
  if string.sub(ARGV[i], 1, 4) ~= '_ts:' then
    if redis.call('HGET', KEYS[1], ARGV[i]) ~= ARGV[i + 1] then changed = 1 end
  end
end
redis.call('HSET', KEYS[1], unpack(ARGV))
return changed
"""
# Value.double_val (field 5, fixed64) and Value.float_val (field 6, fixed32): the tag byte.
_FIXED = {"double": (b"\x29", "<f8"), "float": (b"\x35", "<f4")}


@dataclass(frozen=True)
class Written:
    keys: int
    changed: int
    written_keys: set[bytes]


def latest_snapshots(snapshots: ds.Dataset, key: str, timestamp: str, start: datetime,
                     end: datetime) -> pa.Table:
    """Each entity's latest snapshot in [start, end], as Feast's materialization picks it."""
    column = ds.field(timestamp)
    low, high = (t.astimezone(timezone.utc).replace(tzinfo=None) for t in (start, end))
    rows = snapshots.to_table(filter=(column >= low) & (column <= high))
    if rows.num_rows == 0:
        return rows
    order = pc.sort_indices(rows, [(key, "ascending"), (timestamp, "descending")])
    rows = rows.take(order)
    keys = rows[key].combine_chunks()
    first = np.ones(len(keys), dtype=bool)
    first[1:] = pc.not_equal(keys[1:], keys[:-1]).to_numpy(zero_copy_only=False)
    return rows.filter(pa.array(first))


def _encoded_by_value(values: pa.Array, feast_type: ValueType) -> list[bytes]:
    """Feast's own encoding, once per distinct value."""
    python = values.to_pylist()
    cache: dict[Any, bytes] = {}
    for value in set(python):
        proto = (Value() if value is None
                 else python_values_to_proto_values([value], feast_type)[0])
        cache[value] = proto.SerializeToString()
    return [cache[value] for value in python]


def _encoded_fixed(values: pa.Array, kind: str) -> list[bytes]:
    """Value.double_val / float_val bytes from NumPy: a tag byte and the little-endian value;
    a missing value, or NaN (which Feast stores as missing), is the empty Value."""
    tag, dtype = _FIXED[kind]
    width = 1 + np.dtype(dtype).itemsize
    numbers = pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(dtype)
    block = np.empty((len(numbers), width), dtype=np.uint8)
    block[:, 0] = tag[0]
    block[:, 1:] = numbers.view(np.uint8).reshape(len(numbers), width - 1)
    blob = block.tobytes()
    encoded = [blob[i:i + width] for i in range(0, len(blob), width)]
    missing = np.isnan(numbers)
    if values.null_count:
        missing |= values.is_null().to_numpy(zero_copy_only=False)
    for index in np.flatnonzero(missing):
        encoded[index] = b""
    return encoded


def encode_values(column: pa.Array, feast_type: ValueType) -> list[bytes]:
    """The serialized Feast ``Value`` of each element, as Feast's materialization stores it."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if feast_type == ValueType.DOUBLE:
        return _encoded_fixed(column, "double")
    if feast_type == ValueType.FLOAT:
        return _encoded_fixed(column, "float")
    return _encoded_by_value(column, feast_type)


def encode_timestamps(column: pa.Array) -> list[bytes]:
    """The view's ``_ts:`` field: a serialized protobuf Timestamp, once per distinct time."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    micros = column.cast(pa.timestamp("us")).cast(pa.int64()).to_numpy(zero_copy_only=False)
    distinct, inverse = np.unique(micros, return_inverse=True)
    encoded = []
    for value in distinct.tolist():
        stamp = Timestamp()
        stamp.FromMicroseconds(value)
        encoded.append(stamp.SerializeToString())
    return [encoded[i] for i in inverse]


def entity_keys(join_key: str, values: pa.Array, key_type: ValueType, project: str,
                version: int) -> list[bytes]:
    """Feast's Redis key of each entity (``_redis_key``): the serialized entity key, then the
    project; string and int64 keys assembled from their parts, others through Feast."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    suffix = project.encode("utf-8")
    if version >= 3 and key_type in (ValueType.STRING, ValueType.INT64):
        prefix = serialize_entity_key_prefix([join_key], version)
        kind = struct.pack("<I", key_type.value)
        if key_type == ValueType.STRING:
            parts = (value.encode("utf8") for value in values.to_pylist())
        else:
            parts = (struct.pack("<q", value) for value in values.to_pylist())
        return [prefix + kind + struct.pack("<I", len(part)) + part + suffix for part in parts]
    field = "string_val" if key_type == ValueType.STRING else "int64_val"
    return [serialize_entity_key(EntityKey(join_keys=[join_key],
                                           entity_values=[Value(**{field: value})]),
                                 entity_key_serialization_version=version) + suffix
            for value in values.to_pylist()]


def _commands(rows: pa.Table, view: FeatureView, join_key: str, key_type: ValueType,
              project: str, version: int) -> Iterator[tuple[bytes, list[bytes]]]:
    """(Redis key, [field, value, field, value, …]) per entity."""
    keys = entity_keys(join_key, rows[join_key], key_type, project, version)
    fields = [_mmh3(f"{view.name}:{feature.name}") for feature in view.features]
    values = [encode_values(rows[feature.name], feature.dtype.to_value_type())
              for feature in view.features]
    stamp_field = f"_ts:{view.name}".encode()
    stamps = encode_timestamps(rows[view.batch_source.timestamp_field])
    for index, key in enumerate(keys):
        arguments = []
        for field, column in zip(fields, values, strict=True):
            arguments += (field, column[index])
        arguments += (stamp_field, stamps[index])
        yield key, arguments


def write_view(client: Any, rows: pa.Table, view: FeatureView, join_key: str,
               key_type: ValueType, project: str, version: int, *,
               key_ttl_seconds: int | None = None,
               progress: Callable[[int], None] | None = None) -> Written:
    """Write ``rows`` (one per entity) into ``view``'s fields; how many entities changed."""
    # Loaded on every primary of a cluster; sent by digest (cluster pipelines cannot load).
    digest = client.script_load(COMPARE_AND_SET)
    changed = written = 0
    written_keys: set[bytes] = set()
    pipe = client.pipeline(transaction=False)
    pending = 0
    for key, arguments in _commands(rows, view, join_key, key_type, project, version):
        pipe.execute_command("EVALSHA", digest, 1, key, *arguments)
        if key_ttl_seconds:
            pipe.expire(key, key_ttl_seconds)
        written_keys.add(key)
        pending += 1
        if pending == BATCH:
            changed += _changed(pipe.execute(), key_ttl_seconds)
            written += pending
            pending = 0
            if progress is not None:
                progress(written)
    if pending:
        changed += _changed(pipe.execute(), key_ttl_seconds)
        written += pending
        if progress is not None:
            progress(written)
    return Written(written, changed, written_keys)


def _changed(replies: list[Any], key_ttl_seconds: int | None) -> int:
    return int(sum(replies[::2] if key_ttl_seconds else replies))
