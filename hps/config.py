"""The parameter server's YAML configuration (pydantic-validated; errors name the key)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from featureline.core.errors import ConfigError
from featureline.core.settings import Settings, validate
from featureline.hps.cache import Device
from featureline.hps.formats import Format, source_written
from featureline.hps.slots import OverflowPolicy


class TableConfig(Settings):
    """An embedding table of a model."""

    # The table's name in lookups (/v1/embeddings/lookup's "table").
    name: str
    # The vectors' width.
    dim: int = Field(ge=1)
    # A HugeCTR folder, a Parquet file or "keys.npy,vectors.npy"; None: already in L3.
    source: str | None = None
    # The source's layout.
    format: Format = "hugectr"
    # Every element of the vector returned for a key no tier holds.
    default_value: float = 0.0
    # The version of the vocabulary whose ids key this table (metadata.json's
    # vocabularies.<column>.version), so a server can tell which ids its rows mean.
    vocabulary_version: str | None = None
    # The fit of the examples the table was trained on (metadata.json's fit.version): a
    # server over an output of another fit serves a model trained on inputs that output no
    # longer writes.
    fit_version: str | None = None


class ModelConfig(Settings):
    """A model: its embedding tables and cache policy."""

    # The model's name in lookups (/v1/embeddings/lookup's "model").
    name: str
    # Its embedding tables.
    tables: list[TableConfig] = Field(min_length=1)
    # Share of each table the L1 cache holds (HugeCTR's gpucacheper).
    cache_fraction: float = Field(default=0.5, gt=0, le=1)
    # Below this running L1 hit rate, missed keys are inserted into the upper tiers before
    # the lookup returns; above it, in the background (HugeCTR's hit_rate_threshold).
    hit_rate_threshold: float = Field(default=0.9, ge=0, le=1)


def sources_written(tables: Iterable[TableConfig]) -> float | None:
    """When the newest file of the tables' sources was written (seconds since the epoch);
    None when a table has no source."""
    written = [None if t.source is None else source_written(t.source, t.format) for t in tables]
    return None if None in written else max(w for w in written if w is not None)


class VolatileDbConfig(Settings):
    """The L2 tier, between the L1 cache and RocksDB."""

    # hash_map: in the process's memory; redis / redis_cluster: shared by replicas.
    type: Literal["hash_map", "redis", "redis_cluster"] = "hash_map"
    # For type redis (redis_cluster: any one node); HPS_REDIS_URL overrides it. A cache, so its
    # own Redis (or database) whose memory policy may evict: never the online store's.
    url: str | None = None
    # Keys per table the tier holds.
    capacity: int = Field(default=10_000_000, ge=1)
    # Which keys go when a table is full.
    overflow_policy: OverflowPolicy = "evict_oldest"
    # Share of each table copied into L2 when it is loaded.
    initial_cache_rate: float = Field(default=0.0, ge=0, le=1)


class PersistentDbConfig(Settings):
    """The L3 tier: every row of every table."""

    # The store.
    type: Literal["rocksdb"] = "rocksdb"
    # Its folder; the workers of `featureline serve --workers N` add .worker-1, .worker-2, …
    path: str = "data/hps/rocksdb"


class UpdatesConfig(Settings):
    """Online updates from training jobs (hps.updates): each serving process applies every
    model's stream."""

    # The Redis of the update streams (durable data: the online store's Redis, not the L2
    # cache's); default: REDIS_URL.
    url: str | None = None
    # Consumer groups are named <group>@<host>:<persistent-store folder>.
    group: str = "hps"


class HpsConfig(Settings):
    """The parameter server: hps.yaml (settings at its top level or under hps:)."""

    # The models served, each with its tables.
    models: list[ModelConfig] = Field(min_length=1)
    # None: no online updates.
    updates: UpdatesConfig | None = None
    volatile_db: VolatileDbConfig = VolatileDbConfig()
    persistent_db: PersistentDbConfig = PersistentDbConfig()
    # Where the L1 cache lives: gpu (CuPy) when one is present with auto, else cpu.
    cache_device: Device = "auto"


