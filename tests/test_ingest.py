"""Validation and quarantine on hand-made logs in every format: exact reasons and counts."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from featureline.etl import ingest
from featureline.etl.config import EtlConfig, with_overrides
from featureline.etl.errors import AttributeFileError, NoInputError, RawLogSchemaError

GOOD = {"user_id": "u1", "item_id": "i1", "event_type": "view", "ts": "2026-01-05T10:00:00Z",
        "value": 3.5, "price": 9.99, "category": "c1", "device": "mobile"}

# (record changes, expected reason or None for a good row)
CASES = [
    ({}, None),
    ({"ts": 1767607200}, None),                       # epoch seconds
    ({"ts": 1767607200123}, None),                    # epoch milliseconds
    ({"ts": "2026-01-05 11:00:00"}, None),
    ({"value": None}, None),                          # value is optional
    ({"user_id": None}, "missing_user_id"),
    ({"item_id": "  "}, "missing_item_id"),
    ({"event_type": ""}, "missing_event_type"),
    ({"ts": None}, "missing_ts"),
    ({"ts": "next tuesday"}, "bad_timestamp"),
    ({"ts": "1999-12-31T23:59:59Z"}, "timestamp_out_of_window"),
    ({"ts": 4102444800}, "timestamp_out_of_window"),  # 2100-01-01, the exclusive upper bound
    ({"event_type": "hover"}, "unknown_event_type"),
    ({"value": "lots"}, "bad_number"),
    ({"price": "9,99"}, "bad_number"),
    ({"value": "NaN"}, "non_finite_number"),
    ({"price": "-Infinity"}, "non_finite_number"),
    ({"user_id": None, "ts": "garbage"}, "missing_user_id"),  # the first failing check wins
]


def _record(changes):
    record = dict(GOOD, **changes)
    return {k: v for k, v in record.items() if v is not None}


def _config(path, fmt):
    """The defaults, with a time window of [2000, 2100) (none by default)."""
    data = with_overrides(EtlConfig(), input_path=str(path), input_format=fmt).model_dump(
        mode="json")
    data["validation"].update(ts_min="2000-01-01T00:00:00Z", ts_max="2100-01-01T00:00:00Z")
    return EtlConfig.model_validate(data)


def _validated(spark, config):
    raw = ingest.read_raw(spark, config.source, config.attributes, config.validation.ts_unit)
    return ingest.validate(raw, config)


def _reasons(frame):
    return sorted((r["reason"] or "", r["record"]) for r in frame.collect())


def test_jsonl_every_reason_and_the_record_text(spark, tmp_path):
    lines = [json.dumps(_record(changes)) for changes, _ in CASES]
    lines += ['{"user_id": "u1", "item_id": ', "[1, 2, 3]", '  {"padded": [1, 2  ']
    path = tmp_path / "events.jsonl"
    # Blank lines (nothing but whitespace) hold no record and are not rows.
    path.write_text("\n".join([*lines[:5], "", "   ", *lines[5:]]) + "\n\n")
    rows = _validated(spark, _config(path, "jsonl")).collect()
    assert len(rows) == len(lines)
    by_record = {row["record"]: row for row in rows}
    for (_, reason), line in zip(CASES, lines, strict=False):
        assert by_record[line]["reason"] == reason, line
    for line in lines[len(CASES):]:
        assert by_record[line]["reason"] == "malformed_record"
    assert by_record[lines[14]]["field"] == "price"
    good = [r for r in rows if r["reason"] is None]
    assert {r["ts"].isoformat() for r in good[:3]} >= {"2026-01-05T10:00:00"}
    millis = by_record[lines[2]]
    assert millis["ts"].isoformat() == "2026-01-05T10:00:00.123000"
    assert by_record[lines[3]]["ts"].isoformat() == "2026-01-05T11:00:00"
    assert by_record[lines[4]]["value"] is None


def test_csv_reasons_field_counts_and_header(spark, tmp_path):
    header = "user_id,item_id,event_type,ts,value,price,category,device"
    lines = [header,
             "u1,i1,view,2026-01-05T10:00:00Z,3.5,9.99,c1,mobile",
             "u2,i1,click,1767607200,,9.99,c1,desktop",
             '"u3,i1,view,2026-01-05T10:00:00Z,1,1,c1,mobile',   # unterminated quote
             "u4,i1,view,2026-01-05T10:00:00Z",                  # too few fields
             "u5,i1,view,2026-01-05T10:00:00Z,1,1,c1,mobile,x",  # too many fields
             ",i1,view,2026-01-05T10:00:00Z,1,1,c1,mobile",
             "u6,i1,view,2026-01-05T10:00:00Z,Infinity,1,c1,mobile"]
    path = tmp_path / "events.csv"
    path.write_text("\n".join(lines) + "\n")
    rows = {r["record"]: r["reason"] for r in _validated(spark, _config(path, "csv")).collect()}
    assert rows == {lines[1]: None, lines[2]: None, lines[3]: "malformed_record",
                    lines[4]: "malformed_record", lines[5]: "malformed_record",
                    lines[6]: "missing_user_id", lines[7]: "non_finite_number"}


def test_csv_without_a_mapped_column_is_a_schema_error(spark, tmp_path):
    path = tmp_path / "events.csv"
    path.write_text("user,item_id,event_type,ts\nu1,i1,view,2026-01-05T10:00:00Z\n")
    with pytest.raises(RawLogSchemaError, match="'user_id' not found"):
        _validated(spark, _config(path, "csv"))


def test_parquet_typed_columns(spark, tmp_path):
    table = pa.table({
        "user_id": ["u1", None, "u3", "u4"],
        "item_id": ["i1", "i2", "i3", "i4"],
        "event_type": ["view", "view", "view", "buy"],
        "ts": pa.array([1767607200, 1767607200, 1767607200, 1767607200], pa.int64()),
        "value": [1.0, 2.0, float("nan"), 1.0],
        "price": [1.0, 1.0, 1.0, 1.0],
        "category": ["c", "c", "c", "c"],
        "device": ["d", "d", "d", "d"],
    })
    path = tmp_path / "events.parquet"
    pq.write_table(table, path)
    rows = _validated(spark, _config(path, "parquet")).orderBy("record").collect()
    reasons = {r["record"]["user_id"]: r["reason"] for r in rows}
    # The record text of a rejected Parquet row is the row as JSON.
    rejected = {json.loads(r["record"]).get("user_id"): r["reason"]
                for r in ingest.quarantined(_validated(spark, _config(path, "parquet")))
                .collect()}
    assert rejected == {k: v for k, v in reasons.items() if v}
    assert reasons == {"u1": None, None: "missing_user_id", "u3": "non_finite_number",
                       "u4": "unknown_event_type"}
    with pytest.raises(RawLogSchemaError):
        _validated(spark, with_overrides(EtlConfig(), input_path=str(path),
                                         categorical=["genre"]))


def test_no_input(spark, tmp_path):
    with pytest.raises(NoInputError, match="no file matches"):
        _validated(spark, _config(tmp_path / "missing-*.jsonl", "jsonl"))


def test_column_mapping_onto_roles(spark, tmp_path):
    path = tmp_path / "ratings.jsonl"
    path.write_text('{"uid": 7, "movie": 42, "kind": "rate", "time": 1767607200, "stars": 4}\n')
    data = EtlConfig().model_dump(mode="json")
    data["source"].update(path=str(path), categorical=[], continuous=[],
                          columns={"user_id": "uid", "item_id": "movie", "event_type": "kind",
                                   "ts": "time", "value": "stars"})
    data["validation"]["event_types"] = ["rate"]
    data["label"] = "value >= 4"
    data["features"] = [{"op": "categorify", "columns": ["user_id", "item_id"]}]
    config = EtlConfig.model_validate(data)
    row = _validated(spark, config).where(F.col("reason").isNull()).first()
    assert (row["user_id"], row["item_id"], row["value"]) == ("7", "42", 4.0)


def test_parquet_numeric_timestamps_of_any_type(spark, tmp_path):
    seconds = 1767607200.5  # 2026-01-05T10:00:00.5Z
    table = pa.table({
        "user_id": ["double_s", "float_s", "double_ms", "nan"],
        "item_id": ["i1"] * 4, "event_type": ["view"] * 4,
        "ts": pa.array([seconds, 1767607200.0, seconds * 1000, float("nan")], pa.float64()),
        "value": [1.0] * 4, "price": [1.0] * 4, "category": ["c"] * 4, "device": ["d"] * 4,
    })
    path = tmp_path / "events.parquet"
    pq.write_table(table, path)
    floats = tmp_path / "float32.parquet"
    pq.write_table(table.slice(1, 1).set_column(
        3, "ts", pa.array([1767607168.0], pa.float32())), floats)
    rows = {r["user_id"]: r for r in _validated(spark, _config(path, "parquet")).collect()}
    assert rows["double_s"]["reason"] is None
    assert rows["double_s"]["ts"].isoformat() == "2026-01-05T10:00:00.500000"
    assert rows["double_ms"]["ts"].isoformat() == "2026-01-05T10:00:00.500000"
    assert rows["float_s"]["ts"].isoformat() == "2026-01-05T10:00:00"
    assert rows["nan"]["reason"] == "bad_timestamp"
    (single,) = _validated(spark, _config(floats, "parquet")).collect()
    # float32 holds 1767607168 exactly: 2026-01-05T09:59:28Z
    assert single["reason"] is None and single["ts"].isoformat() == "2026-01-05T09:59:28"


def test_events_later_than_the_run_are_out_of_the_window(spark, tmp_path):
    from datetime import datetime, timezone

    lines = [json.dumps(_record({"user_id": user, "ts": ts})) for user, ts in
             (("past", "2026-01-03T10:00:00Z"), ("within_tolerance", "2026-01-04T20:00:00Z"),
              ("future", "2026-01-05T10:00:00Z"))]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    run_start = datetime(2026, 1, 4, tzinfo=timezone.utc)
    config = _config(path, "jsonl")
    rows = {r["user_id"]: r["reason"] for r in ingest.validate(
        ingest.read_raw(spark, config.source), config, now=run_start).collect()}
    assert rows == {"past": None, "within_tolerance": None,
                    "future": "timestamp_out_of_window"}
    data = config.model_dump(mode="json")
    data["validation"]["future_tolerance"] = None
    unbounded = EtlConfig.model_validate(data)
    rows = {r["user_id"]: r["reason"] for r in ingest.validate(
        ingest.read_raw(spark, unbounded.source), unbounded, now=run_start).collect()}
    assert rows["future"] is None


def test_csv_files_of_a_glob_each_keep_their_own_header(spark, tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    header = "user_id,item_id,event_type,ts,value,price,category,device"
    swapped = "item_id,user_id,event_type,ts,value,price,category,device"
    (folder / "a.csv").write_text("\n".join([
        header, "u1,i1,view,2026-01-05T10:00:00Z,1,1,c1,mobile",
        header,  # a line repeating the header is data: counted, and rejected
        "u2,i2,view,2026-01-05T11:00:00Z,1,1,c1,mobile"]) + "\n")
    (folder / "b.csv").write_text("\n".join([
        swapped, "i3,u3,view,2026-01-05T12:00:00Z,1,1,c1,mobile"]) + "\n")
    (folder / "empty.csv").write_text("")
    rows = _validated(spark, _config(folder / "*.csv", "csv")).collect()
    good = sorted((r["user_id"], r["item_id"]) for r in rows if r["reason"] is None)
    assert good == [("u1", "i1"), ("u2", "i2"), ("u3", "i3")]
    rejected = [(r["record"], r["reason"], r["source_file"].rsplit("/", 1)[-1])
                for r in rows if r["reason"] is not None]
    assert rejected == [(header, "bad_timestamp", "a.csv")]  # its file named, as any row's
    assert len(rows) == 4  # every line but one header line per file


def test_a_csv_file_whose_header_lacks_a_column_is_named(spark, tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "good.csv").write_text("user_id,item_id,event_type,ts\nu1,i1,view,"
                                     "2026-01-05T10:00:00Z\n")
    (folder / "bad.csv").write_text("user,item_id,event_type,ts\nu1,i1,view,"
                                    "2026-01-05T10:00:00Z\n")
    config = with_overrides(EtlConfig(), input_path=str(folder / "*.csv"), input_format="csv",
                            categorical=[], continuous=[])
    with pytest.raises(RawLogSchemaError, match=r"bad\.csv: column 'user_id' not found"):
        _validated(spark, config)


def test_duplicates_are_listed_with_their_text_and_the_copy_kept(spark, tmp_path):
    # One event written four ways across two files (key order, epoch vs ISO time), an exact
    # repeat of a line, and a near-copy one microsecond later, which is a different event.
    event = _record({})
    reordered = json.dumps(dict(reversed(list(event.items()))))
    epoch = json.dumps(_record({"ts": 1767607200}))
    later = json.dumps(_record({"ts": "2026-01-05T10:00:00.000001Z"}))
    missing_value = json.dumps(_record({"value": None}))
    (tmp_path / "a.jsonl").write_text("\n".join(
        [json.dumps(event), later, missing_value, missing_value]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join([reordered, epoch]) + "\n")
    config = _config(tmp_path / "*.jsonl", "jsonl")
    validated = _validated(spark, config).cache()
    events = ingest.deduplicate(ingest.accepted(validated, config)).cache()
    assert events.count() == 3
    assert sorted(r[ingest.COPIES] for r in events.collect()) == [1, 2, 3]
    removed = sorted((r["record"], r["source_file"].rsplit("/", 1)[1], r["kept_record"],
                      r["kept_file"].rsplit("/", 1)[1])
                     for r in ingest.duplicates(validated, events, config, 3).collect())
    assert removed == sorted([
        (reordered, "b.jsonl", json.dumps(event), "a.jsonl"),
        (epoch, "b.jsonl", json.dumps(event), "a.jsonl"),
        (missing_value, "a.jsonl", missing_value, "a.jsonl"),
    ])


def test_csv_lines_split_as_they_are_read_as_spark_csv_parser_reads_them(spark, tmp_path):
    """Lines without quotes are split by the GPU's operator, the rest by from_csv; both
    parsers give every field the same value (empty → missing, spaces kept), quoted fields
    with the separator inside included."""
    header = "user_id,item_id,event_type,ts,value,price,category,device"
    lines = ["u1,i1,view,2026-01-05T10:00:00Z,,9.99,c1,mobile",
             " u2 ,i1, click ,1767607200,2, ,c 1,",
             '"u,3",i1,view,2026-01-05T10:00:00Z,1,1,"c ""x""",mobile',
             'u4,"i1",view,2026-01-05T10:00:00Z,1,1,c1,mobile']
    path = tmp_path / "events.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    config = _config(path, "csv")
    raw = ingest.read_raw(spark, config.source)
    got = {r["record"]: r.asDict() for r in raw.collect()}
    schema = ", ".join(f"{c} STRING" for c in header.split(","))
    expected = spark.createDataFrame([(line,) for line in lines], "line string").select(
        "line", F.from_csv("line", schema).alias("p")).collect()
    for row in expected:
        fields = row["p"].asDict()
        assert {k: got[row["line"]][k] for k in fields} == fields, row["line"]
    assert got[lines[2]]["user_id"] == "u,3" and got[lines[1]]["price"] == " "
    assert got[lines[0]]["value"] is None and got[lines[1]]["device"] is None


