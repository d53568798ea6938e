"""The base of every settings section, durations, and validation whose errors name the key.

Each stage owns its section of ``featureline.yaml`` as a :class:`Settings` model; the launcher
composes them. :func:`validate` turns pydantic's first error into a :class:`ConfigError`
whose key is the dotted path a user finds in the file (``etl.features[2].columns``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

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
        errors = exc.errors()
        # A union's branches are named in the locations by their model: not keys of the file.
        tags = {*tags, *_model_names(model)}
        # A misspelt key also leaves the key it meant missing: name the misspelling (one that
        # no branch of a union knows).
        error = next((e for e in errors if e["type"] == "extra_forbidden" and str(e["loc"][-1])
                      not in _known_keys(model, e["loc"][:-1])), errors[0])
        key = _location(error["loc"], prefix, tags)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key" + _nearest(str(error["loc"][-1]),
                                               _known_keys(model, error["loc"][:-1]))
        inner = _INNER_KEY.match(message)
        if inner:
            key = inner.group(1) if key == "(root)" else f"{key}.{inner.group(1)}"
            message = inner.group(2)
        raise ConfigError(key, f"{message} (in {origin})") from None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The settings models a field's annotation holds (through lists, unions, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def _model_names(model: type[BaseModel], seen: set[str] | None = None) -> set[str]:
    """The names of every settings model reachable from ``model``."""
    seen = set() if seen is None else seen
    if model.__name__ not in seen:
        seen.add(model.__name__)
        for field in model.model_fields.values():
            for inner in _models_in(field.annotation):
                _model_names(inner, seen)
    return seen


def _known_keys(model: type[BaseModel], loc: Sequence[Any]) -> set[str]:
    """The keys the section at ``loc`` may hold (every branch of a union's, merged)."""
    models = [model]
    for part in loc:
        if isinstance(part, int):
            continue
        inner = [m for current in models if part in current.model_fields
                 for m in _models_in(current.model_fields[part].annotation)]
        models = inner or models  # a union's tag or branch names no field: the same models
    return {name for current in models for name in current.model_fields}


# Spark reader options a user may write beside etl.source's keys.
_READER_OPTIONS = {"sep", "delimiter", "header", "quote", "escape", "encoding", "charset",
                   "nullValue", "comment", "multiLine", "inferSchema", "mergeSchema"}


def _nearest(unknown: str, known: set[str]) -> str:
    """``; did you mean `x`?`` for the known key nearest an unknown one, or nothing."""
    if unknown in _READER_OPTIONS and "options" in known:
        return f"; a reader option: write it under `options` ({{{unknown}: ...}})"
    close = difflib.get_close_matches(unknown, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


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
