"""Short field names (1–3 characters) for the TFRecord layout; one map, kept in metadata.json."""

from __future__ import annotations

import itertools
import string

from featureline.core.errors import ConfigError


def _initials(name: str) -> str:
    parts = [p for p in name.split("_") if p]
    return "".join(p[0] for p in parts)[:3].lower() or "f"


def _codes() -> itertools.chain[str]:
    letters = string.ascii_lowercase
    return itertools.chain(letters, ("".join(p) for p in itertools.product(letters, repeat=2)))


def assign_short_names(
    names: list[str], overrides: dict[str, str], reserved: frozenset[str] | set[str] = frozenset()
) -> dict[str, str]:
    """Long name → unique short name: the configured one, else initials, else a free code."""
    unknown = set(overrides) - set(names)
    if unknown:
        raise ConfigError("features[].short_names",
                          f"no feature named {sorted(unknown)} (features: {names})")
    taken = set(reserved)
    result: dict[str, str] = {}
    for name in names:
        if name in overrides:
            if overrides[name] in taken:
                raise ConfigError("features[].short_names",
                                  f"short name {overrides[name]!r} is used twice")
            result[name] = overrides[name]
            taken.add(overrides[name])
    for name in names:
        if name in result:
            continue
        candidate = _initials(name)
        if candidate in taken:
            candidate = next(code for code in _codes() if code not in taken)
        result[name] = candidate
        taken.add(candidate)
    return result
