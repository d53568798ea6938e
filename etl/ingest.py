"""Ingest and validate: raw log rows → typed events, and every rejected row with its reason.

Every source format is first read into one shape — the original record text plus each
configured column as a string — so that one set of built-in Spark SQL checks decides every
row, whatever the format. The first failing check names the row's quarantine reason.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from featureline.core.events import (
    CHECKS,
    EPOCH_PATTERN,
    MAX_EPOCH_MICROS,
    MILLIS_THRESHOLD,
    REQUIRED_ROLES,
    UNTYPED_EVENT,
    check_fields,
)
from featureline.etl.config import AttributeFile, EtlConfig, ReaderSettings, SourceConfig
from featureline.etl.errors import AttributeFileError, NoInputError, RawLogSchemaError
from featureline.etl.source_files import (
    KEY,
    VALID_FROM,
    CsvDialect,
    attribute_columns,
    source_columns,
)

RECORD = "record"
REASON = "reason"
FIELD = "field"
SOURCE_FILE = "source_file"
KEPT_RECORD = "kept_record"
KEPT_FILE = "kept_file"
COPIES = "_copies"
# Up to this many duplicate rows, their keys are broadcast to find their record text.
BROADCAST_DUPLICATES = 1_000_000
_MALFORMED = "_malformed"
# An event's row number and time while the attributes valid at its time are joined.
_ROW = "_row"
_EVENT_TS = "_event_ts"
_FILE = "_file"
_CORRUPT = "_corrupt_record"
# The column separator of the one-column CSV scan that reads text lines (never in a log line).
LINE_SEPARATOR = "\u0001"
ANSI = "spark.sql.ansi.enabled"
# Floats below this print as plain decimals through decimal(38,6) without overflowing it.
_PLAIN_DECIMAL_BOUND = 1e30



@dataclass(frozen=True)
class SourceColumns:
    """Source column name → canonical name, for every column the job reads."""

    mapping: dict[str, str]

    @classmethod
    def of(cls, source: SourceConfig, attributes: Sequence[str] = ()) -> SourceColumns:
        """The log's columns (``attributes``: the context columns attribute files hold)."""
        return cls(source_columns(source, attributes))

    @property
    def names(self) -> list[str]:
        return list(self.mapping)


def _string_schema(columns: SourceColumns) -> T.StructType:
    return T.StructType([T.StructField(name, T.StringType()) for name in columns.names])


def _parsed_text(text: DataFrame, parsed: Column, malformed: Column,
                 columns: SourceColumns) -> DataFrame:
    """``text``: the lines (``value``) and their file (``_file``); ``malformed``: the line
    holds no record that ``parsed`` could read."""
    blank = F.trim(F.col("value")) == ""
    return text.select(
        F.col("value").alias(RECORD),
        F.col(_FILE).alias(SOURCE_FILE),
        (blank | malformed).alias(_MALFORMED),
        *(parsed[name].alias(canonical) for name, canonical in columns.mapping.items()),
    )


def _lines(spark: SparkSession, paths: str | list[str], encoding: str | None = None
           ) -> DataFrame:
    """Every line of the files that holds more than whitespace, as ``value``, untouched, and
    its file as ``_file`` (named while the line is read: after a shuffle, as the CSV reader's
    repeated header lines go through, ``input_file_name`` is empty); ``encoding``: the
    files' character set (UTF-8 by default).

    Read by Spark's CSV scan with one column, no quoting and a separator that text logs do
    not hold (U+0001), because the RAPIDS Accelerator runs that scan on the GPU and not the
    text one (docs/ARCHITECTURE.md, "GPU"). Unlike ``spark.read.text`` it skips blank lines,
    which hold no record; a line holding U+0001 keeps the text before it (and fails parsing).
    """
    reader = (spark.read.schema("value STRING")
              .options(sep=LINE_SEPARATOR, quote="", header="false", mode="PERMISSIVE",
                       ignoreLeadingWhiteSpace="false", ignoreTrailingWhiteSpace="false"))
    if encoding:
        reader = reader.option("encoding", encoding)
    return reader.csv(paths).withColumn(_FILE, F.input_file_name())


