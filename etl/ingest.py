"""Ingest and validate: raw log rows → typed events, and every rejected row with its reason.

Every source format is first read into one shape — the original record text plus each
configured column as a string — so that one set of built-in Spark SQL checks decides every
row, whatever the format. The first failing check names the row's quarantine reason.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from etl.config import REQUIRED_ROLES, EtlConfig, SourceConfig, ValidationConfig
from etl.errors import NoInputError, RawLogSchemaError

RECORD = "record"
REASON = "reason"
FIELD = "field"
SOURCE_FILE = "source_file"
_MALFORMED = "_malformed"
_CORRUPT = "_corrupt_record"
# Numeric timestamps at or above this are milliseconds under ts_unit: auto (year 5138 in s).
_MILLIS_THRESHOLD = 1e11

# Reason codes, in the order the checks run; metadata.json counts rows by these.
REASONS = (
    "malformed_record",
    *(f"missing_{role}" for role in REQUIRED_ROLES),
    "bad_timestamp",
    "timestamp_out_of_window",
    "unknown_event_type",
    "bad_number",
    "non_finite_number",
)


@dataclass(frozen=True)
class SourceColumns:
    """Source column name → canonical name, for every column the job reads."""

    mapping: dict[str, str]

    @classmethod
    def of(cls, source: SourceConfig) -> SourceColumns:
        roles = source.columns.model_dump()
        mapping = {name: role for role, name in roles.items() if name}
        for column in [*source.categorical, *source.continuous]:
            mapping[column] = column
        return cls(mapping)

    @property
    def names(self) -> list[str]:
        return list(self.mapping)


def _string_schema(columns: SourceColumns) -> T.StructType:
    fields = [T.StructField(name, T.StringType()) for name in columns.names]
    return T.StructType([*fields, T.StructField(_CORRUPT, T.StringType())])


def _parsed_text(text: DataFrame, parsed: Column, columns: SourceColumns) -> DataFrame:
    blank = F.trim(F.col("value")) == ""
    return text.select(
        F.col("value").alias(RECORD),
        F.input_file_name().alias(SOURCE_FILE),
        (blank | parsed[_CORRUPT].isNotNull()).alias(_MALFORMED),
        *(parsed[name].alias(canonical) for name, canonical in columns.mapping.items()),
    )


def _read_jsonl(spark: SparkSession, source: SourceConfig, columns: SourceColumns) -> DataFrame:
    text = spark.read.text(source.path)
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
    parsed = F.from_json("value", _string_schema(columns), options)
    return _parsed_text(text, parsed, columns)


def _read_csv(spark: SparkSession, source: SourceConfig, columns: SourceColumns) -> DataFrame:
    text = spark.read.text(source.path)
    first = text.limit(1).collect()
    if not first:
        raise NoInputError(f"{source.path}: no rows")
    header_line = first[0]["value"]
    header = next(csv.reader([header_line], delimiter=source.csv_delimiter))
    for name in columns.names:
        if name not in header:
            raise RawLogSchemaError(source.path, name, header)
    # Read every header column so that a row's field count is checked against the header.
    schema = T.StructType([T.StructField(name, T.StringType()) for name in header]
                          + [T.StructField(_CORRUPT, T.StringType())])
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT,
               "sep": source.csv_delimiter}
    body = text.where(F.col("value") != F.lit(header_line))
    parsed = F.from_csv("value", schema.simpleString(), options)
    return _parsed_text(body, parsed, columns)


def _read_parquet(spark: SparkSession, source: SourceConfig, columns: SourceColumns) -> DataFrame:
    table = spark.read.parquet(source.path)
    for name in columns.names:
        if name not in table.columns:
            raise RawLogSchemaError(source.path, name, table.columns)
    return table.select(
        F.to_json(F.struct(*table.columns)).alias(RECORD),
        F.input_file_name().alias(SOURCE_FILE),
        F.lit(False).alias(_MALFORMED),
        *(F.col(f"`{name}`").cast("string").alias(canonical)
          for name, canonical in columns.mapping.items()),
    )


_READERS = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}


def read_raw(spark: SparkSession, source: SourceConfig) -> DataFrame:
    """The raw log as (record, source_file, _malformed, one string column per canonical name)."""
    try:
        return _READERS[source.format](spark, source, SourceColumns.of(source))
    except Exception as exc:  # Spark's own "path does not exist" is an AnalysisException
        if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
            raise NoInputError(f"{source.path}: no file matches the source path") from None
        raise


def _unquoted(column: Column) -> Column:
    # A bare NaN/Infinity token in JSON reaches us as its raw text, quotes included.
    return F.regexp_replace(F.trim(column), r'^"(.*)"$', "$1")


def _timestamp(text: Column, validation: ValidationConfig) -> Column:
    """ISO-8601 text or epoch seconds / milliseconds → timestamp; null when unparseable."""
    number = text.try_cast("double")
    if validation.ts_unit == "ms":
        seconds = number / 1000
    elif validation.ts_unit == "s":
        seconds = number
    else:
        seconds = F.when(F.abs(number) >= _MILLIS_THRESHOLD, number / 1000).otherwise(number)
    finite = ~F.isnan(seconds) & (F.abs(seconds) < _MILLIS_THRESHOLD)
    from_number = F.when(finite, F.timestamp_micros((seconds * 1_000_000).cast("long")))
    return F.when(number.isNotNull(), from_number).otherwise(text.try_cast("timestamp"))


def _is_infinite(column: Column) -> Column:
    return F.abs(column) == F.lit(float("inf"))


def validate(raw: DataFrame, config: EtlConfig) -> DataFrame:
    """Typed columns plus ``reason`` / ``field``: null for a good row, else why it is rejected."""
    numeric = ["value"] if config.source.columns.value else []
    numeric += config.source.continuous
    text = {name: F.trim(F.col(name)) for name in REQUIRED_ROLES}
    ts = _timestamp(text["ts"], config.validation)
    numbers = {name: _unquoted(F.col(name)) for name in numeric}
    parsed = {name: numbers[name].try_cast("double") for name in numeric}

    checks: list[tuple[Column, str, str | None]] = [(F.col(_MALFORMED), "malformed_record", None)]
    checks += [((text[role].isNull()) | (text[role] == ""), f"missing_{role}", role)
               for role in REQUIRED_ROLES]
    window = (F.lit(config.validation.ts_min), F.lit(config.validation.ts_max))
    checks += [
        (ts.isNull(), "bad_timestamp", "ts"),
        ((ts < window[0]) | (ts >= window[1]), "timestamp_out_of_window", "ts"),
        (~text["event_type"].isin(config.validation.event_types), "unknown_event_type",
         "event_type"),
    ]
    checks += [((numbers[n] != "") & parsed[n].isNull(), "bad_number", n) for n in numeric]
    checks += [(F.isnan(parsed[n]) | _is_infinite(parsed[n]), "non_finite_number", n)
               for n in numeric]

    reason: Column = F.lit(None).cast("string")
    field: Column = F.lit(None).cast("string")
    for condition, code, name in reversed(checks):
        reason = F.when(condition, F.lit(code)).otherwise(reason)
        field = F.when(condition, F.lit(name)).otherwise(field)

    typed = [text["user_id"].alias("user_id"), text["item_id"].alias("item_id"),
             text["event_type"].alias("event_type"), ts.alias("ts")]
    typed += [parsed[n].alias(n) for n in numeric]
    typed += [F.trim(F.col(c)).alias(c) for c in config.source.categorical]
    return raw.select(F.col(RECORD), F.col(SOURCE_FILE), reason.alias(REASON),
                      field.alias(FIELD), *typed)


def event_columns(config: EtlConfig) -> list[str]:
    """The columns of an accepted event, in order."""
    value = ["value"] if config.source.columns.value else []
    return ["user_id", "item_id", "event_type", "ts", *value, *config.source.continuous,
            *config.source.categorical]


def quarantined(validated: DataFrame) -> DataFrame:
    """The rejected rows as they go to ``quarantine/``: record text, reason, field, file."""
    return validated.where(F.col(REASON).isNotNull()).select(RECORD, REASON, FIELD, SOURCE_FILE)


def accepted(validated: DataFrame, config: EtlConfig) -> DataFrame:
    """The good rows, typed, before duplicate removal."""
    return validated.where(F.col(REASON).isNull()).select(*event_columns(config))
