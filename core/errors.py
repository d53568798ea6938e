"""The error base classes; each error carries the HTTP status the API answers it with.

As Feast's errors do, the status travels with the error: the API maps any error by asking it
(``http_status``, ``retry_after``, ``fields()``), never by a hand-kept list of types.
"""

from __future__ import annotations

from typing import Any, ClassVar


class FeaturelineError(Exception):
    """Base class of every error Featureline raises on purpose."""

    # The status the API answers with; 500 unless the error says the caller can fix it.
    http_status: ClassVar[int] = 500
    # A 503 that clears by itself: the API adds a ``Retry-After`` header.
    retry_after: ClassVar[bool] = False
    # The command line's exit status: 2 for a usage or configuration error (the user fixes
    # the command or the file), 1 for a failure while running.
    exit_code: ClassVar[int] = 1
    # What to do about it, printed by the command line under the error's one line.
    hint: ClassVar[str | None] = None

    def fields(self) -> dict[str, Any]:
        """Extra members of the API's error body (``field``, ``limit``…); none by default."""
        return {}


class NotFoundError(FeaturelineError, KeyError):
    """A name that is not there (a model, table, feature, service…); the message lists what
    is."""

    http_status = 404
    exit_code = 2

    def __str__(self) -> str:
        return str(self.args[0])  # KeyError's own str() would quote the message


class UnprocessableError(FeaturelineError):
    """A request whose form is valid but whose content names something unusable; ``field``
    is where it is."""

    http_status = 422
    exit_code = 2

    def __init__(self, field: str | None, message: str) -> None:
        self.field = field
        super().__init__(message)

    def fields(self) -> dict[str, Any]:
        return {"field": self.field} if self.field else {}


class UnavailableError(FeaturelineError):
    """A part the request needs is not there (not configured, or not answering)."""

    http_status = 503


class ConfigError(FeaturelineError):
    """A wrong or missing setting, found before any work starts.

    ``key`` is the dotted path of the setting (``features[2].columns``), so a user can find it.
    """

    exit_code = 2
    hint = "fix that setting in the configuration file (--config) or the flag that sets it"

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


class OutputLockedError(FeaturelineError):
    """Another run is writing the same output folder."""

    def __init__(self, path: str, holder: str) -> None:
        self.path = path
        super().__init__(f"{path}: another run is writing this output (lock held by "
                         f"{holder}); wait for it or write elsewhere")


class MetadataFormatError(FeaturelineError):
    """A metadata.json this Featureline cannot read: a newer format, or a section that does
    not fit the contract; the message names the file, the version and the member."""

    exit_code = 2
    hint = "run the ETL again with this Featureline, or read the output with the one that wrote it"

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(f"{path}: {problem}")


class MetadataNotFoundError(FeaturelineError):
    """An ETL output folder without metadata.json (the ETL has not run there)."""

    exit_code = 2
    hint = ("run `featureline etl run` first, or point --data (api.data, etl.output.path) at "
            "an ETL output folder")

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"{path}: no metadata.json (no ETL output there)")
