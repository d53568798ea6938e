"""TFRecords: TensorFlow reads every file written and the values equal the examples/ rows."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from featureline.core.metadata import Metadata, TfrecordInfo  # noqa: E402
from featureline.etl import tfrecord  # noqa: E402
from featureline.etl.job import label_spec  # noqa: E402
from featureline.etl.tfrecord import wire  # noqa: E402
from featureline.etl.tfrecord.layout import Group, build_layout  # noqa: E402
from featureline.etl.tfrecord.records import (  # noqa: E402
    TFRecordCorruptError,
    encode,
    read_file,
)
from featureline.etl.tfrecord.writer import Source, split_sources, write_split  # noqa: E402


def _parquet_files(job_output, split="train") -> list[Source]:
    return split_sources(job_output.output / "examples" / f"split={split}")


def _examples(job_output, split="train") -> pd.DataFrame:
    return pq.read_table(job_output.output / "examples" / f"split={split}").to_pandas()


def _tf_rows(paths: list[Path], groups: list[Group], compression: str) -> pd.DataFrame:
    """Read with TensorFlow alone, from the group description metadata.json gives."""
    spec = {g.name: tf.io.VarLenFeature(tf.float32 if g.dtype == "float32" else tf.int64)
            for g in groups}
    columns: dict[str, list] = {}
    dataset = tf.data.TFRecordDataset([str(p) for p in paths], compression_type=compression)
    for serialized in dataset.batch(7):
        parsed = tf.io.parse_example(serialized, spec)
        for group in groups:
            # A SparseTensor's values run record by record, in order.
            block = parsed[group.name].values.numpy().reshape(-1, group.width)
            for index, column in enumerate(group.columns):
                part = block[:, index * group.column_width:(index + 1) * group.column_width]
                columns.setdefault(column, []).extend(
                    part[:, 0] if group.column_width == 1 else [tuple(r) for r in part])
    return pd.DataFrame(columns)


def _comparable(frame: pd.DataFrame, metadata: dict) -> pd.DataFrame:
    frame = frame.copy()
    for feature in metadata["features"]:
        name = feature["name"]
        if feature["kind"] == "continuous":
            frame[name] = frame[name].astype(np.float32)
        elif feature["kind"] == "multi_hot":
            frame[name] = frame[name].map(tuple)
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def test_job_writes_tfrecords_tensorflow_reads(job_output):
    metadata = job_output.metadata
    section = metadata["tfrecord"]
    groups = [Group.from_json(n, g) for n, g in section["groups"].items()]
    assert [g.name for g in groups] == ["c", "f", "h", "y"]
    for split in ("train", "valid"):
        files = [job_output.output / f["path"] for f in section["files"] if f["split"] == split]
        assert sum(f["rows"] for f in section["files"] if f["split"] == split) == \
            metadata["split"]["rows"][split]
        # Whole records in every file but each day's last (the reader relies on it).
        days = sorted({f["day"] for f in section["files"] if f["split"] == split})
        assert len(days) > (split == "train")
        for day in days:
            rows = [f["rows"] for f in section["files"] if (f["split"], f["day"]) == (split, day)]
            assert [r % section["prebatch_size"] for r in rows[:-1]] == [0] * (len(rows) - 1)
            assert all(f["path"].startswith(f"tfrecord/{split}/{day}-part-")
                       for f in section["files"] if (f["split"], f["day"]) == (split, day))
        got = _tf_rows(files, groups, section["compression"])
        expected = _examples(job_output, split)[list(got.columns)]
        pd.testing.assert_frame_equal(_comparable(got, metadata),
                                      _comparable(expected, metadata), check_dtype=False)
    assert not list((job_output.output / "tfrecord").glob("_temporary*"))


LAYOUTS = [
    pytest.param(64, True, True, "", id="prebatch64-grouped-short"),
    pytest.param(64, False, True, "", id="prebatch64-per-column-short"),
    pytest.param(64, True, False, "GZIP", id="prebatch64-grouped-long-gzip"),
    pytest.param(1, False, False, "", id="per-example-long"),
    pytest.param(1000, True, True, "GZIP", id="prebatch1000-grouped-gzip"),
]


@pytest.mark.parametrize(("prebatch", "grouped", "short", "compression"), LAYOUTS)
def test_every_layout(spark, job_output, tmp_path, prebatch, grouped, short, compression):
    metadata = job_output.metadata
    groups = build_layout(metadata["features"], label_spec(), group_types=grouped,
                          short_names=short)
    names = [g.name for g in groups]
    if short:
        assert all(1 <= len(n) <= 3 for n in names)
    else:
        assert ("categorical" if grouped else "user_id_cat") in names
    files = write_split(spark, _parquet_files(job_output), str(tmp_path), "train", groups,
                        prebatch, compression)
    paths = [tmp_path / f["path"] for f in files]
    got = _tf_rows(paths, groups, compression)
    expected = _examples(job_output)[list(got.columns)]
    pd.testing.assert_frame_equal(_comparable(got, metadata), _comparable(expected, metadata),
                                  check_dtype=False)
    # Records of `prebatch` rows, only each day's very last one smaller: no row lost.
    counts: dict[str, list[int]] = {}
    for entry, path in zip(files, paths, strict=True):
        in_file = [len(r) for r in tf.data.TFRecordDataset(str(path), compression).map(
            lambda s, g=groups[-1]: tf.io.parse_single_example(
                s, {g.name: tf.io.VarLenFeature(tf.int64)})[g.name].values)]
        assert sum(in_file) == entry["rows"]
        counts.setdefault(entry["day"], []).extend(in_file)
    per_day = _examples(job_output)["day"].astype(str).value_counts()
    assert sorted(counts) == sorted(per_day.index)
    for day, records in counts.items():
        full, rest = divmod(int(per_day[day]), prebatch)
        assert records == [prebatch] * full + ([rest] if rest else []), day
    assert not list(tmp_path.glob("_temporary*"))
    # The numpy reader agrees with TensorFlow, without it.
    decoded = pd.DataFrame({k: (list(map(tuple, v)) if v.ndim == 2 else v) for k, v in
                            _read_all(paths, groups, compression).items()})
    pd.testing.assert_frame_equal(_comparable(decoded, metadata)[list(got.columns)],
                                  _comparable(got, metadata), check_dtype=False)
    if compression == "GZIP":
        with gzip.open(paths[0]) as handle:
            assert handle.read(1)  # a real gzip stream


def _read_all(paths, groups, compression):
    parts = [read_file(p, groups, compression) for p in paths]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def test_dataset_gives_dense_batches_under_long_names(job_output):
    batches = list(tfrecord.dataset(job_output.output, batch_size=4096, split="train",
                                    parallel_reads=1))
    rows = job_output.metadata["split"]["rows"]["train"]
    assert sum(int(b["label"].shape[0]) for b in batches) == rows
    first = batches[0]
    assert first["user_hist_items"].shape[1] == 10
    assert first["item_id_te"].dtype == tf.float32 and first["user_id_cat"].dtype == tf.int64
    numpy_rows = tfrecord.read_numpy(job_output.output, split="train")
    assert np.array_equal(np.concatenate([b["item_id_cat"].numpy() for b in batches]),
                          numpy_rows["item_id_cat"])


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**35, 2**63 - 1, -1, -(2**63)])
def test_varints_round_trip(value):
    encoded, lengths = wire.encode_varints(np.array([value, 5], dtype=np.int64))
    assert wire.decode_varints(encoded).tolist() == [value, 5]
    assert lengths[0] == (10 if value < 0 else max(1, (value.bit_length() + 6) // 7))


def _one_file(job_output) -> tuple[Path, list[Group]]:
    section = job_output.metadata["tfrecord"]
    groups = [Group.from_json(n, g) for n, g in section["groups"].items()]
    return job_output.output / section["files"][0]["path"], groups


def test_corrupt_and_truncated_files_name_file_and_offset(job_output, tmp_path):
    path, groups = _one_file(job_output)
    data = bytearray(path.read_bytes())
    flipped = tmp_path / "flipped.tfrecord"
    data[100] ^= 0xFF
    flipped.write_bytes(bytes(data))
    with pytest.raises(TFRecordCorruptError, match=r"flipped.tfrecord: corrupt .* at byte 0: "
                                                   r"data CRC mismatch"):
        read_file(flipped, groups)
    truncated = tmp_path / "truncated.tfrecord"
    truncated.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(TFRecordCorruptError, match="truncated record"):
        read_file(truncated, groups)
    # TensorFlow agrees that both are damaged.
    for bad in (flipped, truncated):
        with pytest.raises(tf.errors.DataLossError):
            list(tf.data.TFRecordDataset(str(bad)))


def test_rows_are_mixed_in_a_repeatable_order(spark, job_output, tmp_path):
    groups = build_layout(job_output.metadata["features"], label_spec(), group_types=False,
                          short_names=False)
    written = [write_split(spark, _parquet_files(job_output), str(tmp_path / name), "train",
                           groups, 64, "") for name in ("first", "second")]
    assert written[0] == written[1]
    for entry in written[0]:
        assert (tmp_path / "first" / entry["path"]).read_bytes() == \
            (tmp_path / "second" / entry["path"]).read_bytes()
    # The first file's first record mixes users; the Parquet file holds them in user order.
    first = read_file(tmp_path / "first" / written[0][0]["path"], groups)
    in_file = pq.read_table(_parquet_files(job_output)[0].path).to_pandas()
    record = first["user_id_cat"][:64]
    assert len(np.unique(record)) > len(np.unique(in_file["user_id_cat"][:64])) + 8


def test_failed_write_leaves_no_stray_files(spark, tmp_path):
    source = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"bad": [str(i) if i < 40 else "not-a-number" for i in range(50)]}),
                   source)
    groups = [Group("c", "int64", ("bad",), 1)]
    with pytest.raises(Exception, match=r"not-a-number|invalid literal|could not convert"):
        write_split(spark, [Source(str(source), "2026-01-01", 0)], str(tmp_path / "out"),
                    "train", groups, 8, "")
    leftovers = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert leftovers == []


class _Attempt:
    def __init__(self, attempt: int) -> None:
        self.attempt = attempt

    def partitionId(self) -> int:  # pyspark's TaskContext API
        return 0

    def attemptNumber(self) -> int:
        return self.attempt


def test_a_retried_task_leaves_one_file(tmp_path, monkeypatch):
    """Attempt 0 dies half-way through its file; attempt 1 succeeds; only its file lands."""
    import pyarrow as pa

    from featureline.etl.tfrecord import writer as tfwriter

    groups = [Group("c", "int64", ("x",), 1), Group("y", "int64", ("label",), 1)]
    batch = pa.RecordBatch.from_pydict({"x": list(range(100)), "label": [1] * 100})
    task = tfwriter.TaskWriter(str(tmp_path), "train", "job1", groups, 16, "")

    def failing():
        yield batch
        raise RuntimeError("executor lost")

    monkeypatch.setattr(tfwriter.TaskContext, "get", staticmethod(lambda: _Attempt(0)))
    with pytest.raises(RuntimeError):
        list(task(failing()))
    monkeypatch.setattr(tfwriter.TaskContext, "get", staticmethod(lambda: _Attempt(1)))
    results = [r for out in task(iter([batch])) for r in out.to_pylist()]
    assert [r["path"].rsplit("-", 1)[-1] for r in results] == ["1.tfrecord"]
    files = tfwriter.commit(task, results, [Source("examples.parquet", "2026-01-01", 0)])
    tfwriter.abort(str(tmp_path), "job1")
    on_disk = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    # The task's 6 whole records, then its 4 leftover rows carried into the day's last file.
    assert on_disk == ["train/2026-01-01-part-00000.tfrecord",
                       "train/2026-01-01-part-00001.tfrecord"]
    assert [f["path"] for f in files] == on_disk and [f["rows"] for f in files] == [96, 4]
    assert np.concatenate([read_file(tmp_path / f["path"], groups)["x"] for f in files]
                          ).tolist() == list(range(100))


@pytest.mark.parametrize("batch_size", [1000, 4096, 5000, 10_000, 100_000])
def test_dataset_batches_hold_exactly_the_requested_rows(job_output, batch_size):
    prebatch = job_output.metadata["tfrecord"]["prebatch_size"]
    rows = job_output.metadata["split"]["rows"]["train"]
    assert rows % prebatch and rows > 1000  # records of two sizes, and several batches at 1000
    batches = list(tfrecord.dataset(job_output.output, batch_size=batch_size, split="train",
                                    parallel_reads=1))
    sizes = [int(b["label"].shape[0]) for b in batches]
    full, rest = divmod(rows, batch_size)
    assert sizes == [batch_size] * full + ([rest] if rest else [])
    numpy_rows = tfrecord.read_numpy(job_output.output, split="train")
    for name in ("item_id_cat", "user_hist_items", "item_id_te", "label"):
        assert np.array_equal(np.concatenate([b[name].numpy() for b in batches]),
                              numpy_rows[name]), name


@pytest.mark.parametrize(("file_rows", "batch_size", "shuffle"), [
    pytest.param([96, 96, 40], 32, 0, id="job-layout"),  # batches of whole records
    pytest.param([96, 96, 40], 32, 8, id="job-layout-shuffled"),  # the short one stays last
    pytest.param([100, 100, 36], 32, 0, id="short-record-in-every-file"),  # re-batched
    pytest.param([96, 40, 96, 36], 32, 8, id="a-short-record-per-day"),  # the tail re-batched
    pytest.param([96, 96, 40], 20, 0, id="not-a-multiple"),  # re-batched
])
def test_batches_are_exact_whatever_the_files(tmp_path, file_rows, batch_size, shuffle):
    groups = [Group("c", "int64", ("x",), 1), Group("y", "int64", ("label",), 1)]
    entries, start = [], 0
    for number, rows in enumerate(file_rows):
        arrays = {"c": np.arange(start, start + rows)[:, None],
                  "y": np.ones((rows, 1), dtype=np.int64)}
        (tmp_path / f"part-{number}.tfrecord").write_bytes(b"".join(encode(arrays, groups, 16)))
        entries.append({"path": f"part-{number}.tfrecord", "split": "train", "rows": rows})
        start += rows
    # Only the TFRecords' section: model_construct leaves the rest of metadata.json out.
    metadata = Metadata.model_construct(folder=tmp_path, tfrecord=TfrecordInfo.model_validate({
        "prebatch_size": 16, "compression": "", "files": entries,
        "groups": {g.name: g.to_json() for g in groups}}))
    batches = list(tfrecord.dataset(metadata, batch_size=batch_size, parallel_reads=2,
                                    shuffle=shuffle, seed=3))
    full, rest = divmod(start, batch_size)
    assert [int(b["x"].shape[0]) for b in batches] == [batch_size] * full + [rest]
    assert sorted(np.concatenate([b["x"].numpy() for b in batches])) == list(range(start))


def test_grouped_mode_gives_the_stored_blocks_in_metadata_order(job_output):
    section = job_output.metadata["tfrecord"]
    (batch,) = list(tfrecord.dataset(job_output.output, batch_size=10**6, split="train",
                                     parallel_reads=1, grouped=True))
    numpy_rows = tfrecord.read_numpy(job_output.output, split="train")
    assert set(batch) == set(section["groups"])
    for name, group in section["groups"].items():
        block = batch[name].numpy()
        assert block.shape[1] == group["width"]
        expected = np.hstack([numpy_rows[c].reshape(len(block), -1) for c in group["columns"]])
        np.testing.assert_array_equal(block, expected.astype(block.dtype))


def test_a_batch_size_below_one_is_refused(job_output):
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        tfrecord.dataset(job_output.output, batch_size=0)
