"""Encode prebatched ``tf.train.Example`` records from column arrays, and decode them back.

The decoder needs neither TensorFlow nor protobuf: notebooks and tests read the files with
numpy alone. A damaged file is a :class:`TFRecordCorruptError` naming the file and offset.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from featureline.core.errors import FeaturelineError
from featureline.etl.tfrecord import wire
from featureline.etl.tfrecord.layout import Group

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


class TFRecordCorruptError(FeaturelineError):
    """A bad CRC, a truncated record or a malformed Example; names the file and offset."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        super().__init__(f"{path}: corrupt TFRecord at byte {offset}: {reason}")


def encode(arrays: dict[str, np.ndarray], groups: list[Group], prebatch_size: int
           ) -> Iterator[bytes]:
    """Framed records of ``prebatch_size`` rows each (the last one may hold fewer).

    ``arrays``: group name → [rows, group.width] values of the group's dtype.
    """
    rows = len(next(iter(arrays.values())))
    if rows == 0:
        return
    full, rest = divmod(rows, prebatch_size)
    rows_per_record = np.array([prebatch_size] * full + ([rest] if rest else []), dtype=np.int64)
    payloads = {g.name: wire.group_payloads(arrays[g.name], rows_per_record, g.width)
                for g in groups}
    keys = {g.name: g.name.encode() for g in groups}
    for record in range(len(rows_per_record)):
        entries = []
        for group in groups:
            buffer, offsets = payloads[group.name]
            payload = buffer[offsets[record]:offsets[record + 1]]
            entries.append(wire.feature_entry(keys[group.name], payload,
                                              group.dtype == "float32"))
        yield wire.framed_example(entries)


def _open(path: Path, compression: str) -> bytes:
    if compression == "GZIP":
        with gzip.open(path, "rb") as handle:
            return handle.read()
    return path.read_bytes()


def records(path: Path, compression: str = "") -> Iterator[tuple[int, memoryview]]:
    """(offset, data) of every record, CRCs checked."""
    try:
        content = _open(path, compression)
    except (OSError, EOFError) as exc:
        raise TFRecordCorruptError(str(path), 0, f"cannot decompress: {exc}") from None
    return framed_records(content, str(path))


def framed_records(content: bytes, name: str) -> Iterator[tuple[int, memoryview]]:
    """(offset, data) of every record in a file's uncompressed bytes; ``name`` goes into
    errors."""
    view = memoryview(content)
    offset = 0
    while offset < len(view):
        if offset + _HEADER.size > len(view):
            raise TFRecordCorruptError(name, offset, "truncated record header")
        length, length_crc = _HEADER.unpack_from(view, offset)
        if wire.masked_crc(view[offset:offset + 8]) != length_crc:
            raise TFRecordCorruptError(name, offset, "length CRC mismatch")
        start = offset + _HEADER.size
        end = start + length
        if end + _FOOTER.size > len(view):
            raise TFRecordCorruptError(name, offset, "truncated record")
        data = view[start:end]
        if wire.masked_crc(data) != _FOOTER.unpack_from(view, end)[0]:
            raise TFRecordCorruptError(name, offset, "data CRC mismatch")
        yield offset, data
        offset = end + _FOOTER.size


def _read_varint(data: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def _fields(data: memoryview) -> Iterator[tuple[int, memoryview]]:
    """(tag, bytes) of each length-delimited field of a message."""
    position = 0
    while position < len(data):
        tag, position = _read_varint(data, position)
        if tag & 0x7 != 2:
            raise ValueError(f"unexpected wire type {tag & 0x7}")
        size, position = _read_varint(data, position)
        if position + size > len(data):
            raise ValueError("field runs past the end of its message")
        yield tag, data[position:position + size]
        position += size


def parse_example(data: memoryview) -> dict[str, np.ndarray]:
    """A serialized Example of packed lists → feature name → flat values."""
    out: dict[str, np.ndarray] = {}
    for tag, features in _fields(data):
        if tag != wire.TAG_EXAMPLE_FEATURES:
            continue
        for _, entry in _fields(features):
            key, feature = "", memoryview(b"")
            for entry_tag, value in _fields(entry):
                if entry_tag == wire.TAG_ENTRY_KEY:
                    key = bytes(value).decode()
                elif entry_tag == wire.TAG_ENTRY_VALUE:
                    feature = value
            for kind, values in _fields(feature):
                packed = b"".join(bytes(v) for t, v in _fields(values)
                                  if t == wire.TAG_PACKED_VALUE)
                if kind == wire.TAG_FLOAT_LIST:
                    out[key] = np.frombuffer(packed, dtype="<f4")
                elif kind == wire.TAG_INT64_LIST:
                    out[key] = wire.decode_varints(np.frombuffer(packed, dtype=np.uint8), key)
                else:
                    raise ValueError(f"feature {key!r}: only float and int64 lists are read")
    return out


def group_arrays(framed: Iterator[tuple[int, memoryview]], groups: list[Group], name: str
                 ) -> dict[str, np.ndarray]:
    """The records' rows as group name → [rows, group.width] values (what :func:`encode`
    takes)."""
    parts: dict[str, list[np.ndarray]] = {g.name: [] for g in groups}
    for offset, data in framed:
        try:
            parsed = parse_example(data)
        except (ValueError, IndexError) as exc:
            raise TFRecordCorruptError(name, offset, f"bad Example: {exc}") from None
        for group in groups:
            if group.name not in parsed:
                raise TFRecordCorruptError(name, offset, f"no feature {group.name!r}")
            parts[group.name].append(parsed[group.name].reshape(-1, group.width))
    return {g.name: (np.concatenate(parts[g.name]) if parts[g.name] else
                     np.zeros((0, g.width), np.float32 if g.dtype == "float32" else np.int64))
            for g in groups}


def read_file(path: Path, groups: list[Group], compression: str = "") -> dict[str, np.ndarray]:
    """Every row of one file: long column name → [rows] or [rows, width] values."""
    arrays = group_arrays(records(path, compression), groups, str(path))
    columns: dict[str, np.ndarray] = {}
    for group in groups:
        values = arrays[group.name]
        for index, column in enumerate(group.columns):
            block = values[:, index * group.column_width:(index + 1) * group.column_width]
            columns[column] = block[:, 0] if group.column_width == 1 else block
    return columns
