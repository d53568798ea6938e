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

from core.errors import MetadataNotFoundError

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


def metadata_path(output: str | Path) -> Path:
    return Path(output) / METADATA_FILE


def read_metadata(output: str | Path) -> dict[str, Any]:
    """The ``metadata.json`` of an ETL output folder."""
    path = metadata_path(output)
    if not path.is_file():
        raise MetadataNotFoundError(str(output))
    return json.loads(path.read_text())
