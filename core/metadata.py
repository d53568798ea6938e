"""The ``metadata.json`` contract between the ETL and every stage that reads its output.

The ETL writes one ``metadata.json`` per output folder (docs/ARCHITECTURE.md, "Contracts");
the feature store, the parameter server's exports and the API read it and the vocabularies
beside it. The id convention of every categorical feature: 0 is padding, 1 is
out-of-vocabulary (unseen, null, or below the frequency threshold), known values start at 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from featureline.core.errors import MetadataNotFoundError

METADATA_FILE = "metadata.json"
# Where the ETL writes and every later stage reads, unless configured otherwise.
DEFAULT_OUTPUT = "data/output"
PADDING_ID = 0
OOV_ID = 1
FIRST_ID = 2
# The timestamp column of the entity tables: a value at t uses only events before t.
EVENT_TIMESTAMP = "event_timestamp"
# artifacts/categorify/<column>/: Parquet (value, id, count), one row per known value.
VOCABULARY_DIR = "artifacts/categorify"


def encoded_name(column: str) -> str:
    """The feature holding ``column``'s encoded ids: ``user_id`` → ``user_id_cat``."""
    return f"{column}_cat"


def compatible(lineage: list[str], other: list[str]) -> bool:
    """Whether ids encoded with two vocabularies, given by their lineages (root first, the
    vocabulary's own version last), mean the same: one extends the other, or they are one."""
    return bool(lineage and other) and (lineage[-1] in other or other[-1] in lineage)


def dataset_version(metadata: dict[str, Any]) -> str:
    """The version stamp of an ETL output; outputs written before stamps existed get one from
    their creation time."""
    version = (metadata.get("dataset") or {}).get("version")
    return version or f"unversioned:{metadata.get('created_at', '')}"


def metadata_path(output: str | Path) -> Path:
    return Path(output) / METADATA_FILE


def read_metadata(output: str | Path) -> dict[str, Any]:
    """The ``metadata.json`` of an ETL output folder."""
    path = metadata_path(output)
    if not path.is_file():
        raise MetadataNotFoundError(str(output))
    return json.loads(path.read_text())
