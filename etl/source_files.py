"""The raw log's files, read as Spark's reader will read them, checked before Spark starts.

``CsvDialect`` is ``etl.source.options`` for CSV files, with Spark's option names and
defaults. ``check_source`` reads the first line (or the schema) of each local file and fails
in one line naming the file and the key where a mapped column is not there, so a wrong
separator or a misspelt column costs a second, not a Spark job (docs/ARCHITECTURE.md,
"Raw events").
"""

from __future__ import annotations

import codecs
import csv
import glob
import itertools
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from featureline.core.errors import ConfigError
from featureline.etl.config import AttributeFile, EtlConfig, ReaderSettings, SourceConfig
from featureline.etl.errors import NoInputError, RawLogSchemaError


@dataclass(frozen=True)
class CsvDialect:
    """How ``etl.source.options`` reads a CSV file: Spark's own option names and defaults."""

    options: dict[str, str]

    # Options the ETL's split of a plain line honours; any other one sends every line to
    # Spark's CSV parser.
    SPLIT_HONOURS = frozenset({"sep", "delimiter", "header", "encoding", "charset", "quote",
                               "nullValue", "comment"})

    @property
    def sep(self) -> str:
        sep = self.options.get("sep", self.options.get("delimiter", ","))
        return "\t" if sep == "\\t" else sep

    @property
    def header(self) -> bool:
        return self.options.get("header", "true").lower() == "true"

    @property
    def quote(self) -> str:
        return self.options.get("quote", '"')

    def names(self, first_line: str) -> list[str]:
        """The columns: the header's names, or Spark's ``_c0``, ``_c1``, … for a file without
        a header, as many as its first line has fields."""
        line = first_line.removeprefix("\ufeff")  # a byte order mark is no part of a name
        if self.quote:
            fields = next(csv.reader([line], delimiter=self.sep, quotechar=self.quote))
        else:
            fields = next(csv.reader([line], delimiter=self.sep, quoting=csv.QUOTE_NONE))
        return fields if self.header else [f"_c{i}" for i in range(len(fields))]

    def parser_options(self, corrupt_column: str) -> dict[str, str]:
        """The options of Spark's ``from_csv`` for one line: the file-level ones left out."""
        line_level = {k: v for k, v in self.options.items()
                      if k not in ("header", "encoding", "charset", "delimiter")}
        return {**line_level, "sep": self.sep, "mode": "PERMISSIVE",
                "columnNameOfCorruptRecord": corrupt_column}


def source_columns(source: SourceConfig, attributes: Sequence[str] = ()) -> dict[str, str]:
    """The log's column name → the name the job gives it: a role's name, or the column's safe
    name (``safe_name``); ``attributes``: context columns the attribute files hold, not the
    log."""
    mapping = {name: role for role, name in source.columns.model_dump().items() if name}
    for column in [*source.categorical, *source.continuous]:
        if column not in attributes:
            mapping[source.source_name(column)] = column
    return mapping


def attribute_columns(table: AttributeFile) -> dict[str, str]:
    """An attribute file's column name → the name the job gives it: its key ``KEY``, its
    ``valid_from`` ``VALID_FROM``, each attribute its safe name."""
    mapping = {table.key[table.key_role]: KEY}
    if table.valid_from is not None:
        mapping[table.valid_from] = VALID_FROM
    for column in table.columns:
        mapping[table.source_name(column)] = column
    return mapping


# An attribute file's key and valid_from columns, as the job names them.
KEY = "_attribute_key"
VALID_FROM = "_valid_from"


def _local_files(path: str) -> list[str] | None:
    """The files a local path or glob names (folders expanded, hidden files left out, as
    Spark's reader does); None for a remote URL or a brace glob, which only Spark reads."""
    if ("://" in path and not path.startswith("file://")) or "{" in path:
        return None
    files = []
    for found in sorted(glob.glob(path.removeprefix("file://"))):
        if os.path.isdir(found):
            files += [os.path.join(found, name) for name in sorted(os.listdir(found))
                      if not name.startswith((".", "_"))
                      and os.path.isfile(os.path.join(found, name))]
        else:
            files.append(found)
    return files


def _first_lines(file: str, encoding: str) -> Iterator[str]:
    with open(file, encoding=encoding, errors="replace", newline="") as text:
        for line in text:
            if line.strip():
                yield line.rstrip("\r\n")


def check_config_files(config: EtlConfig) -> None:
    """``check_source`` of the log and of every attribute file."""
    check_source(config.source, source_columns(config.source, config.attribute_columns()))
    for index, table in enumerate(config.attributes):
        check_source(table, attribute_columns(table), key=f"etl.attributes[{index}]",
                     required=list(attribute_columns(table)))


def check_source(source: ReaderSettings, wanted: dict[str, str], key: str = "etl.source",
                 required: Sequence[str] | None = None) -> list[str]:
    """The local files of ``source`` hold the columns ``wanted`` maps (CSV: every one in the
    header; JSON lines: the ``required`` ones, by default the roles, in the first record;
    Parquet: every one in the schema): the files checked; a :class:`RawLogSchemaError`
    naming the file and the column, or a :class:`ConfigError` naming the key, otherwise.
    Remote paths are left to Spark."""
    files = _local_files(source.path)
    if files is None:
        return []
    if not files and key == "etl.source":
        raise NoInputError(f"{source.path}: no file or folder matches the source path")
    if not files:
        raise ConfigError(f"{key}.path", f"{source.path}: no file or folder matches it")
    options, encoding = source.reader_options(), source.encoding
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ConfigError(f"{key}.options.encoding", f"unknown encoding {encoding!r}") from None
    if required is None and isinstance(source, SourceConfig):
        required = [getattr(source.columns, role) for role in ("user_id", "item_id", "ts",
                                                                 "event_type")
                    if getattr(source.columns, role) is not None]
    for file in files:
        if source.format == "parquet":
            import pyarrow.parquet as pq

            names = pq.read_schema(file).names
            missing = [name for name in wanted if name not in names]
        else:
            first = next(_first_lines(file, encoding), None)
            if first is None:
                continue
            if source.format == "csv":
                names = CsvDialect(options).names(first)
                missing = [name for name in wanted if name not in names]
            else:
                names, missing = _json_names(_first_lines(file, encoding),
                                             list(required or []), file)
        if missing:
            raise RawLogSchemaError(file, missing[0], names, separated=source.format == "csv")
    return files


# Records of a JSON lines file its check reads: a required column none of them holds is
# missing from the file (one record without it is a quarantined row, not a refused file).
JSON_RECORDS_CHECKED = 200


def _json_names(lines: Iterator[str], required: list[str], file: str
                ) -> tuple[list[str], list[str]]:
    """The members of the file's first records, and the required ones none of them holds."""
    names: dict[str, None] = {}
    first = None
    for line in itertools.islice(lines, JSON_RECORDS_CHECKED):
        first = first if first is not None else line
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            names.update(dict.fromkeys(record))
    if not names:
        raise RawLogSchemaError(file, "(a JSON object per line)", [(first or "")[:80]])
    return list(names), [name for name in required if name not in names]