def _read_jsonl(spark: SparkSession, source: ReaderSettings, columns: SourceColumns
                ) -> DataFrame:
    """A line is a record when it is one JSON object. Told by ``get_json_object`` rather than
    from_json's corrupt-record column, which the RAPIDS Accelerator leaves to the CPU
    (docs/ARCHITECTURE.md, "GPU"); from_json reads a malformed line as all nulls."""
    options = {name: value for name, value in source.reader_options().items()
               if name not in ("encoding", "charset")}
    text = _lines(spark, source.path, source.encoding)
    parsed = F.from_json("value", _string_schema(columns), {**options, "mode": "PERMISSIVE"})
    is_object = F.coalesce(F.get_json_object(F.col("value"), "$").startswith("{"),
                           F.lit(False))
    return _parsed_text(text, parsed, ~is_object, columns)


def csv_headers(spark: SparkSession, pattern: str, encoding: str = "UTF-8"
                ) -> dict[str, list[str]]:
    """The first line of every file the path or glob names (through Spark's own file system,
    so it works wherever Spark reads: local, HDFS, S3), grouped: header line → files. Empty
    files have no header and hold no rows."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a running session's gateway
    path = jvm.org.apache.hadoop.fs.Path(pattern)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    files = []
    for status in fs.globStatus(path) or []:
        listed = fs.listStatus(status.getPath()) if status.isDirectory() else [status]
        files += [s.getPath() for s in listed
                  if s.isFile() and not s.getPath().getName().startswith((".", "_"))]
    groups: dict[str, list[str]] = {}
    for file in files:
        reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(fs.open(file),
                                                                           encoding))
        try:
            line = reader.readLine()
        finally:
            reader.close()
        if line is not None:
            groups.setdefault(line, []).append(file.toString())
    return groups


def _split_plain(dialect: CsvDialect, line: Column, width: int) -> tuple[Column, Column]:
    """Whether a line can be split as it is, without a CSV parser (no quote character, one
    field per column: an operator the GPU runs), and its fields."""
    fields = F.split(line, re.escape(dialect.sep), -1)
    if not set(dialect.options) <= dialect.SPLIT_HONOURS:
        return F.lit(False), fields
    plain = F.size(fields) == width
    if dialect.quote:
        plain = plain & ~line.contains(dialect.quote)
    return plain, fields


def _missing(dialect: CsvDialect, field: Column) -> Column:
    """Whether a split field is a null: empty, or the nullValue option."""
    null_value = dialect.options.get("nullValue")
    empty = field == ""
    return empty | (field == null_value) if null_value else empty


def _ddl(names: list[str]) -> str:
    """A schema of text columns in Spark's DDL, any name quoted."""
    return ", ".join(f"`{name.replace('`', '``')}` STRING" for name in names)


def _read_csv(spark: SparkSession, source: ReaderSettings, columns: SourceColumns
              ) -> DataFrame:
    """Each file parsed with its own header (files of one header are read together), or
    without one (``header: false``: files of one width together, columns ``_c0``, …); a file
    whose columns lack a mapped one is a :class:`RawLogSchemaError` naming it. A file's
    header line is dropped once; a data line that repeats it is a row like any other (and
    fails validation)."""
    dialect = CsvDialect(source.reader_options())
    groups = csv_headers(spark, source.path, source.encoding)
    if not groups:
        raise NoInputError(f"{source.path}: no file matches the source path, or every file "
                           "is empty")
    by_names: dict[tuple[str, ...], tuple[str, list[str]]] = {}
    for first_line, files in groups.items():
        names = tuple(dialect.names(first_line))
        header_line = first_line if dialect.header else None
        by_names.setdefault(names, (header_line or "", []))[1].extend(files)
    frames = []
    for names, (header_line, files) in by_names.items():
        for name in columns.names:
            if name not in names:
                raise RawLogSchemaError(files[0], name, list(names), separated=True)
        text = _lines(spark, files, source.encoding)
        comment = dialect.options.get("comment")
        if comment:
            text = text.where(~F.col("value").startswith(comment))
        body = _without_headers(text, header_line) if dialect.header else text
        # A plain line is split as it is (an operator the GPU runs); the others go through
        # Spark's CSV parser, from_csv, which it does not: quoting is what needs a parser
        # (docs/ARCHITECTURE.md, "GPU"). Every header column is read so that a row's field
        # count is checked against the header.
        plain, fields = _split_plain(dialect, F.col("value"), len(names))
        split = F.struct(*(F.when(~_missing(dialect, fields[i]), fields[i]).alias(name)
                           for i, name in enumerate(names)))
        parsed = F.from_csv("value", _ddl([*names, _CORRUPT]), dialect.parser_options(_CORRUPT))
        frames += [_parsed_text(body.where(plain), split, F.lit(False), columns),
                   _parsed_text(body.where(~plain), parsed, parsed[_CORRUPT].isNotNull(),
                                columns)]
    return functools.reduce(DataFrame.unionByName, frames)


