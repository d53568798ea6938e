"""Embedding table files: HugeCTR sparse-model folders, ``.npy`` pairs and Parquet.

HugeCTR's layout (docs/ARCHITECTURE.md's interchange format) is a folder with two raw little-endian
files: ``key`` (N × int64) and ``emb_vector`` (N × dim × float32); dim is not stored, it
comes from the configuration.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hps.errors import TableFileError

Format = Literal["hugectr", "npy", "parquet"]
KEY_FILE = "key"
VECTOR_FILE = "emb_vector"


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
    folder = Path(folder)
    key_path, vector_path = folder / KEY_FILE, folder / VECTOR_FILE
    for path in (key_path, vector_path):
        if not path.is_file():
            raise TableFileError(str(path), "missing (a HugeCTR sparse model folder holds "
                                            f"'{KEY_FILE}' and '{VECTOR_FILE}')")
    key_bytes, vector_bytes = key_path.stat().st_size, vector_path.stat().st_size
    if key_bytes % 8:
        raise TableFileError(str(key_path), f"{key_bytes} bytes is not a whole number of int64")
    if vector_bytes % (4 * dim):
        raise TableFileError(str(vector_path), f"{vector_bytes} bytes is not a whole number of "
                                               f"{dim}-float32 vectors (is dim {dim} right?)")
    keys = np.fromfile(key_path, dtype="<i8")
    vectors = np.fromfile(vector_path, dtype="<f4").reshape(-1, dim)
    if len(keys) != len(vectors):
        raise TableFileError(str(folder), f"{len(keys)} keys but {len(vectors)} vectors of dim "
                                          f"{dim} (is dim {dim} right?)")
    return _checked(keys, vectors, dim, str(folder))


def write_hugectr(folder: str | Path, keys: np.ndarray, vectors: np.ndarray) -> None:
    """Export in HugeCTR's layout; written aside and renamed, so readers never see half."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, array, dtype in ((KEY_FILE, keys, "<i8"), (VECTOR_FILE, vectors, "<f4")):
        temporary = folder / f".{name}.tmp"
        np.ascontiguousarray(array, dtype=dtype).tofile(temporary)
        os.replace(temporary, folder / name)


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