def test_parquet_duplicates_are_listed_as_json(spark, tmp_path):
    row = {"user_id": "u1", "item_id": "i1", "event_type": "view", "ts": 1767607200,
           "value": 1.0, "price": 2.0, "category": "c", "device": "d"}
    pq.write_table(pa.Table.from_pylist([row, row, dict(row, user_id="u2")]),
                   tmp_path / "events.parquet")
    config = _config(tmp_path / "events.parquet", "parquet")
    validated = _validated(spark, config)
    events = ingest.deduplicate(ingest.accepted(validated, config))
    (removed,) = ingest.duplicates(validated, events, config, 1).collect()
    assert json.loads(removed["record"]) == json.loads(removed["kept_record"]) == row


def test_every_input_format_has_its_reader():
    from featureline.etl.stages import INPUT_FORMATS

    assert sorted(ingest._READERS) == sorted(INPUT_FORMATS)


# Float epoch times as SDKs send them (time.time(), Date.now() / 1000) and their text forms,
# with the time each stands for to the microsecond. Spark's JSON reader hands a JSON float
# to a string column as Java's Double.toString (1.764085000123E9).
FLOAT_EPOCHS = {
    "2025-11-25T15:36:40.123000": {"ts": 1764085000.123},
    "2025-11-25T15:36:40.123457": {"ts": 1764085000.123457},
    "2025-11-25T15:36:40": {"ts": 1764085000.0},
    "2025-11-25T15:36:40.500000": {"ts": "1.7640850005E9"},
    "2025-11-25T15:36:40.250000": {"ts": "1.76408500025e+9"},
    "2025-11-25T15:36:40.123456": {"ts": 1764085000123.456},  # milliseconds
    "2025-11-25T15:36:41": {"ts": "1.764085001E12"},            # milliseconds
}
# Still bad timestamps: negative, huge, non-finite, malformed exponents.
BAD_EPOCHS = [-1764085000.5, "-1.7E9", 1e300, "1.0E300", "Infinity", "1.7E", "1.7E9.5", "E9"]