def _without_headers(text: DataFrame, header_line: str) -> DataFrame:
    """The lines less one header line per file; any other copy of it is kept as data."""
    is_header = F.col("value") == F.lit(header_line)
    repeats = (text.where(is_header)
               .withColumn("_copy", F.row_number().over(Window.partitionBy(_FILE)
                                                        .orderBy(_FILE)))
               .where(F.col("_copy") > 1).drop("_copy"))
    return text.where(~is_header).unionByName(repeats)


def _read_parquet(spark: SparkSession, source: ReaderSettings, columns: SourceColumns
                  ) -> DataFrame:
    table = spark.read.options(**source.reader_options()).parquet(source.path)
    for name in columns.names:
        if name not in table.columns:
            raise RawLogSchemaError(source.path, name, table.columns)
    types = dict(table.dtypes)
    return table.select(
        # The row itself; written as JSON only where it is kept (record_text).
        F.struct(*table.columns).alias(RECORD),
        F.input_file_name().alias(SOURCE_FILE),
        F.lit(False).alias(_MALFORMED),
        *(_as_text(F.col(f"`{name}`"), types[name]).alias(canonical)
          for name, canonical in columns.mapping.items()),
    )


def _as_text(column: Column, dtype: str) -> Column:
    """A typed Parquet value as the text the checks read. Floating-point numbers in plain
    decimal notation (``1767607200.5``, not ``1.7676072005E9``), so an epoch timestamp of any
    numeric type reads as one; NaN, infinities and huge values keep Spark's text and fail
    their checks."""
    if dtype not in ("float", "double"):
        return column.cast("string")
    plain = F.abs(column) < F.lit(_PLAIN_DECIMAL_BOUND)
    return F.when(plain, column.cast("decimal(38,6)").cast("string")).otherwise(
        column.cast("string"))


_READERS = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}


def read_raw(spark: SparkSession, source: SourceConfig,
             attributes: Sequence[AttributeFile] = (), ts_unit: str = "auto") -> DataFrame:
    """The raw log as (record, source_file, _malformed, one string column per canonical name),
    each attribute file's columns joined on by its key (``ts_unit``: how the events' and the
    files' numeric times read)."""
    columns = [column for table in attributes for column in table.columns]
    raw = _read(spark, source, SourceColumns.of(source, columns))
    if source.columns.event_type is None:
        raw = raw.withColumn("event_type", F.lit(UNTYPED_EVENT))
    for table in attributes:
        rows = attribute_table(spark, table, ts_unit)
        with lenient_casts(spark):  # an event's time that does not parse reads no row
            raw = _with_attributes(raw, rows, table, ts_unit)
    return raw


def _read(spark: SparkSession, files: ReaderSettings, columns: SourceColumns) -> DataFrame:
    try:
        return _READERS[files.format](spark, files, columns)
    except Exception as exc:  # Spark's own "path does not exist" is an AnalysisException
        if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
            raise NoInputError(f"{files.path}: no file matches the source path") from None
        raise


def attribute_table(spark: SparkSession, table: AttributeFile, ts_unit: str) -> DataFrame:
    """An attribute file's rows as the join reads them: the key (trimmed), ``valid_from`` as a
    time where the file has one, each attribute as text. A row without a key, or one that
    does not parse, is left out; a key on two rows without ``valid_from`` (or two rows of a
    key from the same time) is an :class:`AttributeFileError` naming the file and the key."""
    rows = _read(spark, table, SourceColumns(attribute_columns(table)))
    key = F.trim(F.col(KEY))
    with lenient_casts(spark):  # a valid_from that does not parse: the row is never valid
        rows = rows.where(~F.col(_MALFORMED) & key.isNotNull() & (key != "")).select(
            key.alias(KEY),
            *([_timestamp(F.trim(F.col(VALID_FROM)), ts_unit).alias(VALID_FROM)]
              if table.valid_from else []),
            *table.columns)
    unique = [KEY, *([VALID_FROM] if table.valid_from else [])]
    repeated = rows.groupBy(*unique).count().where(F.col("count") > 1).limit(1).collect()
    if repeated:
        raise AttributeFileError(table.name, table.path, table.key[table.key_role],
                                 str(repeated[0][KEY]), table.valid_from)
    return rows


