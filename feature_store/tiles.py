"""The aggregations' tiles of an ETL output (``tiles/<group>/<feature>``, written by the job:
``etl.aggregations.output_tiles``), read as the engine's partials, and a key's values at a
request time merged from them (docs/ARCHITECTURE.md, "Features as definitions").

In the online store, a key's tiles of every output of its group are one value,
``featureline:tiles:<project>:<generation>:<group>:<the key's values as a JSON list>``,
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

import orjson
import pyarrow.parquet as pq

from featureline.core.aggregations import AggregateFeature, GroupSpec, Partial, value_from_tiles
from featureline.core.metadata import Metadata
from featureline.feature_store.errors import TilesError

# A key's tiles of one output: tile start (µs; 0 for the lifetime) → partial.
KeyTiles = dict[int, Partial]


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


def read_tiles(metadata: Metadata, groups: Sequence[GroupSpec]) -> OutputTiles:
    """The tiles of ``metadata``'s output for every output of ``groups``; a missing table is
    a :class:`TilesError` (the output was written with another spec)."""
    if metadata.tiles is None or metadata.folder is None:
        raise TilesError("the output holds no aggregation tiles: the ETL ran without an "
                         "aggregations spec")
    read = OutputTiles(metadata.tiles.cut_us)
    for group in groups:
        for feature in group.outputs():
            relative = metadata.tiles.tables.get(feature.qualified)
            if relative is None:
                raise TilesError(f"the output has no tiles of {feature.qualified}: run the ETL "
                                 "with this spec")
            read.features[feature.qualified] = feature
            read.by_output[feature.qualified] = key_tiles(
                feature, pq.read_table(Path(metadata.folder) / relative).to_pylist())
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
    """The part of a tile key after its group's prefix: the key's values as a JSON list."""
    return orjson.dumps(list(values))


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


def stored_tiles(tiles: OutputTiles, group: GroupSpec
                 ) -> Iterator[tuple[tuple[str, ...], bytes]]:
    """Each key of ``group`` with tiles, and its value in the online store: every output of
    the group (a reader tells an output the tiles were written without by its absence)."""
    features = {feature.output: feature for feature in group.outputs()}
    by_key: dict[tuple[str, ...], dict[str, KeyTiles]] = {}
    for feature in features.values():
        for key, key_tiles_ in tiles.by_output[feature.qualified].items():
            by_key.setdefault(key, {})[feature.output] = key_tiles_
    for key, by_output in by_key.items():  # every output, those without tiles left empty
        yield key, encode_key_tiles(features, {output: by_output.get(output, {})
                                               for output in features})
