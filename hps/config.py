"""The parameter server's YAML configuration (pydantic-validated; errors name the key)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from etl.errors import ConfigError
from hps.cache import Device
from hps.formats import Format
from hps.slots import OverflowPolicy


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TableConfig(_Model):
    name: str
    dim: int = Field(ge=1)
    # A HugeCTR folder, a Parquet file or "keys.npy,vectors.npy"; None: already in L3.
    source: str | None = None
    format: Format = "hugectr"
    # Every element of the vector returned for a key no tier holds.
    default_value: float = 0.0


class ModelConfig(_Model):
    name: str
    tables: list[TableConfig] = Field(min_length=1)
    # Share of each table the L1 cache holds (HugeCTR's gpucacheper).
    cache_fraction: float = Field(default=0.5, gt=0, le=1)


class VolatileDbConfig(_Model):
    type: Literal["hash_map"] = "hash_map"
    capacity: int = Field(default=10_000_000, ge=1)
    overflow_policy: OverflowPolicy = "evict_oldest"
    # Share of each table copied into L2 when it is loaded.
    initial_cache_rate: float = Field(default=0.0, ge=0, le=1)


class PersistentDbConfig(_Model):
    type: Literal["rocksdb"] = "rocksdb"
    path: str = "data/hps/rocksdb"


class HpsConfig(_Model):
    models: list[ModelConfig] = Field(min_length=1)
    volatile_db: VolatileDbConfig = VolatileDbConfig()
    persistent_db: PersistentDbConfig = PersistentDbConfig()
    cache_device: Device = "auto"


def load_hps_config(path: str | Path) -> HpsConfig:
    """A YAML file holding the HPS settings, at its top level or under ``hps:``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("hps", f"no such file: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    data = data.get("hps", data) if isinstance(data, dict) else data
    try:
        return HpsConfig.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(p) for p in ("hps", *error["loc"]))
        raise ConfigError(key, f"{error['msg']} (in {path})") from None