def catalog_events(spark: SparkSession, config: EtlConfig, role: str, until: datetime
                   ) -> DataFrame | None:
    """The rows of the attribute files keyed by ``role`` (``user_id`` or ``item_id``) as
    events of their key holding the attributes, typed as validation types the events'
    (text trimmed, numbers read or null): an always valid row at the epoch, a ``valid_from``
    row a microsecond before that time (an event at ``valid_from`` reads it), rows valid
    after ``until`` left out. The latest value of an attribute (``last``) over the events
    and these is the one the file gives at any time: what the online tiles serve a key
    that has no event yet (docs/ARCHITECTURE.md, "Raw events"). None without such files."""
    frames = []
    for table in config.attributes:
        if table.key_role != role:
            continue
        rows = attribute_table(spark, table, config.validation.ts_unit)
        if table.valid_from:
            ts = F.col(VALID_FROM) - F.expr("INTERVAL 1 MICROSECOND")
            rows = rows.where(F.col(VALID_FROM).isNotNull() & (F.col(VALID_FROM) <= F.lit(until)))
        else:
            ts = F.timestamp_micros(F.lit(0))
        with lenient_casts(spark):
            frames.append(rows.select(
                F.col(KEY).alias(role), ts.alias("ts"),
                *(F.trim(F.col(c)).alias(c) for c in table.categorical),
                *(F.when(~F.isnan(n) & ~_is_infinite(n), n).alias(c) for c, n in (
                    (c, _unquoted(F.col(c)).cast("double")) for c in table.continuous))))
    if not frames:
        return None
    return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)


def _with_attributes(raw: DataFrame, rows: DataFrame, table: AttributeFile,
                     ts_unit: str) -> DataFrame:
    """Each raw row with the attributes of its key: the one row of the key, or with
    ``valid_from`` the latest row valid at the event's time (``valid_from <= ts``; none before
    its first). A key the file lacks reads nulls."""
    key = F.trim(F.col(table.key_role))
    if not table.valid_from:
        return raw.join(rows, key == F.col(KEY), "left").drop(KEY)
    ts = _timestamp(F.trim(F.col("ts")), ts_unit)
    numbered = raw.withColumn(_ROW, F.monotonically_increasing_id()).withColumn(_EVENT_TS, ts)
    matched = numbered.join(rows, (key == F.col(KEY)) & (F.col(VALID_FROM) <= F.col(_EVENT_TS)),
                            "left")
    latest = Window.partitionBy(_ROW).orderBy(F.col(VALID_FROM).desc_nulls_last())
    return (matched.withColumn("_rank", F.row_number().over(latest))
            .where(F.col("_rank") == 1)
            .drop("_rank", _ROW, _EVENT_TS, KEY, VALID_FROM))


def _unquoted(column: Column) -> Column:
    # A bare NaN/Infinity token in JSON reaches us as its raw text, quotes included.
    return F.btrim(F.trim(column), F.lit('"'))


def _timestamp(text: Column, ts_unit: str) -> Column:
    """ISO-8601 text or epoch seconds / milliseconds (``ts_unit``: s, ms, or auto) →
    timestamp; null when unparseable."""
    # Gate the numeric parse: a failed cast costs far more than the pattern test.
    number = F.when(text.rlike(EPOCH_PATTERN), text.cast("double"))
    if ts_unit == "ms":
        micros = number * 1_000
    elif ts_unit == "s":
        micros = number * 1_000_000
    else:
        micros = number * F.when(F.abs(number) >= MILLIS_THRESHOLD, 1_000).otherwise(1_000_000)
    # core.events.epoch_micros, on columns: rounded half up, within the readable range.
    readable = ~F.isnan(micros) & (F.abs(micros) < MAX_EPOCH_MICROS)
    from_number = F.when(readable, F.timestamp_micros(F.floor(micros + 0.5)))
    return F.when(number.isNotNull(), from_number).otherwise(text.cast("timestamp"))


def _outside(ts: Column, start: datetime | None, end: datetime | None) -> Column:
    """Whether ``ts`` is outside ``[start, end)`` (None: unbounded on that side)."""
    before = ts < F.lit(start) if start is not None else F.lit(False)
    return before | (ts >= F.lit(end)) if end is not None else before


def _is_infinite(column: Column) -> Column:
    return F.abs(column) == F.lit(float("inf"))


