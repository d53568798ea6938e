"""Raw ids ↔ encoded ids with the ETL's own vocabularies (``artifacts/categorify/<column>``,
the metadata.json contract), so serving encodes exactly as training did."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq

from featureline.core.errors import NotFoundError, UnprocessableError
from featureline.core.metadata import FIRST_ID, OOV_ID, VOCABULARY_DIR, encoded_name


class UnknownVocabularyError(NotFoundError):
    def __init__(self, column: str, known: list[str]) -> None:
        self.column = column
        super().__init__(f"no vocabulary for {column!r} (known: {', '.join(known)})")


class AmbiguousIdError(UnprocessableError):
    """An encoded id that stands for no single raw id (padding, out-of-vocabulary)."""

    def __init__(self, column: str, encoded: int) -> None:
        self.column = column
        super().__init__(None, f"{encoded_name(column)} {encoded} is not one {column} (ids below "
                         f"{FIRST_ID} are padding and out-of-vocabulary); send the raw id")


class Vocabularies:
    """column (``user_id``) → raw value → encoded id, and back."""

    def __init__(self, tables: dict[str, dict[str, int]]) -> None:
        self.encoding = tables
        self.decoding = {column: {i: v for v, i in table.items()}
                         for column, table in tables.items()}

    @classmethod
    def from_output(cls, output: str | Path) -> Vocabularies:
        root = Path(output) / VOCABULARY_DIR
        tables = {}
        for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
            table = pq.read_table(folder, columns=["value", "id"])
            tables[folder.name] = dict(zip(table["value"].to_pylist(), table["id"].to_pylist(),
                                           strict=True))
        return cls(tables)

    def _table(self, column: str, tables: dict) -> dict:
        if column not in tables:
            raise UnknownVocabularyError(column, sorted(tables))
        return tables[column]

    def encode(self, column: str, values: Sequence[str]) -> list[int]:
        table = self._table(column, self.encoding)
        return [table.get(str(v), OOV_ID) for v in values]

    def decode(self, column: str, ids: Sequence[int]) -> list[str]:
        table = self._table(column, self.decoding)
        raw = []
        for encoded in ids:
            if encoded not in table:
                raise AmbiguousIdError(column, encoded)
            raw.append(table[encoded])
        return raw

    def column_of(self, feature: str) -> str | None:
        """``user_id_cat`` → ``user_id`` when that column has a vocabulary."""
        return next((c for c in self.encoding if encoded_name(c) == feature), None)
