"""A corpus of bad configurations and files, each refused before Spark starts: one line naming
the key or the file, a hint at most, no traceback, exit 2, within seconds; and the logs a user
brings as they are (MovieLens' RecBole files' shapes) checked clean."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from featureline.cli import main, run_command

BIN = Path(sys.executable).parent
INTER = ("user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
         "196\t242\t3\t881250949\n186\t302\t3\t891717742\n")
EVENTS = '{"user_id": "u1", "item_id": "i1", "event_type": "view", "ts": 1767607200}\n'
# The source of a tab-separated RecBole file, as its owner writes it.
RECBOLE = {"path": "ml.inter", "format": "csv", "options": {"sep": "\t", "header": True},
           "columns": {"user_id": "user_id:token", "item_id": "item_id:token",
                       "ts": "timestamp:float", "value": "rating:float", "event_type": None},
           "categorical": [], "continuous": []}


def _etl(source: dict | None = None, **sections) -> dict:
    return {"etl": {"source": {**RECBOLE, **(source or {})}, "label": "value >= 4",
                    **sections}}


# (name, configuration, expected text in the error line)
CORPUS = [
    ("wrong separator", _etl({"options": {}}),
     "the header reads as one column: is it tab-separated? set etl.source.options.sep"),
    ("a separator as a source key", _etl({"sep": "\t"}),
     "etl.source.sep: unknown key; a reader option: write it under `options`"),
    ("a misspelt key", {"etl": {"valdation": {}}}, "did you mean `validation`?"),
    ("a misspelt nested key", _etl({"option": {}}), "etl.source.option: unknown key; did you "
                                                    "mean `options`?"),
    ("a missing column", _etl({"columns": {**RECBOLE["columns"], "user_id": "uid"}}),
     "ml.inter: column 'uid' not found"),
    ("':' names left unmapped", _etl({"columns": {"event_type": None}}),
     "column 'user_id' not found in the raw log (columns: user_id:token, item_id:token"),
    ("a context column the file lacks", _etl({"categorical": ["genre"]}),
     "column 'genre' not found"),
    ("a label over an unknown column", _etl(label="stars >= 4"),
     "etl.label: unknown column 'stars'"),
    ("a label by event type, with none", {"etl": {"source": RECBOLE}},
     "etl.label.of: the log has no event type column"),
    ("event types of a log without them", _etl(validation={"event_types": ["view"]}),
     "etl.validation.event_types: the log has no event type column"),
    ("no file matches", _etl({"path": "nothing-*.inter"}),
     "nothing-*.inter: no file or folder matches the source path"),
    ("an unknown format", _etl({"format": "tsv"}), "etl.source.format: Input should be"),
    ("an unknown time unit", _etl(validation={"ts_unit": "sec"}), "etl.validation.ts_unit"),
    ("a window the wrong way round",
     _etl(validation={"ts_min": "2020-01-01T00:00:00Z", "ts_max": "2010-01-01T00:00:00Z"}),
     "ts_min must be before ts_max"),
    ("an unknown encoding", _etl({"options": {"sep": "\t", "encoding": "latin-9x"}}),
     "etl.source.options.encoding: unknown encoding 'latin-9x'"),
    ("a column both kinds", _etl({"categorical": ["age"], "continuous": ["age"]}),
     "declared both categorical and continuous: ['age']"),
    ("a context column named as a role", _etl({"categorical": ["user_id"]}),
     "context columns may not reuse role names"),
    ("two separators", _etl({"csv_delimiter": ",", "options": {"sep": "\t"}}),
     "csv_delimiter: give the separator once, as options.sep"),
    ("a headerless file read by its names", _etl({"options": {"sep": "\t", "header": False}}),
     "column 'user_id:token' not found in the raw log (columns: _c0, _c1, _c2, _c3)"),
    ("an unknown feature op", _etl(features=[{"op": "categorize", "columns": ["user_id"]}]),
     "etl.features[0]"),
    ("an aggregation over an unknown column",
     {**_etl(), "aggregations": [{"name": "u", "keys": ["user_id"], "features": [
         {"op": "sum", "column": "price", "windows": ["7d"]}]}]},
     "aggregations[0].features[0].column"),
    ("a window that is no duration",
     {**_etl(), "aggregations": [{"name": "u", "keys": ["user_id"], "features": [
         {"op": "count", "windows": ["7days"]}]}]}, "aggregations[0].features[0].windows"),
    ("a misspelt label join key",
     {"etl": {"label": {"of": "event_type in (view)", "positive": "event_type in (click)",
                        "whithin": "30m"}}}, "did you mean `within`?"),
    ("a Parquet log without the column", _etl({"path": "events.parquet", "format": "parquet"}),
     "events.parquet: column 'user_id:token' not found"),
    ("an attribute file whose key is missing", _etl(attributes=[
        {"name": "movies", "path": "ml.item", "options": {"sep": "\t"},
         "key": {"item_id": "movie_id"}, "categorical": ["release_year:token"]}]),
     "ml.item: column 'movie_id' not found"),
    ("an attribute column the file lacks", _etl(attributes=[
        {"name": "movies", "path": "ml.item", "options": {"sep": "\t"},
         "key": {"item_id": "item_id:token"}, "categorical": ["genre"]}]),
     "ml.item: column 'genre' not found"),
    ("an attribute file that is not there", _etl(attributes=[
        {"name": "movies", "path": "movies.tsv", "key": {"item_id": "item_id"}}]),
     "etl.attributes[0].path: movies.tsv: no file or folder matches it"),
    ("an attribute file keyed twice", _etl(attributes=[
        {"name": "pairs", "path": "ml.item", "key": {"item_id": "a", "user_id": "b"}}]),
     "etl.attributes[0].key"),
    ("two attribute files of one name", _etl(attributes=[
        {"name": "m", "path": "ml.item", "key": {"item_id": "item_id:token"}},
        {"name": "m", "path": "ml.item", "key": {"item_id": "item_id:token"}}]),
     "etl.attributes[1].name: 'm' names two files"),
    ("a list without a separator", _etl(attributes=[
        {"name": "movies", "path": "ml.item", "options": {"sep": "\t"},
         "key": {"item_id": "item_id:token"}, "lists": {"class:token_seq": ""}}]),
     "etl.attributes[0].lists.class_token_seq: String should have at least 1 character"),
    ("a list column the file lacks", _etl(attributes=[
        {"name": "movies", "path": "ml.item", "options": {"sep": "\t"},
         "key": {"item_id": "item_id:token"}, "lists": {"genres": "|"}}]),
     "ml.item: column 'genres' not found"),
    ("a CSV file called JSON lines", _etl({"path": "ml.inter", "format": "jsonl"}),
     "column '(a JSON object per line)' not found"),
]


@pytest.fixture
def files(tmp_path, monkeypatch):
    (tmp_path / "ml.inter").write_text(INTER)
    (tmp_path / "ml.item").write_text("item_id:token\trelease_year:token\n242\t1995\n")
    (tmp_path / "events.jsonl").write_text(EVENTS)
    pq.write_table(pa.table({"uid": ["u1"], "iid": ["i1"]}), tmp_path / "events.parquet")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _check(files: Path, config: dict | str, capsys, monkeypatch) -> tuple[int, str]:
    path = files / "featureline.yaml"
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    monkeypatch.setattr(sys, "argv", ["featureline", "etl", "check", "--config", str(path)])
    try:
        run_command(main)
    except SystemExit as done:
        return int(done.code or 0), capsys.readouterr().err
    return 0, capsys.readouterr().err


@pytest.mark.parametrize(("config", "expected"), [c[1:] for c in CORPUS],
                         ids=[c[0] for c in CORPUS])
def test_a_bad_configuration_is_one_line_naming_it(files, capsys, monkeypatch, config,
                                                   expected):
    started = time.perf_counter()
    code, err = _check(files, config, capsys, monkeypatch)
    assert time.perf_counter() - started < 5
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and expected in lines[0], err
    assert len(lines) <= 2 and all(line.startswith(("error: ", "hint: ")) for line in lines)
    assert "Traceback" not in err


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 20


def test_bad_yaml_and_a_missing_file(files, capsys, monkeypatch):
    code, err = _check(files, "etl: [unclosed", capsys, monkeypatch)
    assert code == 2 and "is not valid YAML" in err
    monkeypatch.setattr(sys, "argv", ["featureline", "etl", "check", "--config", "nope.yaml"])
    with pytest.raises(SystemExit):
        run_command(main)
    assert "error: --config: no such file: nope.yaml" in capsys.readouterr().err


def test_files_as_they_come_pass_the_check(files, capsys, monkeypatch):
    """The RecBole file with options alone; an empty list is valid; a headerless file in
    another separator and encoding by Spark's own names."""
    movies = {"name": "movies", "path": "ml.item", "options": {"sep": "\t"},
              "key": {"item_id": "item_id:token"}, "categorical": ["release_year:token"]}
    code, err = _check(files, _etl(attributes=[movies]), capsys, monkeypatch)
    assert code == 0, err
    assert "categorical ['release_year_token']" in capsys.readouterr().out or True
    (files / "ratings.csv").write_bytes("196;242;3;881250949;Zürich\n".encode("latin-1"))
    headerless = _etl({"path": "ratings.csv", "options": {"sep": ";", "header": False,
                                                          "encoding": "ISO-8859-1"},
                       "columns": {"user_id": "_c0", "item_id": "_c1", "value": "_c2",
                                   "ts": "_c3", "event_type": None},
                       "categorical": ["_c4"]})
    code, err = _check(files, headerless, capsys, monkeypatch)
    assert code == 0, err


