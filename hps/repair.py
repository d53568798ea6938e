"""Repair of a damaged L3 (persistent) store: rebuilt from the table sources beside the
one that serves, then swapped in, through the store's own rebuild operations
(``PersistentStore.rebuildable``); a store that has none is restored from a backup."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING

from featureline.hps.formats import fingerprint
from featureline.hps.persistent import PersistentStore, import_table
from featureline.hps.table import Table

logger = logging.getLogger("featureline.hps")


class Repairs:
    """The parameter server's repair of its persistent store (a part of ``ParameterServer``)."""

    if TYPE_CHECKING:
        persistent: PersistentStore
        tables: dict[str, dict[str, Table]]
        rebuilds: int
        _repair_lock: threading.Lock
        _repairing: threading.Thread | None

    @property
    def repairing(self) -> bool:
        return self._repairing is not None and self._repairing.is_alive()

    def _start_repair(self) -> None:
        with self._repair_lock:
            if not self.repairing:
                self._repairing = threading.Thread(target=self._repair, name="hps-repair",
                                                   daemon=True)
                self._repairing.start()

    def _repair(self) -> None:
        """Rebuild a damaged persistent store from the table sources beside it, then swap it
        in (docs/ARCHITECTURE.md, "Faults"). Until then lookups that need a damaged file
        are answered 503 and ``health()`` reports L3 down. Vectors of online updates since
        the import are not in the sources: the model's update consumers replay them from the
        stream once ``rebuilds`` has grown (hps/updates.py)."""
        damaged = self.persistent
        entries = [entry for tables in self.tables.values() for entry in tables.values()]
        unsourced = [entry.key for entry in entries if entry.config.source is None]
        if not damaged.rebuildable or unsourced:
            logger.error("%s is damaged and cannot be rebuilt here (%s): restore it from a "
                         "backup", damaged.replica,
                         f"no source for {', '.join(unsourced)}" if unsourced
                         else f"{type(damaged).__name__} is not rebuilt in place")
            return
        started = time.monotonic()
        rebuilt = damaged.rebuilt_beside()
        try:
            for entry in entries:
                assert entry.config.source is not None
                import_table(rebuilt, entry.key, entry.config,
                             fingerprint(entry.config.source, entry.config.format))
        except BaseException:
            rebuilt.close()
            raise
        with contextlib.ExitStack() as held:
            for entry in entries:
                held.enter_context(entry.lock)
            self.persistent, remove_old = damaged.swapped_with(rebuilt)
            for entry in entries:
                entry.size = self.persistent.size(entry.key)
            self.rebuilds += 1
        remove_old()
        logger.warning("%s was damaged: rebuilt from the table sources in %.1fs",
                       damaged.replica, time.monotonic() - started)
