"""The TFRecord container and the protobuf wire format of ``tf.train.Example``, in numpy.

A TFRecord file is a sequence of records::

    uint64 length (little-endian) | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

and each record's data here is a serialized ``tf.train.Example`` whose features are packed
``int64_list`` / ``float_list`` values. Whole columns are encoded at once (packed varints
and float32 bytes); only the few header bytes of each record are assembled per record.
"""

from __future__ import annotations

import struct

import crc32c
import numba
import numpy as np

# cache=True: compiled once into __pycache__/ beside this file, found again by this file's
# size and time stamp; the cache names the module (featureline.…), so a cache written
# under another module name must not match: editing this file invalidates it.
_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
# Records from this size on are checksummed piece by piece and copied once.
ONE_COPY_FROM = 64 * 1024
_CRC = struct.Struct("<I")
# Field tags (field number << 3 | wire type 2) of the messages in example.proto.
TAG_EXAMPLE_FEATURES = 0x0A  # Example.features
TAG_FEATURES_ENTRY = 0x0A  # Features.feature (map entry)
TAG_ENTRY_KEY = 0x0A
TAG_ENTRY_VALUE = 0x12
TAG_FLOAT_LIST = 0x12  # Feature.float_list
TAG_INT64_LIST = 0x1A  # Feature.int64_list
TAG_PACKED_VALUE = 0x0A  # FloatList.value / Int64List.value, packed


def masked_crc(data: bytes | memoryview) -> int:
    return _mask(crc32c.crc32c(data))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def varint(value: int) -> bytes:
    """One unsigned varint (the header lengths)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@numba.njit(cache=True, nogil=True)
def _pack_varints(unsigned: np.ndarray, values_per_record: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Every value as a varint, and each record's end offset, in one pass.

    The buffer is sized for the worst case (10 bytes a value) and not filled: the pages past
    the end are never touched. The caller keeps ``[:ends[-1]]``.
    """
    out = np.empty(unsigned.size * 10, dtype=np.uint8)
    ends = np.empty(values_per_record.size, dtype=np.int64)
    position = 0
    index = 0
    for record in range(values_per_record.size):
        for _ in range(values_per_record[record]):
            value = unsigned[index]
            index += 1
            while value >= 0x80:
                out[position] = np.uint8((value & np.uint64(0x7F)) | np.uint64(0x80))
                value >>= np.uint64(7)
                position += 1
            out[position] = np.uint8(value)
            position += 1
        ends[record] = position
    return out, ends


def _unsigned(values: np.ndarray) -> np.ndarray:
    """int64 values as protobuf encodes them: two's complement, read unsigned."""
    return np.ascontiguousarray(values, dtype=np.int64).view(np.uint64).ravel()


def encode_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint bytes of every int64 (two's complement, as protobuf does) and each one's length.

    Compiled with numba: a byte loop per value, which numpy can only express as several
    passes over the whole array.
    """
    unsigned = _unsigned(values)
    encoded, ends = _pack_varints(unsigned, np.ones(unsigned.size, dtype=np.int64))
    size = int(ends[-1]) if ends.size else 0
    return encoded[:size], np.diff(ends, prepend=0)


def decode_varints(data: np.ndarray, where: str = "") -> np.ndarray:
    """All varints packed in ``data`` (uint8) → int64 values."""
    if data.size == 0:
        return np.zeros(0, dtype=np.int64)
    last = (data & 0x80) == 0
    if not last[-1]:
        raise ValueError(f"{where}: truncated varint")
    ends = np.flatnonzero(last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > 10:
        raise ValueError(f"{where}: varint longer than 10 bytes")
    owner = np.repeat(np.arange(ends.size), lengths)
    position = np.arange(data.size) - starts[owner]
    parts = (data & 0x7F).astype(np.uint64) << (np.uint64(7) * position.astype(np.uint64))
    return np.add.reduceat(parts, starts).view(np.int64)


def group_payloads(values: np.ndarray, rows_per_record: np.ndarray, width: int
                   ) -> tuple[memoryview, np.ndarray]:
    """The packed bytes of one feature group for all records at once, and record offsets.

    ``values``: [rows, width] int64 or float32, row-major; record r holds the next
    ``rows_per_record[r]`` rows. Returns the byte buffer and, per record, its [start, end).
    """
    counts = rows_per_record * width
    if values.dtype == np.float32:  # the little-endian floats as they lie, not copied
        floats = np.ascontiguousarray(values, dtype="<f4")
        offsets = np.concatenate(([0], np.cumsum(counts * 4)))
        return memoryview(floats.data).cast("B"), offsets
    encoded, ends = _pack_varints(_unsigned(values), counts)
    offsets = np.concatenate(([0], ends))
    return memoryview(encoded[:offsets[-1]]), offsets


def feature_entry(key: bytes, payload: memoryview, is_float: bool) -> list[bytes | memoryview]:
    """The pieces of one ``Features.feature`` map entry holding a packed list."""
    packed = [bytes([TAG_PACKED_VALUE]), varint(len(payload))]
    packed_size = 1 + len(packed[1]) + len(payload)
    kind = bytes([TAG_FLOAT_LIST if is_float else TAG_INT64_LIST]), varint(packed_size)
    feature_size = 1 + len(kind[1]) + packed_size
    head = [bytes([TAG_ENTRY_KEY]), varint(len(key)), key, bytes([TAG_ENTRY_VALUE]),
            varint(feature_size)]
    entry_size = sum(len(p) for p in head) + feature_size
    return [bytes([TAG_FEATURES_ENTRY]), varint(entry_size), *head, *kind, *packed, payload]


def framed_example(entries: list[list[bytes | memoryview]]) -> bytes:
    """One TFRecord record (length, its CRC, the data, its CRC) holding the Example of
    ``entries``; the payloads are checksummed where they lie and copied once, into it."""
    size = sum(len(piece) for entry in entries for piece in entry)
    pieces = [bytes([TAG_EXAMPLE_FEATURES]), varint(size),
              *(piece for entry in entries for piece in entry)]
    length = _LENGTH.pack(1 + len(pieces[1]) + size)
    if size < ONE_COPY_FROM:  # a small record: one join beats a checksum call per piece
        data = b"".join(pieces)
        return b"".join((length, _CRC.pack(masked_crc(length)), data,
                         _CRC.pack(masked_crc(data))))
    crc = 0
    for piece in pieces:
        crc = crc32c.crc32c(piece, crc)
    return b"".join((length, _CRC.pack(masked_crc(length)), *pieces, _CRC.pack(_mask(crc))))
