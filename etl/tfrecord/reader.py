"""Read the job's TFRecords: into numpy (no TensorFlow needed) or as a ``tf.data.Dataset``.

Both take the job's output folder, its ``metadata.json``, that file read
(``core.metadata.read_metadata``) or its parsed dict (``"output"``: the folder its paths are
under), and give columns under their original long names.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np

from featureline.core.metadata import METADATA_FILE, Metadata, TfrecordInfo, read_metadata
from featureline.etl.tfrecord.layout import Group
from featureline.etl.tfrecord.records import read_file

MetadataSource = str | Path | Metadata | dict[str, Any]


def _metadata(path_or_metadata: MetadataSource) -> Metadata:
    """The typed metadata.json, with the folder its paths are under."""
    if isinstance(path_or_metadata, Metadata):
        return path_or_metadata
    if isinstance(path_or_metadata, dict):
        document = dict(path_or_metadata)
        folder = document.pop("output", None)
        return Metadata.parse(document).model_copy(
            update={"folder": Path(folder) if folder else None})
    path = Path(path_or_metadata)
    return read_metadata(path.parent if path.name == METADATA_FILE else path)


def layout(metadata: Metadata) -> tuple[list[Group], TfrecordInfo]:
    section = metadata.tfrecord
    if section is None:
        raise KeyError("metadata.json has no 'tfrecord' section: the job ran with "
                       "etl.tfrecord.enabled: false")
    groups = [Group.from_json(name, spec.model_dump()) for name, spec in section.groups.items()]
    return groups, section


def files(path_or_metadata: MetadataSource, split: str = "train") -> list[Path]:
    metadata = _metadata(path_or_metadata)
    _, section = layout(metadata)
    root = metadata.folder or Path(".")
    return [root / f.path for f in section.files if f.split == split]


def read_numpy(path_or_metadata: MetadataSource, split: str = "train"
               ) -> dict[str, np.ndarray]:
    """Every row of a split: long name → [rows] (or [rows, K] for multi-hot lists)."""
    metadata = _metadata(path_or_metadata)
    groups, section = layout(metadata)
    parts = [read_file(path, groups, section.compression)
             for path in files(metadata, split)]
    names = [c for g in groups for c in g.columns]
    if not parts:
        return {name: np.zeros(0) for name in names}
    return {name: np.concatenate([p[name] for p in parts]) for name in names}


def dataset(path_or_metadata: MetadataSource, batch_size: int = 65536,
            split: str = "train", parallel_reads: int | None = None,
            grouped: bool = False, shuffle: int = 0, seed: int | None = None) -> Any:
    """A ``tf.data.Dataset`` of dicts of dense tensors, exactly ``batch_size`` rows each (the
    last batch fewer), whatever the prebatch size. Needs the ``[tf]`` extra.

    Records hold ``prebatch_size`` rows: ``ceil(batch_size / prebatch_size)`` of them are
    parsed at once, in one op. When ``batch_size`` is a multiple of ``prebatch_size``, the
    whole records come first and each day's short record after them (what the job writes),
    so the parsed blocks already hold ``batch_size`` rows but at the tail, where a split of
    several days is re-batched (a split of one day: no re-batching at all); otherwise every
    block is re-batched to ``batch_size``, which costs up to half the read rate
    (benchmarks/README.md).

    ``grouped=False``: long names → ``[rows]`` (``[rows, K]`` for multi-hot lists), each
    group split into its columns by one op. ``grouped=True``: the groups as stored, group
    name → ``[rows, width]`` (``c`` the categorical ids, ``f`` the continuous values, ``h``
    the history, ``y`` the label; columns in metadata.json's order): what a model built from
    metadata.json takes, with no split at all.

    ``shuffle=N``: the files and the records (``prebatch_size`` rows each) come in a random
    order, from a buffer of N records (``seed`` for a repeatable order); the rows in a whole
    record stay together, and the days' short records come after the whole ones, their rows
    shuffled among themselves (a buffer of N × ``prebatch_size`` rows).
    """
    import tensorflow as tf

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    metadata = _metadata(path_or_metadata)
    groups, section = layout(metadata)
    prebatch = section.prebatch_size
    root = metadata.folder or Path(".")
    entries = [f for f in section.files if f.split == split]
    # Files of whole records may come in any order; the files with a short record come last
    # (one per day; older outputs had a short record at the end of every file).
    short = [str(root / f.path) for f in entries if f.rows % prebatch]
    whole = [str(root / f.path) for f in entries if not f.rows % prebatch]
    aligned = batch_size % prebatch == 0
    exact = aligned and len(short) <= 1
    if not aligned and not shuffle:  # every block is re-batched: the order does not matter
        whole, short = whole + short, []
    spec = {g.name: tf.io.RaggedFeature(tf.float32 if g.dtype == "float32" else tf.int64,
                                        row_splits_dtype=tf.int64) for g in groups}

    def to_blocks(serialized: Any) -> dict[str, Any]:
        parsed = tf.io.parse_example(serialized, spec)
        return {g.name: tf.reshape(parsed[g.name].flat_values, [-1, g.width]) for g in groups}

    def to_columns(blocks: dict[str, Any]) -> dict[str, Any]:
        columns: dict[str, Any] = {}
        for group in groups:
            if group.column_width == 1:  # rows of the transpose are contiguous: 1.8x faster
                parts = tf.unstack(tf.transpose(blocks[group.name]), num=len(group.columns))
            else:
                parts = tf.split(blocks[group.name], len(group.columns), axis=1)
            columns.update(zip(group.columns, parts, strict=True))
        return columns

    reads = parallel_reads if parallel_reads is not None else tf.data.AUTOTUNE
    compression = section.compression
    if shuffle:  # the files are the days in order: their order is shuffled too
        order = random.Random(seed)
        order.shuffle(whole)
        order.shuffle(short)
    records = tf.data.TFRecordDataset(tf.constant(whole, tf.string),
                                      compression_type=compression, num_parallel_reads=reads)
    if shuffle:
        records = records.shuffle(shuffle, seed=seed)
    per_batch = -(-batch_size // prebatch)
    tail = tf.data.TFRecordDataset(short, compression) if short else None
    if exact:
        if tail is not None:
            records = records.concatenate(tail)
        parse = to_blocks if grouped else (lambda serialized: to_columns(to_blocks(serialized)))
        batches = records.batch(per_batch).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        blocks = records.batch(per_batch).map(to_blocks, num_parallel_calls=tf.data.AUTOTUNE)
        if tail is not None:
            rest = tail.batch(per_batch).map(to_blocks, num_parallel_calls=tf.data.AUTOTUNE)
            if shuffle:
                # The days' short records hold a day each: their rows are shuffled among
                # themselves (a buffer of as many rows as the records' buffer holds), so a
                # batch of a split of small days still mixes days and users.
                rest = rest.unbatch().shuffle(shuffle * prebatch, seed=seed).batch(batch_size)
            blocks = blocks.concatenate(rest)
        batches = blocks.rebatch(batch_size)
        if not grouped:
            batches = batches.map(to_columns, num_parallel_calls=tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE)
