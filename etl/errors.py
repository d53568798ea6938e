"""Typed errors of the ETL stage; each names the offending key, value or path."""

from __future__ import annotations


class FeaturelineError(Exception):
    """Base class of every error Featureline raises on purpose."""


class NotFoundError(FeaturelineError, KeyError):
    """A name that is not there (a model, table, feature, service…); the message lists what
    is. The API answers these with 404."""

    def __str__(self) -> str:
        return str(self.args[0])  # KeyError's own str() would quote the message


class ConfigError(FeaturelineError):
    """A wrong or missing setting, found before any work starts.

    ``key`` is the dotted path of the setting (``features[2].columns``), so a user can find it.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


class LabelRuleError(ConfigError):
    """A label expression that cannot be parsed, e.g. ``--label "value >>= 4"``."""


class RawLogSchemaError(FeaturelineError):
    """The raw log lacks a column the configuration maps a role onto."""

    def __init__(self, path: str, column: str, available: list[str]) -> None:
        self.path = path
        self.column = column
        super().__init__(
            f"{path}: column {column!r} not found in the raw log (columns: {', '.join(available)})"
        )


class NoInputError(FeaturelineError):
    """The source path or glob matched no file, or every row was quarantined."""


class RapidsJarNotFoundError(ConfigError):
    """The gpu profile was asked for but the RAPIDS Accelerator jar is nowhere to be found."""
