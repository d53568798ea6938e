"""Where a run's vocabularies come from, and their lineage (docs/ARCHITECTURE.md,
"Categorical ids").

By default a run extends the vocabularies of the output folder it replaces, so known values
keep their ids; ``--vocabulary-from PATH`` extends another output's; ``--refit-vocabularies``
starts a new lineage. Each categorical column records its vocabulary's version, its parent's
and its lineage (every version from the lineage's root to this one): two vocabularies encode
alike exactly when one's version is in the other's lineage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from featureline.core.errors import ConfigError
from featureline.core.metadata import METADATA_FILE, VOCABULARY_DIR, read_metadata
from featureline.etl.config import VocabularyConfig
from featureline.etl.features.categorify import summarize


@dataclass(frozen=True)
class PreviousVocabularies:
    """The vocabularies a run extends: the output they come from, each column's table (value,
    id), and each column's lineage as that output recorded it."""

    output: Path
    tables: dict[str, DataFrame]
    lineages: dict[str, list[str]]
    # Each column's (value, count): how many of that output's training rows hold the value.
    counts: dict[str, DataFrame]


def previous_output(settings: VocabularyConfig, output: Path) -> Path | None:
    """The output whose vocabularies this run extends; None for a new lineage."""
    if settings.refit:
        return None
    if settings.previous is not None:
        previous = Path(settings.previous)
        if not (previous / METADATA_FILE).is_file():
            raise ConfigError("--vocabulary-from", f"{previous}: no {METADATA_FILE} there "
                              "(expected an ETL output folder)")
        return previous
    return output if (output / METADATA_FILE).is_file() else None


def load_previous(spark: SparkSession, output: Path, columns: list[str]) -> PreviousVocabularies:
    """The vocabularies of ``columns`` in ``output`` (columns it has none for start afresh);
    an output written before lineages were recorded starts one with its own version."""
    recorded = read_metadata(output).vocabularies
    tables, lineages, counts = {}, {}, {}
    for column in columns:
        folder = output / VOCABULARY_DIR / column
        if folder.is_dir():
            table = spark.read.parquet(str(folder))
            tables[column], counts[column] = table.select("value", "id"), table.select(
                "value", "count")
            lineages[column] = (list(recorded[column].lineage) if column in recorded
                                else [summarize(tables[column])[1]])
    return PreviousVocabularies(output.resolve(), tables, lineages, counts)


def lineage_entry(version: str, previous: list[str] | None, path: str) -> dict[str, Any]:
    """metadata.json's record of one column's vocabulary: an extension appends its version to
    its parent's lineage; an unchanged vocabulary keeps the lineage it had."""
    lineage = list(previous or [])
    if not lineage or lineage[-1] != version:
        lineage.append(version)
    parent = lineage[-2] if len(lineage) > 1 else None
    return {"version": version, "parent": parent, "lineage": lineage, "path": path}