def test_float_epoch_timestamps_are_read_to_the_microsecond(spark, tmp_path):
    records = [_record(changes) for changes in FLOAT_EPOCHS.values()]
    records += [_record({"ts": ts}) for ts in BAD_EPOCHS]
    lines = [json.dumps(record) for record in records]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rows = {r["record"]: r for r in _validated(spark, _config(path, "jsonl")).collect()}
    times = [rows[line]["ts"] for line in lines[:len(FLOAT_EPOCHS)]]
    assert [t.isoformat() for t in times] == list(FLOAT_EPOCHS)
    assert [(rows[line]["reason"], rows[line]["field"]) for line in lines[len(FLOAT_EPOCHS):]] \
        == [("bad_timestamp", "ts")] * len(BAD_EPOCHS)


def test_pushed_float_epoch_timestamps_are_read_to_the_microsecond(tmp_path):
    from featureline.core.events import validate_event

    contract = _config(tmp_path / "events.jsonl", "jsonl").event_contract()
    for expected, changes in FLOAT_EPOCHS.items():
        event, rejection = validate_event(_record(changes), contract)
        assert rejection is None and event is not None, changes
        assert event["ts"].isoformat() == f"{expected}+00:00", changes
    for ts in BAD_EPOCHS:
        event, rejection = validate_event(_record({"ts": ts}), contract)
        assert (event, rejection and (rejection.reason, rejection.field)) == (
            None, ("bad_timestamp", "ts")), ts