def load_hps_config(path: str | Path) -> HpsConfig:
    """Our YAML (settings at the top level or under ``hps:``), or HugeCTR's ``ps.json``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("hps", f"no such file: {path}")
    if path.suffix == ".json":
        return from_hugectr(json.loads(path.read_text()), origin=str(path))
    data = yaml.safe_load(path.read_text()) or {}
    data = data.get("hps", data) if isinstance(data, dict) else data
    return _validated(data, path)


def _validated(data: Any, path: Path | str) -> HpsConfig:
    return validate(HpsConfig, data, origin=str(path), prefix=("hps",))


logger = logging.getLogger("featureline.hps")

# HugeCTR ps.json fields that configure its inference engine, not the parameter server.
_HUGECTR_ENGINE_FIELDS = {
    "dense_file", "network_file", "num_of_worker_buffer_in_pool", "deployed_device_list",
    "max_batch_size", "maxnum_catfeature_query_per_table_per_sample", "gpucache",
    "maxnum_des_feature_per_sample", "embedding_cache_type", "use_context_stream", "label_dim",
    "slot_num", "cat_feature_num", "i64_input_key", "use_static_table", "freeze_sparse",
}
_HUGECTR_MODEL_FIELDS = {"model", "sparse_files", "embedding_table_names",
                         "embedding_vecsize_per_table", "default_value_for_each_table",
                         "gpucacheper", "hit_rate_threshold"}
_HUGECTR_VOLATILE = {"hash_map": "hash_map", "parallel_hash_map": "hash_map",
                     "redis": "redis", "redis_cluster": "redis_cluster"}
_HUGECTR_POLICIES = {"evict_oldest": "evict_oldest", "evict_random": "evict_random",
                     "evict_least_used": "evict_least_used"}


def _ignored(fields: set[str], where: str) -> None:
    for name in sorted(fields):
        if name in _HUGECTR_ENGINE_FIELDS:
            logger.warning("%s.%s: configures HugeCTR's inference engine; ignored", where, name)
        else:
            logger.warning("%s.%s: unknown field; ignored", where, name)


def from_hugectr(data: dict[str, Any], origin: str = "ps.json") -> HpsConfig:
    """HugeCTR HPS's ``ps.json``, for the fields this server supports.

    Inference-engine fields are ignored with a warning naming them; a setting this server
    cannot honour (a Redis cluster volatile database, say) is a :class:`ConfigError`.
    """
    models = []
    for index, model in enumerate(data.get("models", [])):
        where = f"models[{index}]"
        _ignored(set(model) - _HUGECTR_MODEL_FIELDS, where)
        files = model.get("sparse_files", [])
        names = model.get("embedding_table_names") or [f"sparse_embedding{i}"
                                                       for i in range(len(files))]
        dims = model.get("embedding_vecsize_per_table", [])
        defaults = model.get("default_value_for_each_table", [0.0] * len(files))
        if not (len(files) == len(names) == len(dims) == len(defaults)):
            raise ConfigError(f"{where}.sparse_files", "sparse_files, embedding_table_names, "
                              "embedding_vecsize_per_table and default_value_for_each_table "
                              f"must have one entry per table (in {origin})")
        models.append({
            "name": model.get("model"),
            "cache_fraction": model.get("gpucacheper", 0.5),
            "hit_rate_threshold": model.get("hit_rate_threshold", 0.9),
            "tables": [{"name": n, "dim": d, "source": f, "format": "hugectr",
                        "default_value": v}
                       for f, n, d, v in zip(files, names, dims, defaults, strict=True)],
        })
    config: dict[str, Any] = {"models": models}
    volatile = data.get("volatile_db")
    if volatile:
        kind = volatile.get("type", "hash_map")
        if kind not in _HUGECTR_VOLATILE:
            raise ConfigError("volatile_db.type", f"{kind!r} is not supported yet (supported: "
                              f"{', '.join(_HUGECTR_VOLATILE)}) (in {origin})")
        policy = volatile.get("overflow_policy", "evict_oldest")
        config["volatile_db"] = {
            "type": _HUGECTR_VOLATILE[kind],
            # HugeCTR lists a cluster's nodes, comma-separated; one is enough to discover it.
            **({"url": f"redis://{volatile['address'].split(',')[0].strip()}"}
               if "address" in volatile else {}),
            "overflow_policy": _HUGECTR_POLICIES.get(policy, policy),
            "initial_cache_rate": volatile.get("initial_cache_rate", 0.0),
            **({"capacity": volatile["overflow_margin"]} if "overflow_margin" in volatile
               else {}),
        }
        _ignored(set(volatile) - {"type", "address", "overflow_policy", "initial_cache_rate",
                                  "overflow_margin"}, "volatile_db")
    persistent = data.get("persistent_db")
    if persistent:
        if persistent.get("type", "rocks_db") not in {"rocks_db", "rocksdb"}:
            raise ConfigError("persistent_db.type", f"{persistent['type']!r} is not supported "
                              f"(supported: rocks_db) (in {origin})")
        config["persistent_db"] = {"type": "rocksdb", **(
            {"path": persistent["path"]} if "path" in persistent else {})}
        _ignored(set(persistent) - {"type", "path"}, "persistent_db")
    _ignored(set(data) - {"models", "volatile_db", "persistent_db", "supportlonglong"}, "ps.json")
    return _validated(config, origin)
