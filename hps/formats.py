"""Embedding table files: HugeCTR sparse-model folders, ``.npy`` pairs and Parquet.

HugeCTR's layout (docs/ARCHITECTURE.md, "Embeddings") is a folder with two raw
little-endian files: ``key`` (N × int64) and ``emb_vector`` (N × dim × float32); dim is not
stored, it comes from the configuration.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from featureline.core.files import staged_directory
from featureline.hps.errors import TableFileError

Format = Literal["hugectr", "npy", "parquet"]
KEY_FILE = "key"
VECTOR_FILE = "emb_vector"
# A folder replaced while it is being opened is opened again, this many times at most.
OPEN_ATTEMPTS = 3


def key_bytes(keys: np.ndarray) -> list[bytes]:
    """Each int64 key as 8 big-endian bytes: the key of the key-value stores (RocksDB, Redis),
    whose byte order then matches numeric order for non-negative keys."""
    raw = np.ascontiguousarray(keys, dtype=">i8").tobytes()
    return [raw[i:i + 8] for i in range(0, len(raw), 8)]


def _checked(keys: np.ndarray, vectors: np.ndarray, dim: int, where: str
             ) -> tuple[np.ndarray, np.ndarray]:
    if keys.size == 0:
        raise TableFileError(where, "the table is empty")
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise TableFileError(where, f"vectors have shape {vectors.shape}, expected (N, {dim})")
    if len(keys) != len(vectors):
        raise TableFileError(where, f"{len(keys)} keys but {len(vectors)} vectors")
    unique, counts = np.unique(keys, return_counts=True)
    if len(unique) != len(keys):
        duplicated = unique[counts > 1][:5].tolist()
        raise TableFileError(where, f"duplicate keys, e.g. {duplicated}")
    return keys.astype(np.int64, copy=False), vectors.astype(np.float32, copy=False)


def read_hugectr(folder: str | Path, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Both files of one version of the folder: both are opened, through one handle of the
    folder, before either is read, so a folder published meanwhile (:func:`write_hugectr`)
    can neither pair new keys with old vectors nor take a file away mid-read."""
    folder = Path(folder)
    key_path, vector_path = folder / KEY_FILE, folder / VECTOR_FILE
    for attempt in range(OPEN_ATTEMPTS):
        try:
            handles = _open_together(folder, (KEY_FILE, VECTOR_FILE))
            break
        except FileNotFoundError as exc:  # absent, or replaced between the two opens
            if attempt == OPEN_ATTEMPTS - 1 or not folder.is_dir():
                missing = folder / Path(exc.filename or KEY_FILE).name
                raise TableFileError(str(missing), "missing (a HugeCTR sparse model folder "
                                     f"holds '{KEY_FILE}' and '{VECTOR_FILE}')") from None
    arrays = []
    for handle, path, dtype, whole, unit in (
            (handles[0], key_path, "<i8", 8, "int64"),
            (handles[1], vector_path, "<f4", 4 * dim,
             f"{dim}-float32 vectors (is dim {dim} right?)")):
        with handle:
            size = os.fstat(handle.fileno()).st_size
            if size % whole:
                raise TableFileError(str(path), f"{size} bytes is not a whole number of {unit}")
            arrays.append(np.fromfile(handle, dtype=dtype))
    keys, values = arrays
    vectors = values.reshape(-1, dim)
    if len(keys) != len(vectors):
        raise TableFileError(str(folder), f"{len(keys)} keys but {len(vectors)} vectors of dim "
                                          f"{dim} (is dim {dim} right?)")
    return _checked(keys, vectors, dim, str(folder))


def _open_together(folder: Path, names: tuple[str, ...]) -> list[BinaryIO]:
    """Every file of ``names`` in one version of ``folder``, open."""
    directory = os.open(folder, os.O_RDONLY)
    handles: list[BinaryIO] = []
    try:
        for name in names:
            handles.append(open(name, "rb",  # noqa: SIM115 - the caller closes them
                                opener=lambda n, flags: os.open(n, flags, dir_fd=directory)))
    except BaseException:
        for handle in handles:
            handle.close()
        raise
    finally:
        os.close(directory)
    return handles


def write_hugectr(folder: str | Path, keys: np.ndarray, vectors: np.ndarray) -> None:
    """Export in HugeCTR's layout. Both files are written into a folder aside, which then
    replaces ``folder`` whole: a reader sees the previous table or the new one, never new
    keys with old vectors; a failed or killed export leaves nothing behind (the next one
    clears what a killed one left), and two at once on one folder are an error."""
    with staged_directory(Path(folder)) as staging:
        for name, array, dtype in ((KEY_FILE, keys, "<i8"), (VECTOR_FILE, vectors, "<f4")):
            np.ascontiguousarray(array, dtype=dtype).tofile(staging / name)


def read_npy(keys_path: str | Path, vectors_path: str | Path, dim: int
             ) -> tuple[np.ndarray, np.ndarray]:
    keys = np.load(keys_path)
    vectors = np.load(vectors_path)
    if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
        raise TableFileError(str(keys_path), f"keys must be a 1-D integer array, got "
                                             f"{keys.dtype} {keys.shape}")
    return _checked(keys, vectors, dim, f"{keys_path} + {vectors_path}")


def read_parquet(path: str | Path, dim: int) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(path, columns=["key", "vector"])
    keys = table.column("key").to_numpy()
    vector_column = table.column("vector").combine_chunks()
    if not pa.types.is_list(vector_column.type) and not pa.types.is_fixed_size_list(
            vector_column.type):
        raise TableFileError(str(path), f"column 'vector' must be a list, got {vector_column.type}")
    lengths = vector_column.value_lengths().to_numpy(zero_copy_only=False)
    if len(lengths) and (lengths != dim).any():
        raise TableFileError(str(path), f"vector lengths {sorted(set(lengths.tolist()))[:5]}, "
                                        f"expected {dim}")
    vectors = vector_column.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
    return _checked(keys, vectors, dim, str(path))


def _source_stats(source: str | Path, fmt: Format) -> list[os.stat_result]:
    if fmt == "hugectr":
        paths = [Path(source) / KEY_FILE, Path(source) / VECTOR_FILE]
    else:
        paths = [Path(part) for part in str(source).split(",")]
    try:
        return [path.stat() for path in paths]
    except FileNotFoundError as exc:
        raise TableFileError(str(exc.filename), "missing") from None


def fingerprint(source: str | Path, fmt: Format) -> str:
    """Which version of a table source this is: the size and modification time of each of
    its files (a published folder is a new folder, so its files are new too)."""
    return ";".join(f"{s.st_size}:{s.st_mtime_ns}:{s.st_ino}"
                    for s in _source_stats(source, fmt))


def source_written(source: str | Path, fmt: Format) -> float:
    """When the newest file of a table source was written, in seconds since the epoch."""
    return max(s.st_mtime for s in _source_stats(source, fmt))


def read_table(source: str | Path, fmt: Format, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``source``: a HugeCTR folder, a Parquet file, or ``keys.npy,vectors.npy``."""
    if fmt == "hugectr":
        return read_hugectr(source, dim)
    if fmt == "parquet":
        return read_parquet(source, dim)
    keys_path, _, vectors_path = str(source).partition(",")
    if not vectors_path:
        raise TableFileError(str(source), "an npy source is 'keys.npy,vectors.npy'")
    return read_npy(keys_path, vectors_path, dim)