# Beyond CASES: notations both parsers must read alike.
PARITY_CASES = [
    *(changes for changes, _ in CASES),
    {"ts": "2026-01-05T10:00:00.5+02:00"}, {"ts": 1767607200.25}, {"ts": "2026-01-05"},
    {"ts": " 1767607200 "}, {"value": "4"}, {"value": " 2.5e1 "}, {"value": "inf"},
    {"value": True}, {"price": ""}, {"category": " c2 "}, {"device": None},
    {"user_id": 42}, {"event_type": " click "}, {"ts": "2026-13-01T00:00:00"},
    *FLOAT_EPOCHS.values(), *({"ts": ts} for ts in BAD_EPOCHS),
]


def test_pushed_events_are_validated_exactly_as_the_etl_validates_log_rows(spark, tmp_path):
    """One list of checks (core.events.CHECKS): Spark's verdict and typed columns for each
    line equal validate_event's for the same JSON object."""
    from datetime import datetime, timezone

    from featureline.core.events import validate_event

    config = _config(tmp_path / "events.jsonl", "jsonl")
    records = [_record(changes) for changes in PARITY_CASES]
    lines = [json.dumps(record) for record in records]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    now = datetime.now(timezone.utc)
    rows = {r["record"]: r for r in ingest.validate(
        ingest.read_raw(spark, config.source), config, now).collect()}
    contract = config.event_contract()
    columns = contract.columns
    differ = []
    for line, record in zip(lines, records, strict=True):
        spark_row = rows[line]
        event, rejection = validate_event(record, contract, now)
        expected = {c: spark_row[c] for c in columns}
        if expected["ts"] is not None:
            expected["ts"] = expected["ts"].replace(tzinfo=timezone.utc)
        verdicts = ((spark_row["reason"], spark_row["field"]),
                    (rejection.reason, rejection.field) if rejection else (None, None))
        if verdicts[0] != verdicts[1] or (rejection is None and event != expected):
            differ.append((line, verdicts, expected, event))
    assert differ == [], "\n".join(map(repr, differ))


