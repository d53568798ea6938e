"""Typed errors of the parameter server; each names the model, table or file at fault."""

from __future__ import annotations

from featureline.core.errors import FeaturelineError, NotFoundError, UnavailableError


class TableFileError(FeaturelineError):
    """An embedding file that cannot be imported: wrong size, wrong dim, duplicates, empty."""

    exit_code = 2
    hint = "check the table's source, format and dim in the parameter server's hps.yaml"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(f"{path}: {reason}")


class PersistentStoreBusyError(FeaturelineError):
    """Every replica folder of the persistent store is held by another process."""

    def __init__(self, path: str, replicas: int) -> None:
        self.path = path
        super().__init__(f"{path}: it and its {replicas - 1} worker replicas are all open in "
                         "other processes (RocksDB allows one process a folder)")


class PersistentStoreError(UnavailableError):
    """The persistent store could not read a table (a damaged file): a lookup that needs it
    is answered 503 while the replica is rebuilt from the table sources."""

    retry_after = True

    def __init__(self, replica: str, problem: str) -> None:
        self.replica = replica
        super().__init__(f"persistent store {replica}: {problem}")


class UnknownModelError(NotFoundError):
    def __init__(self, model: str, known: list[str]) -> None:
        self.model = model
        super().__init__(f"unknown model {model!r} (models: {', '.join(known) or 'none'})")


class UnknownTableError(NotFoundError):
    def __init__(self, model: str, table: str, known: list[str]) -> None:
        self.model = model
        self.table = table
        super().__init__(f"model {model!r} has no table {table!r} (tables: {', '.join(known)})")
