"""Typed errors of the feature store stage; each names the path, server or name at fault."""

from __future__ import annotations

from etl.errors import FeaturelineError, NotFoundError


class FeatureStoreError(FeaturelineError):
    """Base class of the feature store's errors."""


class MetadataNotFoundError(FeatureStoreError):
    """The ETL output Feast should publish has no metadata.json (the ETL has not run there)."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"{path}: no metadata.json; run `featureline etl run` first "
                         "or pass --data <ETL output folder>")


class OnlineStoreUnavailableError(FeatureStoreError):
    """The Redis online store did not answer."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        super().__init__(f"online store {url} is unreachable: {reason}")


class UnknownFeatureServiceError(FeatureStoreError, NotFoundError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(f"unknown feature service {name!r} (known: {', '.join(known)})")


class EntityRowsError(FeatureStoreError):
    """The entity rows of a training set lack a column or hold unusable values."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")