def _source_config(path, source, **etl):
    """A configuration of a user's own log: ``source`` as the file gives it."""
    data = {"source": {"path": str(path), "format": "csv", **source}, "label": "value >= 4",
            "features": [{"op": "categorify", "columns": ["user_id", "item_id"]}], **etl}
    return EtlConfig.model_validate(data)


def test_a_recbole_file_by_its_own_names_without_event_types(spark, tmp_path):
    """Tab-separated, ``name:type`` headers, no event type, ratings from 1997: read with the
    reader's options alone, every row accepted as an event of type ``event``."""
    path = tmp_path / "ml-100k.inter"
    path.write_text("user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
                    "196\t242\t3\t881250949\n186\t302\t5\t891717742\n")
    config = _source_config(path, {
        "options": {"sep": "\t", "header": True},
        "columns": {"user_id": "user_id:token", "item_id": "item_id:token",
                    "ts": "timestamp:float", "value": "rating:float", "event_type": None},
        "categorical": [], "continuous": []}, validation={"ts_unit": "s"})
    assert config.validation.event_types == ["event"]
    rows = sorted(_validated(spark, config).collect(), key=lambda r: r["user_id"])
    assert [(r["reason"], r["user_id"], r["item_id"], r["event_type"], r["value"],
             r["ts"].year) for r in rows] == [(None, "186", "302", "event", 5.0, 1998),
                                              (None, "196", "242", "event", 3.0, 1997)]


