"""The aggregations' tiles of an ETL output (``tiles/<group>/<feature>``, written by the job:
``etl.aggregations.output_tiles``), read as the engine's partials, and a key's values at a
request time merged from them (docs/ARCHITECTURE.md, "Features as definitions").

In the online store, a key's tiles of every output of its group are one value,
``featureline:tiles:<project>:<generation>:<group>:{<the key's values as a JSON list>}``,
holding ``{output: [[tile start, partial], …]}`` (:func:`encode_key_tiles`): a read of a
group is one GET per key, in the round trip of the entity vectors, and belongs to the
generation that the publication stamp serves, as they do.

The tiles hold every event up to the output's cut (``metadata.json``'s ``tiles.cut_us``); at
any time ``t`` at or after it, :func:`values_at` is the value the rule of time defines —
including an idle key's decay (its ``1h`` count reads 0 an hour and a hop after its last
event), which a snapshot stamped at the key's last active day cannot show.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from featureline.core.aggregations import AggregateFeature, GroupSpec, Partial, value_from_tiles
from featureline.core.metadata import Metadata, TilesInfo
from featureline.feature_store.errors import TilesError

# A key's tiles of one output: tile start (µs; 0 for the lifetime) → partial.
KeyTiles = dict[int, Partial]
# Keys encoded at a time by :func:`stored_tiles`.
STORED_CHUNK = 50_000


@dataclass
class OutputTiles:
    """Per output (``<group>:<feature>``), each key's tiles; ``cut_us``: after every event."""

    cut_us: int
    features: dict[str, AggregateFeature] = field(default_factory=dict)
    by_output: dict[str, dict[tuple[str, ...], KeyTiles]] = field(default_factory=dict)

    def values_at(self, group: str, key: Sequence[str], t: int) -> dict[str, Any]:
        """The group's values for ``key`` at ``t`` (µs, at or after the cut), by feature
        name; a key without events reads each operation's value of no events."""
        if t < self.cut_us:
            raise ValueError(f"t={t} is before the tiles' cut {self.cut_us}: the tiles hold "
                             "events after it")
        values = {}
        for qualified, feature in self.features.items():
            if feature.group == group:
                tiles = self.by_output[qualified].get(tuple(key), {})
                values[feature.output] = value_from_tiles(feature.operation(), feature.window,
                                                          tiles, t)
        return values


def read_tiles(metadata: Metadata, groups: Sequence[GroupSpec],
               key: Sequence[str] | None = None) -> OutputTiles:
    """The tiles of ``metadata``'s output for every output of ``groups`` (``key``: of that
    key only, its values as text, read by a filter); a missing table is a
    :class:`TilesError` (the output was written with another spec)."""
    read = OutputTiles(_tiles_info(metadata).cut_us)
    for group in groups:
        condition = None
        for column, value in zip(group.keys, key or (), strict=False):
            test = pc.field(column).cast(pa.string()) == value
            condition = test if condition is None else condition & test
        for feature in group.outputs():
            read.features[feature.qualified] = feature
            read.by_output[feature.qualified] = key_tiles(
                feature, _tiles_table(metadata, feature, condition).to_pylist())
    return read


def key_tiles(feature: AggregateFeature, rows: Sequence[Mapping[str, Any]]
              ) -> dict[tuple[str, ...], KeyTiles]:
    """Each key's tiles of one output from its table's rows (keys, ``tile``, the partial's
    fields)."""
    operation = feature.operation()
    by_key: dict[tuple[str, ...], KeyTiles] = {}
    for row in rows:
        key = tuple(row[k] for k in feature.keys)
        by_key.setdefault(key, {})[row["tile"]] = operation.from_fields(row)
    return by_key


# Tiles in the online store: ``<prefix><project>:<generation>:<group>:<key as JSON>``.
TILES_PREFIX = "featureline:tiles:"


def tiles_prefix(project: str, generation: int | None = None, group: str | None = None
                 ) -> bytes:
    """The start of the tile keys of a project (of one generation, of one group)."""
    head = f"{TILES_PREFIX}{project}:"
    if generation is not None:
        head += f"{generation}:"
        if group is not None:
            head += f"{group}:"
    return head.encode()


def tile_key(values: Sequence[Any]) -> bytes:
    """The part of a tile key after its group's prefix: the key's values as a JSON list, in
    braces — Redis Cluster's hash tag, so that a key's tiles of every generation and the
    stream's record of its events (``stream/tiles.py``) lie in one hash slot, which a
    script over them needs. No prefix holds a brace (project and group names cannot)."""
    return b"{" + orjson.dumps(list(values)) + b"}"


def tile_key_values(part: bytes) -> list[Any]:
    """The key's values a :func:`tile_key` names."""
    return list(orjson.loads(part[1:-1]))


