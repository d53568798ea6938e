"""Typed errors of the feature store stage; each names the path, server or name at fault."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from featureline.core.errors import FeaturelineError, NotFoundError, UnavailableError
from featureline.core.redis import UNAVAILABLE_ERRORS, redact


class FeatureStoreError(FeaturelineError):
    """Base class of the feature store's errors."""


class OnlineStoreUnavailableError(FeatureStoreError, UnavailableError):
    """The Redis online store did not answer; a caller may retry."""

    retry_after = True
    hint = ("start the embedded server (`featureline redis start`) or set REDIS_URL to a "
            "running Redis")

    def __init__(self, url: str, reason: str) -> None:
        self.url = redact(url)
        super().__init__(f"online store {self.url} is unavailable: {reason}")


class OnlineStoreEmptyError(FeatureStoreError, UnavailableError):
    """The online store answers but holds no published dataset: its Redis restarted empty,
    or nothing was published into it. Answering not_found for every entity would be wrong."""

    retry_after = True
    hint = "republish the served dataset: featureline publish --repair"

    def __init__(self, project: str) -> None:
        self.project = project
        super().__init__(f"the online store holds no published dataset of project "
                         f"{project!r} (its Redis restarted empty, or nothing was published): "
                         "run `featureline publish --repair`")


@contextmanager
def online_store_errors(url: str) -> Iterator[None]:
    """The Redis client's failures (inside Feast's calls too) become
    :class:`OnlineStoreUnavailableError`."""
    try:
        yield
    except UNAVAILABLE_ERRORS as exc:
        raise OnlineStoreUnavailableError(url, str(exc) or type(exc).__name__) from exc


class UnknownFeatureServiceError(FeatureStoreError, NotFoundError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(f"unknown feature service {name!r} (known: {', '.join(known)})")


class EntityRowsError(FeatureStoreError):
    """The entity rows of a training set lack a column or hold unusable values."""

    exit_code = 2
    hint = "entity rows: Parquet with the join keys (user_id, item_id) and event_timestamp"

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


class DriftRefusedError(FeatureStoreError):
    """The output failed the validation gate: publishing it would put a bad day online."""

    exit_code = 2
    hint = ("look at the breaches (featureline validate OUTPUT); publish anyway with "
            "--accept-drift \"<why>\", which is recorded in the output")

    def __init__(self, output: str, breaches: list[str]) -> None:
        self.output = output
        self.breaches = breaches
        super().__init__(f"{output} failed the validation gate ({len(breaches)} breach(es): "
                         f"{'; '.join(breaches)}); publish refuses it")


class TilesError(FeatureStoreError):
    """An output's aggregation tiles do not fit the spec they are read with."""

    exit_code = 2
    hint = "run `featureline etl run` with the aggregations spec the tiles are read with"
