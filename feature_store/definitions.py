"""Feast objects derived from the ETL's metadata.json, the one source of truth for the entity
tables' names, types and paths: nothing here repeats a column list.

- entities ``user`` and ``item``, keyed by the raw id as it appears in the logs;
- one source and one feature view per entity over ``entities/<entity>/`` (daily snapshots);
- feature services ``ranking`` (what a ranking request reads online) and ``training`` (what a
  training set joins); both hold every feature of both views, so a model is trained on exactly
  what ranking serves, and either can grow without changing the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.data_format import ParquetFormat
from feast.data_source import DataSource
from feast.types import Bool, Float32, Float64, Int32, Int64, String, UnixTimestamp

from featureline.core.metadata import Metadata, read_metadata
from featureline.core.settings import duration_seconds
from featureline.feature_store.errors import FeatureStoreError
from featureline.feature_store.settings import FeatureStoreConfig

SERVICES = ("ranking", "training")
# Spark SQL type names, as metadata.json records them, to Feast's types.
FEAST_TYPES = {"bigint": Int64, "int": Int32, "double": Float64, "float": Float32,
               "string": String, "boolean": Bool, "timestamp": UnixTimestamp}
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

    def objects(self) -> list[Any]:
        return [*self.entities.values(), *self.sources.values(), *self.views.values(),
                *self.services.values()]

    def named(self) -> dict[str, Any]:
        """Module-level names for the Feast repository file, which Feast scans with dir()."""
        groups = (self.entities, self.sources, self.views, self.services)
        return {f"{type(obj).__name__.lower()}_{name}": obj
                for group in groups for name, obj in group.items()}

    def snapshot_path(self, entity: str) -> Path:
        return self.output / self.metadata.entities[entity].path


def _feast_type(entity: str, column: str, dtype: str) -> Any:
    try:
        return FEAST_TYPES[dtype]
    except KeyError:
        raise FeatureStoreError(
            f"metadata.json: entities.{entity}: column {column!r} has type {dtype!r}, "
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
            schema=[Field(name=f.name, dtype=_feast_type(entity, f.name, f.dtype))
                    for f in table.features],
            description=f"daily {entity} snapshots; a value at t uses only events before t",
            tags={"config_hash": metadata.config_hash})
    services = {name: FeatureService(name=name, features=list(views.values()))
                for name in SERVICES}
    return Definitions(output, metadata, entities, sources, views, services)
