"""``featureline.yaml``: one section per stage, each validated by the stage's own model.

Which file: ``--config``, else ``./featureline.yaml`` when present, else the embedded
defaults. A wrong or missing setting is a :class:`ConfigError` naming its key
(``etl.features[2].columns``), before any work starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from featureline.api.settings import ApiConfig, ServingConfig
from featureline.core.aggregations import GroupSpec
from featureline.core.derive import DeriveSpec
from featureline.core.drift import ChecksConfig
from featureline.core.settings import Settings, read_yaml, validate
from featureline.etl.config import OP_NAMES, EtlConfig, flags_applied
from featureline.feature_store.settings import FeatureStoreConfig
from featureline.stream.settings import StreamConfig
from featureline.trainer.settings import TrainerConfig

# Sections several stages read, written at the top of the file and copied into ``etl``.
SHARED_SECTIONS = ("aggregations", "derive", "checks")


class FeaturelineConfig(Settings):
    """The whole ``featureline.yaml``: one section per stage, and the aggregation features
    that several stages compute (``aggregations``, copied into ``etl``)."""

    # Aggregation features over time windows, defined once: groups of keys and features
    # (docs/features.md).
    aggregations: list[GroupSpec] = Field(default_factory=list)
    # Features named by an expression over other features, request columns and aggregation
    # outputs (docs/features.md, "Derived features").
    derive: list[DeriveSpec] = Field(default_factory=list)
    # The validation gate between the ETL and publish: thresholds of each check
    # (docs/validation.md).
    checks: ChecksConfig = ChecksConfig()
    etl: EtlConfig = Field(default_factory=EtlConfig)
    feature_store: FeatureStoreConfig = FeatureStoreConfig()
    api: ApiConfig = ApiConfig()
    stream: StreamConfig = StreamConfig()
    trainer: TrainerConfig = TrainerConfig()

    @model_validator(mode="before")
    @classmethod
    def _shared_sections_into_etl(cls, data: Any) -> Any:
        """The sections other stages read too live at the top of the file; the ETL gets a
        copy."""
        if not isinstance(data, dict):
            return data
        etl = data.get("etl") or {}
        if not isinstance(etl, dict):
            return data
        for key in SHARED_SECTIONS:  # a copy equal to the top level's is a dump read back
            differs = key in data and key in etl and etl[key] != data[key]
            if differs or (etl.get(key) and key not in data):
                raise ValueError(f"etl.{key}: write {key} at the top level of the file")
        shared = {key: data[key] for key in SHARED_SECTIONS if data.get(key)}
        return {**data, "etl": {**etl, **shared}} if shared else data

    def serving(self) -> ServingConfig:
        """What the API serves with: its section, the feature store's, the event log's, the
        ETL output."""
        return ServingConfig(api=self.api, feature_store=self.feature_store, stream=self.stream,
                             data=self.api.data or self.etl.output.path)


def parse_config(data: dict[str, Any], *, origin: str = "featureline.yaml") -> FeaturelineConfig:
    """Validate a mapping of sections; a problem raises :class:`ConfigError` naming the key."""
    return validate(FeaturelineConfig, data, origin=origin, tags=OP_NAMES)


def load_config(path: str | Path | None = None,
                etl_flags: Mapping[str, Any] | None = None) -> FeaturelineConfig:
    """Read ``featureline.yaml`` (or the embedded defaults when ``path`` is None), with the
    ETL's command-line flags (``etl.config.flags_applied``'s) applied before any check: a
    spec over a column that ``--categorical`` declares is checked against it."""
    data = {} if path is None else read_yaml(path)
    flagged = {name: value for name, value in (etl_flags or {}).items()
               if value is not None and value is not False}
    if flagged:
        data = {**data, "etl": flags_applied(data.get("etl") or {}, **flagged)}
    origins = [*([] if path is None else [str(path)]), *(["command-line flags"] if flagged else [])]
    return parse_config(data, origin=" with ".join(origins)) if origins else FeaturelineConfig()