def test_a_headerless_file_in_another_separator_and_encoding(spark, tmp_path):
    """Spark's ``_cN`` names, ISO-8859-1 text, a quoted field holding the separator and a
    nullValue: each as Spark's own reader reads them."""
    path = tmp_path / "ratings.csv"
    path.write_bytes("1;10;4;881250949;Zürich\n"
                     "2;11;\\N;881250950;\"Genf;GE\"\n"
                     "3;12;5;881250951\n".encode("latin-1"))
    (tmp_path / "users.csv").write_bytes("1|Köln\n2|Genève\n".encode("latin-1"))
    towns = {"name": "towns", "path": str(tmp_path / "users.csv"),
             "options": {"sep": "|", "header": False, "encoding": "ISO-8859-1"},
             "key": {"user_id": "_c0"}, "categorical": ["_c1"]}
    config = _source_config(path, {
        "options": {"sep": ";", "header": False, "encoding": "ISO-8859-1", "nullValue": "\\N"},
        "columns": {"user_id": "_c0", "item_id": "_c1", "value": "_c2", "ts": "_c3",
                    "event_type": None},
        "categorical": ["_c4"], "continuous": []}, attributes=[towns])
    rows = {r["user_id"]: r for r in _validated(spark, config).collect()}
    assert (rows["1"]["_c4"], rows["1"]["value"], rows["1"]["reason"]) == ("Zürich", 4.0, None)
    # The attribute file's own _c1 is a column of its own beside the log's _c1 (the item).
    assert [rows[user]["_c1"] for user in ("1", "2", "3")] == ["Köln", "Genève", None]
    assert (rows["2"]["_c4"], rows["2"]["value"], rows["2"]["reason"]) == ("Genf;GE", None, None)
    # A row short of a field is malformed, as Spark's parser finds it.
    assert rows["3"]["reason"] == "malformed_record"


def _attributes_config(tmp_path, events, attributes):
    (tmp_path / "events.csv").write_text(events)
    return _source_config(tmp_path / "events.csv", {
        "columns": {"user_id": "user", "item_id": "item", "ts": "ts", "value": None,
                    "event_type": None},
        "categorical": [], "continuous": []}, label="event_type in (event)",
        validation={"ts_unit": "s"}, attributes=attributes)