@contextlib.contextmanager
def lenient_casts(spark: SparkSession) -> Iterator[None]:
    """Casts built inside give null for text they cannot read instead of failing the job.

    That is ``try_cast``, which the RAPIDS Accelerator does not run on the GPU, made from the
    plain (non-ANSI) cast, which it does: a cast takes its mode from the session when it is
    built, so the setting is needed only while the frame is built, and is restored after.
    """
    previous = spark.conf.get(ANSI, None)
    spark.conf.set(ANSI, "false")
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(ANSI)
        else:
            spark.conf.set(ANSI, previous)


def _typed(raw: DataFrame, config: EtlConfig, numeric: list[str]) -> DataFrame:
    """Each field parsed once, next to its text; the checks then read plain columns."""
    text = [F.trim(F.col(role)).alias(role) for role in REQUIRED_ROLES]
    numbers = [_unquoted(F.col(n)).alias(f"_{n}_text") for n in numeric]
    with lenient_casts(raw.sparkSession):
        return raw.select(
            RECORD, SOURCE_FILE, _MALFORMED, *text, *numbers,
            *(F.trim(F.col(c)).alias(c) for c in config.source.categorical),
        ).select(
            "*",
            _timestamp(F.col("ts"), config.validation.ts_unit).alias("_ts"),
            *(F.col(f"_{n}_text").cast("double").alias(n) for n in numeric),
        )


def validate(raw: DataFrame, config: EtlConfig, now: datetime | None = None) -> DataFrame:
    """Typed columns plus ``reason`` / ``field``: null for a good row, else why it is rejected.

    ``now``: the run's start, the reference of ``future_tolerance`` (default: the clock)."""
    numeric = ["value"] if config.source.columns.value else []
    numeric += config.source.continuous
    typed = _typed(raw, config, numeric)
    ts = F.col("_ts")

    # The event contract's window: what the push checks pushed events against.
    contract = config.event_contract()
    start, end = contract.ts_min, contract.latest_accepted(now)
    # core.events.CHECKS, each test as a Spark column (the API evaluates the same list).
    tests: dict[str, Callable[[str], Column]] = {
        "malformed": lambda _: F.col(_MALFORMED),
        "missing": lambda name: F.col(name).isNull() | (F.col(name) == ""),
        "bad_timestamp": lambda _: ts.isNull(),
        "out_of_window": lambda _: _outside(ts, start, end),
        "unknown_value": lambda name: ~F.col(name).isin(config.validation.event_types),
        "bad_number": lambda name: (F.col(f"_{name}_text") != "") & F.col(name).isNull(),
        "non_finite": lambda name: F.isnan(name) | _is_infinite(F.col(name)),
    }
    checks = [(tests[check.test](str(name)), check.reason, name) for check in CHECKS
              for name in check_fields(check, numeric)]

    # One chain, so each row stops at its first failing check.
    verdict: Column = F.lit(None).cast("struct<reason:string,field:string>")
    for condition, code, name in reversed(checks):
        outcome = F.struct(F.lit(code).alias(REASON), F.lit(name).cast("string").alias(FIELD))
        verdict = F.when(condition, outcome).otherwise(verdict)

    return typed.withColumn("_verdict", verdict).select(
        F.col(RECORD), F.col(SOURCE_FILE), F.col(f"_verdict.{REASON}").alias(REASON),
        F.col(f"_verdict.{FIELD}").alias(FIELD),
        "user_id", "item_id", "event_type", ts.alias("ts"), *numeric,
        *config.source.categorical,
    )


def event_columns(config: EtlConfig) -> list[str]:
    """The columns of an accepted event, in order."""
    value = ["value"] if config.source.columns.value else []
    return ["user_id", "item_id", "event_type", "ts", *value, *config.source.continuous,
            *config.source.categorical]


def record_text(frame: DataFrame, column: str = RECORD) -> Column:
    """A record as the text the quarantine and duplicates lists keep. A Parquet row travels
    as its struct and becomes JSON only here, for the few rows listed: ``to_json`` is not on
    the GPU's list (docs/ARCHITECTURE.md, "GPU")."""
    if dict(frame.dtypes)[column].startswith("struct"):
        return F.to_json(F.col(column)).alias(column)
    return F.col(column)


def quarantined(validated: DataFrame) -> DataFrame:
    """The rejected rows as they go to ``quarantine/``: record text, reason, field, file."""
    rejected = validated.where(F.col(REASON).isNotNull())
    return rejected.select(record_text(rejected), REASON, FIELD, SOURCE_FILE)


def accepted(validated: DataFrame, config: EtlConfig) -> DataFrame:
    """The good rows, typed, before duplicate removal."""
    return validated.where(F.col(REASON).isNull()).select(*event_columns(config))