def encode_key_tiles(features: Mapping[str, AggregateFeature],
                     by_output: Mapping[str, KeyTiles]) -> bytes:
    """One key's tiles of its group's outputs (``features`` by output name), as stored."""
    return orjson.dumps({
        output: [[start, features[output].operation().to_json(partial)]
                 for start, partial in sorted(tiles.items())]
        for output, tiles in by_output.items()})


def decode_key_tiles(features: Mapping[str, AggregateFeature], stored: bytes
                     ) -> dict[str, KeyTiles]:
    """What :func:`encode_key_tiles` stored, for the outputs of ``features`` it holds."""
    decoded = {}
    for output, tiles in orjson.loads(stored).items():
        feature = features.get(output)
        if feature is not None:
            operation = feature.operation()
            decoded[output] = {start: operation.from_json(partial) for start, partial in tiles}
    return decoded


def stored_tiles(metadata: Metadata, group: GroupSpec, chunk: int = STORED_CHUNK
                 ) -> Iterator[list[tuple[tuple[Any, ...], bytes]]]:
    """Each key of ``group`` with tiles in ``metadata``'s output and its value in the online
    store — every output of the group, those without tiles empty (a reader tells an output
    the tiles were written without by its absence) — ``chunk`` keys at a time.

    Read by columns: the tables stay Arrow, each row numbered by its key (one dictionary of
    the keys over every output) and sorted by key and tile; only a chunk's rows become
    Python values at a time (the Arrow tables and the keys' dictionary still follow the
    keys: 1M keys of the user table's group, benchmarks/README.md, "Tiles published")."""
    features = group.outputs()
    tables = [_tiles_table(metadata, feature) for feature in features]
    numbered, keys = _numbered_keys([table.select(list(group.keys)) for table in tables])
    sorted_rows = []
    for feature, key_index in zip(features, numbered, strict=True):
        table = tables.pop(0)  # its key columns freed once numbered and sorted
        tile = table["tile"].to_numpy()
        order = np.lexsort((tile, key_index))
        fields = table.drop_columns([*group.keys, "tile"]).take(pa.array(order))
        sorted_rows.append((feature, key_index[order], tile[order], fields))
    for low in range(0, len(keys), chunk):
        high = min(low + chunk, len(keys))
        outputs = []  # per output: its (tile, partial) pairs, and where each key's start
        for feature, key_index, tile, fields in sorted_rows:
            first, last = np.searchsorted(key_index, [low, high])
            values = feature.operation().json_column(fields.slice(first, last - first))
            # (start, partial) tuples: made at C speed, written as JSON arrays.
            pairs = list(zip(tile[first:last].tolist(), values, strict=True))
            bounds = np.searchsorted(key_index[first:last], np.arange(low, high + 1)).tolist()
            outputs.append((feature.output, pairs, bounds))
        yield [(keys[low + at], orjson.dumps({
            output: pairs[bounds[at]:bounds[at + 1]] for output, pairs, bounds in outputs}))
            for at in range(high - low)]


def _tiles_table(metadata: Metadata, feature: AggregateFeature,
                 condition: pc.Expression | None = None) -> pa.Table:
    """One output's table of tiles (keys, ``tile``, the partial's fields; ``condition``: the
    rows it keeps); a missing table is a :class:`TilesError` (the output was written with
    another spec)."""
    relative = _tiles_info(metadata).tables.get(feature.qualified)
    if relative is None:
        raise TilesError(f"the output has no tiles of {feature.qualified}: run the ETL with "
                         "this spec")
    return pq.read_table(Path(metadata.folder or ".") / relative, filters=condition)


def _tiles_info(metadata: Metadata) -> TilesInfo:
    if metadata.tiles is None or metadata.folder is None:
        raise TilesError("the output holds no aggregation tiles: the ETL ran without an "
                         "aggregations spec")
    return metadata.tiles


def _numbered_keys(key_tables: Sequence[pa.Table]
                   ) -> tuple[list[np.ndarray], list[tuple[Any, ...]]]:
    """Each table's rows numbered by their key (the tables' key columns), and the keys by
    number: one dictionary over every table."""
    sizes = [table.num_rows for table in key_tables]
    codes = []
    values = []
    for name in key_tables[0].column_names:
        column = pa.chunked_array([chunk for table in key_tables
                                   for chunk in table[name].chunks],
                                  type=key_tables[0][name].type)
        encoded = pc.dictionary_encode(column, null_encoding="encode").combine_chunks()
        codes.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
        values.append(encoded.dictionary.to_pylist())
    if len(codes) == 1:
        number, keys = codes[0], [(value,) for value in values[0]]
    else:
        combinations, number = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
        number = number.reshape(-1)
        keys = [tuple(values[c][code] for c, code in enumerate(row))
                for row in combinations.tolist()]
    bounds = np.cumsum([0, *sizes])
    return [number[bounds[t]:bounds[t + 1]] for t in range(len(sizes))], keys
