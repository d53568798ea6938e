"""Entity snapshots encoded in Feast's Redis layout, without Feast's per-row Python: the keys
and bytes every online store backend writes (docs/ARCHITECTURE.md, "Publishing").

Feast's materialization turns every value into a protobuf object in Python and reads each
key's stored timestamp before writing it: ~16k keys/s. This writer produces the very same
bytes in bulk — NumPy encodings of integer and floating-point values, Feast's own converter
once per distinct value for the other types, timestamps once per distinct time (byte-equal
to the protobufs; tested). The Redis backend (``feature_store/redis_store.py``) writes them;
what it writes is what ``FeatureStore.get_online_features`` reads (tested byte for byte
against Feast's own materialization).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import orjson
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

# Entity vectors: ``<prefix><project>:<generation>:<view>:<Feast's key of the entity>``.
VECTOR_PREFIX = "featureline:vector:"
# Rows encoded at a time.
SLICE = 100_000
# Value.double_val (field 5, fixed64) and Value.float_val (field 6, fixed32): the tag byte.
_FIXED = {"double": (b"\x29", "<f8"), "float": (b"\x35", "<f4")}
# Value.int32_val (field 3) and Value.int64_val (field 4), varints: the tag byte.
_VARINT_TAGS = {ValueType.INT32: 0x18, ValueType.INT64: 0x20}


@dataclass(frozen=True)
class Written:
    keys: int
    changed: int
    written_keys: set[bytes]


@dataclass(frozen=True)
class Layout:
    """Where and how one feature view's values are written: plain data, so that Spark tasks
    can carry it."""

    view: str
    join_key: str
    key_type: ValueType
    features: tuple[tuple[str, ValueType], ...]
    timestamp_field: str
    project: str
    key_version: int
    key_ttl_seconds: int | None = None

    @classmethod
    def of(cls, view: FeatureView, join_key: str, key_type: ValueType, project: str,
           key_version: int, key_ttl_seconds: int | None = None) -> Layout:
        assert view.batch_source is not None  # every view is defined over an entity table
        return cls(view.name, join_key, key_type,
                   tuple((f.name, f.dtype.to_value_type()) for f in view.features),
                   view.batch_source.timestamp_field, project, key_version, key_ttl_seconds)


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


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array, whether a table's column comes in chunks or not."""
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _sliced(block: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """Row i of ``block`` cut to ``lengths[i]`` bytes, as one bytes object each."""
    if len(lengths) == 0:
        return []
    keep = np.arange(block.shape[1]) < lengths[:, None]
    blob = block[keep].tobytes()
    ends = np.cumsum(lengths).tolist()
    return [blob[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


def _encoded_by_value(values: pa.Array, feast_type: ValueType) -> list[bytes]:
    """Feast's own encoding, once per distinct value (one call of its converter)."""
    python = values.to_pylist()
    distinct = list(set(python))
    present = [v for v in distinct if v is not None]
    cache: dict[Any, bytes] = {None: Value().SerializeToString()}
    protos = python_values_to_proto_values(present, feast_type) if present else []
    cache.update(zip(present, (p.SerializeToString() for p in protos), strict=True))
    return [cache[value] for value in python]


def _encoded_varint(values: pa.Array, tag: int) -> list[bytes]:
    """Value.int64_val / int32_val bytes: the tag byte and the value as a base-128 varint of
    its 64-bit two's complement (a negative int32 is sign-extended, as protobuf does); a
    missing value is the empty Value."""
    numbers = pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    unsigned = numbers.view(np.uint64)
    groups = np.stack([(unsigned >> np.uint64(7 * i)) & np.uint64(0x7F) for i in range(10)],
                      axis=1).astype(np.uint8)
    used = 1 + sum(((unsigned >> np.uint64(7 * i)) > 0).astype(np.int64) for i in range(1, 10))
    more = np.arange(10) < (used - 1)[:, None]
    block = np.empty((len(numbers), 11), dtype=np.uint8)
    block[:, 0] = tag
    block[:, 1:] = groups | (more.astype(np.uint8) << 7)
    lengths = 1 + used
    if values.null_count:
        lengths[values.is_null().to_numpy(zero_copy_only=False)] = 0
    return _sliced(block, lengths)


def _encoded_fixed(values: pa.Array, kind: str) -> list[bytes]:
    """Value.double_val / float_val bytes from NumPy: a tag byte and the little-endian value;
    a missing value, or NaN (which Feast stores as missing), is the empty Value."""
    tag, dtype = _FIXED[kind]
    width = 1 + np.dtype(dtype).itemsize
    numbers = pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(dtype)
    block = np.empty((len(numbers), width), dtype=np.uint8)
    block[:, 0] = tag[0]
    block[:, 1:] = numbers.view(np.uint8).reshape(len(numbers), width - 1)
    lengths = np.full(len(numbers), width, dtype=np.int64)
    missing = np.isnan(numbers)
    if values.null_count:
        missing |= values.is_null().to_numpy(zero_copy_only=False)
    lengths[missing] = 0
    return _sliced(block, lengths)


def encode_values(column: pa.Array, feast_type: ValueType) -> list[bytes]:
    """The serialized Feast ``Value`` of each element, as Feast's materialization stores it."""
    column = _array(column)
    if feast_type == ValueType.DOUBLE:
        return _encoded_fixed(column, "double")
    if feast_type == ValueType.FLOAT:
        return _encoded_fixed(column, "float")
    if feast_type in _VARINT_TAGS:
        return _encoded_varint(column, _VARINT_TAGS[feast_type])
    return _encoded_by_value(column, feast_type)


def encode_timestamps(column: pa.Array) -> list[bytes]:
    """The view's ``_ts:`` field: a serialized protobuf Timestamp, once per distinct time."""
    column = _array(column)
    micros = column.cast(pa.timestamp("us")).cast(pa.int64()).to_numpy(zero_copy_only=False)
    distinct, inverse = np.unique(micros, return_inverse=True)
    encoded = []
    for value in distinct.tolist():
        stamp = Timestamp()
        stamp.FromMicroseconds(value)
        encoded.append(stamp.SerializeToString())
    return [encoded[i] for i in inverse]


def entity_keys(join_key: str, values: pa.Array | list[Any], key_type: ValueType,
                project: str, version: int) -> list[bytes]:
    """Feast's Redis key of each entity (``_redis_key``): the serialized entity key, then the
    project; string and int64 keys assembled from their parts, others through Feast.
    ``values``: an Arrow column, or a list of ids of the key's Python type (str, int)."""
    if not isinstance(values, list):
        values = _array(values).to_pylist()
    suffix = project.encode("utf-8")
    if version >= 3 and key_type in (ValueType.STRING, ValueType.INT64):
        prefix = serialize_entity_key_prefix([join_key], version)
        kind = struct.pack("<I", key_type.value)
        if key_type == ValueType.STRING:
            parts = (value.encode("utf8") for value in values)
        else:
            parts = (struct.pack("<q", value) for value in values)
        return [prefix + kind + struct.pack("<I", len(part)) + part + suffix for part in parts]
    field = "string_val" if key_type == ValueType.STRING else "int64_val"
    return [serialize_entity_key(EntityKey(join_keys=[join_key],
                                           entity_values=[Value(**{field: value})]),
                                 entity_key_serialization_version=version) + suffix
            for value in values]


def _columns(rows: pa.Table, layout: Layout) -> tuple[list[bytes], list[list[bytes]]]:
    """The view's fields (its features', then its timestamp's) and, per field, every row's
    serialized value."""
    fields = [_mmh3(f"{layout.view}:{name}") for name, _ in layout.features]
    values = [encode_values(rows[name], value_type) for name, value_type in layout.features]
    fields.append(f"_ts:{layout.view}".encode())
    values.append(encode_timestamps(rows[layout.timestamp_field]))
    return fields, values


def encoded_slices(rows: pa.Table, layout: Layout
                   ) -> Iterator[tuple[pa.Table, list[bytes], list[bytes],
                                       list[tuple[bytes, ...]]]]:
    """``rows`` (one per entity) in Feast's layout, ``SLICE`` rows at a time so that memory
    stays bounded whatever the table's size: the slice, its keys, the view's fields (its
    features', then its timestamp's) and, per entity, its values then its timestamp."""
    for offset in range(0, rows.num_rows, SLICE):
        part = rows.slice(offset, SLICE)
        keys = entity_keys(layout.join_key, part[layout.join_key], layout.key_type,
                           layout.project, layout.key_version)
        fields, values = _columns(part, layout)
        yield part, keys, fields, list(zip(*values, strict=True))


def vector_prefix(project: str, generation: int, view: str | None = None) -> bytes:
    """The start of every vector key of a generation (of one view, when given)."""
    head = f"{VECTOR_PREFIX}{project}:{generation}:"
    return (head if view is None else f"{head}{view}:").encode()


def vector_keys(prefix: bytes, keys: list[bytes]) -> list[bytes]:
    return [prefix + key for key in keys]


def _unix_seconds(column: pa.Array) -> pa.Array:
    """A timestamp column as whole Unix seconds, rounded down (a protobuf ``Timestamp``'s
    ``seconds``); missing stays missing."""
    micros = column.cast(pa.timestamp("us")).cast(pa.int64())
    return pc.floor(pc.divide(micros.cast(pa.float64()), 1e6)).cast(pa.int64())


def _plain(column: pa.Array, feast_type: ValueType) -> list[Any]:
    """A column as the JSON values of an entity vector: NaN as missing (as Feast stores
    it), Unix timestamps as their seconds (Feast's ``unix_timestamp_val``)."""
    if feast_type in (ValueType.FLOAT, ValueType.DOUBLE):
        column = pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)
    elif feast_type == ValueType.UNIX_TIMESTAMP:
        column = _unix_seconds(column)
    return column.to_pylist()


def encode_vectors(rows: pa.Table, layout: Layout) -> list[bytes]:
    """Each row's entity vector: one JSON array of the view's timestamp (Unix seconds), then
    its features' values in the view's order, missing ones null (docs/ARCHITECTURE.md,
    "Publishing"). Decoding one costs a few µs where the view's hash fields cost a
    protobuf each."""
    seconds = _unix_seconds(_array(rows[layout.timestamp_field])).to_pylist()
    columns = [_plain(_array(rows[name]), value_type) for name, value_type in layout.features]
    return [orjson.dumps(row) for row in zip(seconds, *columns, strict=True)]
