"""Typed errors of the ETL stage; each names the offending key, value or path."""

from __future__ import annotations

from featureline.core.errors import ConfigError, FeaturelineError


class IncompatibleStateError(FeaturelineError):
    """An incremental run cannot extend the output: no state there, or one written with
    other settings, state version or vocabulary lineage (the message names which)."""

    exit_code = 2
    hint = "run `featureline etl run` without --incremental (a full run) to start over"


class LabelRuleError(ConfigError):
    """A label expression that cannot be parsed, e.g. ``--label "value >>= 4"``."""


class RawLogSchemaError(FeaturelineError):
    """The raw log lacks a column the configuration maps a role onto."""

    exit_code = 2
    hint = "map the role onto the log's column in etl.source.columns, or fix the log"

    def __init__(self, path: str, column: str, available: list[str], *,
                 separated: bool = False) -> None:
        self.path = path
        self.column = column
        message = f"{path}: column {column!r} not found in the raw log (columns: " \
                  f"{', '.join(available)})"
        if separated and len(available) == 1:
            found = [name for sep, name in _SEPARATORS.items() if sep in available[0]]
            message += (f"; the header reads as one column: is it {found[0]}-separated? "
                        "set etl.source.options.sep" if found else "")
        super().__init__(message)


# Separators a header read as one column may hold, by name.
_SEPARATORS = {"\t": "tab", ";": "semicolon", "|": "pipe", ",": "comma", " ": "space"}


class NoInputError(FeaturelineError):
    """The source path or glob matched no file, or every row was quarantined."""

    exit_code = 2
    hint = "check --input (etl.source.path): a file, a folder or a glob of raw logs"


class AttributeFileError(FeaturelineError):
    """An attribute file holds a key on two rows (of the same time, with ``valid_from``)."""

    exit_code = 2
    hint = ("keep one row per key, or give valid_from: the column from which each row "
            "holds (etl.attributes)")

    def __init__(self, name: str, path: str, column: str, key: str,
                 valid_from: str | None) -> None:
        self.name = name
        when = f" from the same {valid_from}" if valid_from else ""
        super().__init__(f"{path} ({name}): key {key!r} of column {column!r} is on two "
                         f"rows{when}")


class MostlyQuarantinedError(FeaturelineError):
    """One reason quarantined more than half the rows read: most likely a setting that does
    not fit the log (the message names it); nothing is written."""

    exit_code = 2

    def __init__(self, reason: str, rows: int, read: int, setting: str) -> None:
        self.reason = reason
        super().__init__(f"{reason} quarantined {rows:,} of {read:,} rows, more than half: "
                         f"check {setting}; nothing was written")


class RapidsJarNotFoundError(ConfigError):
    """The gpu profile was asked for but the RAPIDS Accelerator jar is nowhere to be found."""


class PluginFetchError(FeaturelineError):
    """The RAPIDS Accelerator jar could not be fetched from Maven; the message says why."""

    hint = "check that Maven (mvn) is installed and Maven Central is reachable, or pass --jar"


class ClassArchiveError(FeaturelineError):
    """Spark's classes could not be archived for the driver JVM."""

    hint = "Spark sessions start without the archive (slower, nothing else changes)"


class GpuPlanError(FeaturelineError):
    """The explain-only run left no plan to read (the plugin did not load or log)."""