def deduplicate(accepted_rows: DataFrame) -> DataFrame:
    """One row per distinct event, with ``COPIES``: how many accepted rows it stood for.

    Two accepted rows are duplicates when every typed column agrees — ids, event type, ``ts``
    to the microsecond, value and context columns, a missing value equal to a missing value —
    whatever their record text (key order, timestamp notation) or file.
    """
    return accepted_rows.groupBy(*accepted_rows.columns).agg(F.count("*").alias(COPIES))


def _null_safe_keys(frame: DataFrame, columns: list[str], prefix: str) -> DataFrame:
    """Each column as two plain join keys — its value with a stand-in for null, and whether
    it is null — so an equi-join on them is ``<=>``. Spark plans ``<=>`` itself with
    ``coalesce(column, <stand-in>)`` inside the join's key list, which the Qualification
    tool misreads as an unsupported join type; plain columns it reads."""
    types = dict(frame.dtypes)
    keys = []
    for column in columns:
        stand_in = F.lit("") if types[column] == "string" else F.lit(0).cast(types[column])
        keys += [F.coalesce(F.col(column), stand_in).alias(f"{prefix}{column}"),
                 F.col(column).isNull().alias(f"{prefix}{column}_null")]
    return frame.select("*", *keys)


def duplicates(validated: DataFrame, events: DataFrame, config: EtlConfig,
               removed: int) -> DataFrame:
    """The ``removed`` rows ``deduplicate`` took out, as they go to ``duplicates/``.

    Of each group of duplicates the copy first in (file, record text) order is the one kept;
    every other copy is listed with its record text and file, and the kept copy's.
    """
    # The repeated events are distinct (one per group): an inner join keeps each copy once;
    # the usual few are broadcast: no shuffle of the accepted rows.
    copies = copies_of(validated, events.where(F.col(COPIES) > 1), config,
                       broadcast=removed <= BROADCAST_DUPLICATES)
    columns = event_columns(config)
    ordered = Window.partitionBy(*columns).orderBy(SOURCE_FILE, RECORD)
    first = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    removed_copies = (copies
                      .withColumn("_n", F.row_number().over(ordered))
                      .withColumn(KEPT_RECORD, F.first(RECORD).over(first))
                      .withColumn(KEPT_FILE, F.first(SOURCE_FILE).over(first))
                      .where(F.col("_n") > 1))
    return removed_copies.select(record_text(removed_copies), SOURCE_FILE,
                                 record_text(removed_copies, KEPT_RECORD), KEPT_FILE)


def copies_of(validated: DataFrame, events: DataFrame, config: EtlConfig, *,
              broadcast: bool) -> DataFrame:
    """The valid rows of ``validated`` whose event is one of ``events``: record, file and
    columns; ``events`` sent to every task when ``broadcast``."""
    rows = validated.where(F.col(REASON).isNull()).select(RECORD, SOURCE_FILE,
                                                          *event_columns(config))
    return matching(rows, events, config, broadcast=broadcast)


def matching(rows: DataFrame, events: DataFrame, config: EtlConfig, *, broadcast: bool,
             anti: bool = False) -> DataFrame:
    """The rows whose event is one of ``events`` (every typed column equal, a missing value
    equal to a missing value), or with ``anti`` the others; ``events`` sent to every task
    when ``broadcast``."""
    columns = event_columns(config)
    keys = _null_safe_keys(events.select(*columns), columns, "_event_").drop(*columns)
    if broadcast:
        keys = F.broadcast(keys)
    keyed = _null_safe_keys(rows, columns, "_row_")
    same = functools.reduce(lambda a, b: a & b, [
        F.col(f"_row_{c}{suffix}") == F.col(f"_event_{c}{suffix}")
        for c in columns for suffix in ("", "_null")])
    return keyed.join(keys, same, "left_anti" if anti else "left_semi").select(*rows.columns)


def held_copies(validated: DataFrame, held: DataFrame, config: EtlConfig, kept_file: str,
                *, broadcast: bool) -> DataFrame:
    """The new rows of an incremental run whose event the output already holds (``held``:
    those events), as they go to ``duplicates/``: every copy is removed, the kept one is the
    stored event (``kept_file``; its record text is not kept)."""
    copies = copies_of(validated, held, config, broadcast=broadcast)
    return copies.select(record_text(copies), SOURCE_FILE,
                         F.lit(None).cast("string").alias(KEPT_RECORD),
                         F.lit(kept_file).alias(KEPT_FILE))