def test_attribute_files_are_joined_by_key(spark, tmp_path):
    """Each event reads its item's and its user's row; a key the file lacks reads nulls; the
    files' names with ':' go by their safe names; a key on two rows is refused."""
    (tmp_path / "ml.item").write_text("item_id:token\trelease_year:token\n"
                                      "i1\t1995\ni2\t1977\n")
    (tmp_path / "ml.user").write_text("user_id:token\tage:token\toccupation:token\n"
                                      "u1\t24\ttechnician\nu2\t53\tother\n")
    movies = {"name": "movies", "path": str(tmp_path / "ml.item"), "options": {"sep": "\t"},
              "key": {"item_id": "item_id:token"}, "categorical": ["release_year:token"]}
    raters = {"name": "raters", "path": str(tmp_path / "ml.user"), "options": {"sep": "\t"},
              "key": {"user_id": "user_id:token"}, "categorical": ["occupation:token"],
              "continuous": ["age:token"]}
    config = _attributes_config(tmp_path, "user,item,ts\nu1,i1,881250949\nu2,i2,881250950\n"
                                          "u3,i1,881250951\n", [movies, raters])
    assert config.source.roles["age_token"] == "user"
    assert config.source.roles["release_year_token"] == "item"
    rows = {r["user_id"]: (r["release_year_token"], r["occupation_token"], r["age_token"],
                           r["reason"])
            for r in _validated(spark, config).collect()}
    assert rows == {"u1": ("1995", "technician", 24.0, None), "u2": ("1977", "other", 53.0, None),
                    "u3": ("1995", None, None, None)}
    (tmp_path / "ml.item").write_text("item_id:token\trelease_year:token\ni1\t1995\n"
                                      "i1\t1996\n")
    with pytest.raises(AttributeFileError, match="key 'i1' of column 'item_id:token' is on "
                                                 "two rows"):
        _validated(spark, config)


def test_an_attribute_file_with_valid_from_equals_an_as_of_join(spark, tmp_path):
    """Every event reads the row of its key with the latest valid_from at or before its time,
    never a later one, and nothing before the key's first row: as a brute force finds it."""
    rng = np.random.default_rng(7)
    events = pd.DataFrame({"user": rng.choice(["u1", "u2", "u3", "u4"], 300),
                           "item": "i1", "ts": rng.integers(1_000, 2_000, 300)})
    versions = pd.DataFrame({"uid": rng.choice(["u1", "u2", "u3"], 40),
                             "since": rng.choice(np.arange(900, 2_100, 7), 40, replace=False),
                             "tier": [f"t{n}" for n in range(40)]})
    versions.loc[len(versions)] = ["u1", int(events["ts"].iloc[0]), "t-equal"]  # valid from ts
    # A row whose time does not parse is never valid; an event whose time does not parse is
    # quarantined, as without the file (the join's cast neither fails nor matches it).
    (tmp_path / "tiers.csv").write_text(versions.to_csv(index=False) + "u2,never,t-never\n")
    tiers = {"name": "tiers", "path": str(tmp_path / "tiers.csv"), "key": {"user_id": "uid"},
             "valid_from": "since", "categorical": ["tier"]}
    config = _attributes_config(tmp_path, events.to_csv(index=False)
                                + "u1,i1,yesterday at noon\n", [tiers])
    validated = _validated(spark, config)
    assert [(r["reason"], r["tier"]) for r in validated.where("reason is not null").collect()
            ] == [("bad_timestamp", None)]
    got = sorted((r["user_id"], int(r["ts"].timestamp()), r["tier"])
                 for r in validated.where("reason is null").collect())
    expected = []
    for event in events.itertuples():
        valid = versions[(versions["uid"] == event.user) & (versions["since"] <= event.ts)]
        tier = valid.loc[valid["since"].idxmax(), "tier"] if len(valid) else None
        expected.append((event.user, int(event.ts), tier))
    assert got == sorted(expected)
    assert ("u4", int(events[events["user"] == "u4"]["ts"].iloc[0]), None) in got
