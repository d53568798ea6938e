"""The base of every settings section, durations, and validation whose errors name the key.

Each stage owns its section of ``featureline.yaml`` as a :class:`Settings` model; the launcher
composes them. :func:`validate` turns pydantic's first error into a :class:`ConfigError`
whose key is the dotted path a user finds in the file (``etl.features[2].columns``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from featureline.core.errors import ConfigError

_DURATION = re.compile(r"^(\d+)([smhd])$")
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Cross-field checks name their key at the start of the message ("features[2].columns: …").
_INNER_KEY = re.compile(r"^([A-Za-z_][\w\[\].]*): (.*)$", re.DOTALL)

Model = TypeVar("Model", bound=BaseModel)


class Settings(BaseModel):
    """A settings section: unknown keys are errors, values never change after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def duration_seconds(text: str) -> int:
    """``"90s"``, ``"15m"``, ``"24h"``, ``"7d"`` → seconds."""
    match = _DURATION.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration like 30m, 1h, 24h or 7d")
    return int(match.group(1)) * _DURATION_SECONDS[match.group(2)]


def _checked_duration(text: str) -> str:
    duration_seconds(text)
    return text


# A setting that is a duration, kept as written ("30m", "24h", "7d") and checked on load.
Duration = Annotated[str, AfterValidator(_checked_duration)]


def _location(loc: Sequence[Any], prefix: Sequence[str], tags: Collection[str]) -> str:
    parts: list[str] = []
    for part in (*prefix, *loc):
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif part in tags:
            continue  # a discriminated union's tag, not a key in the file
        else:
            parts.append(f".{part}" if parts else str(part))
    return "".join(parts) or "(root)"


def validate(model: type[Model], data: Any, *, origin: str, prefix: Sequence[str] = (),
             tags: Collection[str] = ()) -> Model:
    """``model`` from ``data``; a problem raises :class:`ConfigError` naming the key.

    ``prefix``: where ``data`` sits in the file (``("hps",)``); ``tags``: discriminator values
    pydantic puts into error locations, left out of the key.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = _location(error["loc"], prefix, tags)
        message = error["msg"].removeprefix("Value error, ")
        inner = _INNER_KEY.match(message)
        if inner:
            key = inner.group(1) if key == "(root)" else f"{key}.{inner.group(1)}"
            message = inner.group(2)
        raise ConfigError(key, f"{message} (in {origin})") from None


def read_yaml(path: str | Path, key: str = "--config") -> dict[str, Any]:
    """A YAML file holding a mapping; a missing file or bad YAML is a :class:`ConfigError`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(key, f"no such file: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("(root)", f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("(root)", f"{path} must hold a mapping of sections")
    return data