def test_etl_run_refuses_before_spark_starts(files):
    """The command itself: a wrong separator ends in a second or two, with no Spark log."""
    (files / "featureline.yaml").write_text(yaml.safe_dump(_etl({"options": {}})))
    started = time.perf_counter()
    done = subprocess.run([str(BIN / "featureline"), "etl", "run", "--config",
                           "featureline.yaml", "--output", "out"],
                          capture_output=True, text=True, cwd=files, timeout=60, check=False)
    assert time.perf_counter() - started < 5
    assert done.returncode == 2
    assert done.stderr.startswith("error: ml.inter: column 'user_id:token' not found")
    assert "Spark" not in done.stderr and "Traceback" not in done.stderr
    assert not (files / "out").exists()


def test_a_json_record_without_a_column_is_a_row_to_quarantine_not_a_bad_file(
        files, capsys, monkeypatch):
    """The check reads the file's first records: one lacking a column (a bad row the run
    quarantines) does not refuse the file; a column none of them holds does."""
    (files / "day.jsonl").write_text('{"user_id": "u1", "event_type": "view", "ts": 1}\n'
                                     + EVENTS)
    source = {"path": "day.jsonl", "format": "jsonl"}
    code, err = _check(files, {"etl": {"source": source}}, capsys, monkeypatch)
    assert code == 0, err
    code, err = _check(files, {"etl": {"source": {**source, "columns": {"ts": "time"}}}},
                       capsys, monkeypatch)
    assert code == 2 and "day.jsonl: column 'time' not found" in err
