"""Feast objects derived from the ETL's metadata.json, the one source of truth for the entity
tables' names, types and paths: nothing here repeats a column list.

- entities ``user`` and ``item``, keyed by the raw id as it appears in the logs;
- one source and one feature view per entity over ``entities/<entity>/`` (daily snapshots);
- one source and one offline feature view per group of the aggregations' spec over
  ``aggregations/<group>/`` (daily snapshots, named as the group, so ``<group>:<feature>``
  is the same reference in Feast and in the API), its entities those of its keys (a key
  other than ``user_id`` and ``item_id`` is an entity of its own, named as the column).
  Online, the API serves them at the request time from the tiles (docs/ARCHITECTURE.md,
  "Features as definitions"), not from Feast's online store;
- feature services ``ranking`` (what a ranking request reads online) and ``training`` (what a
  training set joins); both hold every feature of both entity views, so a model is trained
  on exactly what ranking serves, and either can grow without changing the other;
  ``training`` also holds the groups keyed by ``user_id`` or ``item_id`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.data_format import ParquetFormat
from feast.data_source import DataSource
from feast.types import Array, Bool, Float32, Float64, Int32, Int64, String, UnixTimestamp

from featureline.core.metadata import Metadata, read_metadata
from featureline.core.settings import duration_seconds
from featureline.feature_store.errors import FeatureStoreError
from featureline.feature_store.settings import FeatureStoreConfig

SERVICES = ("ranking", "training")
# The services that join the groups' views too (those keyed by an entity of the views).
WITH_GROUPS = ("training",)
# Spark SQL type names, as metadata.json records them, to Feast's types.
FEAST_TYPES = {"bigint": Int64, "int": Int32, "double": Float64, "float": Float32,
               "string": String, "boolean": Bool, "timestamp": UnixTimestamp,
               "array<string>": Array(String), "array<bigint>": Array(Int64),
               "array<double>": Array(Float64)}
KEY_TYPES = {"string": ValueType.STRING, "bigint": ValueType.INT64, "int": ValueType.INT32}


def view_name(entity: str) -> str:
    return f"{entity}_features"


@dataclass(frozen=True)
class Definitions:
    """Everything ``feast apply`` registers for one ETL output."""

    output: Path
    metadata: Metadata
    entities: dict[str, Entity]
    sources: dict[str, DataSource]
    views: dict[str, FeatureView]
    services: dict[str, FeatureService]
    # Per group of the aggregations' spec, its offline view.
    group_views: dict[str, FeatureView] = field(default_factory=dict)

    def objects(self) -> list[Any]:
        return [*self.entities.values(), *self.sources.values(), *self.views.values(),
                *self.group_views.values(), *self.services.values()]

    def join_keys(self, view: str) -> list[str]:
        """The columns an entity row needs for the view named ``view``."""
        by_name = {v.name: v for v in (*self.views.values(), *self.group_views.values())}
        return [self.entities[entity].join_key for entity in by_name[view].entities]

    def named(self) -> dict[str, Any]:
        """Module-level names for the Feast repository file, which Feast scans with dir()."""
        groups = (self.entities, self.sources, self.views, self.group_views, self.services)
        return {f"{type(obj).__name__.lower()}_{name}": obj
                for group in groups for name, obj in group.items()}

    def snapshot_path(self, entity: str) -> Path:
        return self.output / self.metadata.entities[entity].path


def _feast_type(where: str, column: str, dtype: str) -> Any:
    try:
        return FEAST_TYPES[dtype]
    except KeyError:
        raise FeatureStoreError(
            f"metadata.json: {where}: column {column!r} has type {dtype!r}, "
            f"which has no Feast type (known: {', '.join(FEAST_TYPES)})") from None


def _source(name: str, path: Path, timestamp_field: str, offline_store: str) -> DataSource:
    if offline_store == "spark":
        from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import (
            SparkSource,
        )
        return SparkSource(name=name, path=str(path), file_format="parquet",
                           timestamp_field=timestamp_field)
    # DuckDB reads a folder of Spark part files through a glob.
    return FileSource(name=name, path=str(path / "*.parquet"), file_format=ParquetFormat(),
                      timestamp_field=timestamp_field)


def build(output: str | Path, settings: FeatureStoreConfig) -> Definitions:
    """The Feast objects for the ETL output folder ``output`` (which holds metadata.json)."""
    output = Path(output).resolve()
    metadata = read_metadata(output)
    ttl = timedelta(seconds=duration_seconds(settings.ttl))
    entities: dict[str, Entity] = {}
    sources: dict[str, DataSource] = {}
    views: dict[str, FeatureView] = {}
    for entity, table in metadata.entities.items():
        key, key_dtype = table.join_key, table.join_key_dtype
        if key_dtype not in KEY_TYPES:
            raise FeatureStoreError(f"metadata.json: entities.{entity}: join key {key!r} has "
                                    f"type {key_dtype!r} (known: {', '.join(KEY_TYPES)})")
        entities[entity] = Entity(name=entity, join_keys=[key], value_type=KEY_TYPES[key_dtype],
                                  description=f"a {entity}, by its raw id in the logs")
        sources[entity] = _source(f"{entity}_snapshots", output / table.path,
                                  table.timestamp_field, settings.offline_store)
        views[entity] = FeatureView(
            name=view_name(entity), entities=[entities[entity]], ttl=ttl, online=True,
            source=sources[entity],
            schema=[Field(name=f.name, dtype=_feast_type(f"entities.{entity}", f.name, f.dtype))
                    for f in table.features],
            description=f"daily {entity} snapshots; a value at t uses only events before t",
            tags={"config_hash": metadata.config_hash})
    groups = _group_views(metadata, output, settings, ttl, entities, sources, views)
    keyed_by_entity = [view for view in groups.values() if len(view.entities) == 1
                       and view.entities[0] in metadata.entities]
    services = {name: FeatureService(name=name, features=[
        *views.values(), *(keyed_by_entity if name in WITH_GROUPS else [])])
        for name in SERVICES}
    return Definitions(output, metadata, entities, sources, views, services, groups)


def _group_views(metadata: Metadata, output: Path, settings: FeatureStoreConfig,
                 ttl: timedelta, entities: dict[str, Entity], sources: dict[str, DataSource],
                 views: dict[str, FeatureView]) -> dict[str, FeatureView]:
    """One offline view per group; its key columns' entities added to ``entities`` (an
    entity table's where one keys by the same column)."""
    by_key = {entity.join_key: name for name, entity in entities.items()}
    groups: dict[str, FeatureView] = {}
    taken = {view.name for view in views.values()}
    for group, table in metadata.aggregations.items():
        if group in taken:
            raise FeatureStoreError(f"metadata.json: aggregations.{group}: a group's view has "
                                    f"its name, and an entity view is called {group} too; "
                                    "rename the group")
        keyed_by = []
        for key in table.keys:
            name = by_key.get(key.name, key.name)
            if name not in entities:
                if key.dtype not in KEY_TYPES:
                    raise FeatureStoreError(
                        f"metadata.json: aggregations.{group}: key {key.name!r} has type "
                        f"{key.dtype!r} (known: {', '.join(KEY_TYPES)})")
                entities[name] = Entity(name=name, join_keys=[key.name],
                                        value_type=KEY_TYPES[key.dtype],
                                        description=f"a {key.name} value, as in the logs")
                by_key[key.name] = name
            keyed_by.append(entities[name])
        sources[f"group_{group}"] = _source(f"{group}_snapshots", output / table.path,
                                            table.timestamp_field, settings.offline_store)
        groups[group] = FeatureView(
            name=group, entities=keyed_by, ttl=ttl, online=False,
            source=sources[f"group_{group}"],
            schema=[Field(name=f.name, dtype=_feast_type(f"aggregations.{group}", f.name,
                                                         f.dtype)) for f in table.features],
            description=f"daily snapshots of the aggregations of {group}; a value at t "
                        "uses only events before t (online: the API, at the request time)",
            tags={"config_hash": metadata.config_hash})
    return groups
