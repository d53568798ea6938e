"""Hot reload of a model's tables: its settings and table sources read again and applied
(rows as an update, a widened or added table imported whole into a new entry, a dropped one
removed), one reload at a time (a part of ``ParameterServer``)."""

from __future__ import annotations

import contextlib
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from featureline.core.errors import ConfigError
from featureline.hps.config import HpsConfig, ModelConfig, TableConfig, load_hps_config
from featureline.hps.errors import UnknownModelError
from featureline.hps.formats import fingerprint, read_table
from featureline.hps.persistent import PersistentStore, write_table
from featureline.hps.table import Table, table_key


class Reloads:
    """The parameter server's reloads."""

    if TYPE_CHECKING:
        config: HpsConfig
        config_path: Path | None
        persistent: PersistentStore
        tables: dict[str, dict[str, Table]]
        _reload_lock: threading.Lock

        def apply_update(self, model: str, table: str, keys: np.ndarray,
                         vectors: np.ndarray) -> None: ...

        def _entry(self, model: str, config: TableConfig, size: int, cache_fraction: float,
                   hit_rate_threshold: float) -> Table: ...

        def _warm(self, model: str, config: TableConfig, keys: np.ndarray,
                  vectors: np.ndarray) -> None: ...

    def reload(self, model: str, applying: AbstractContextManager[Any] | None = None
               ) -> dict[str, int]:
        """Read the model's settings and table sources again and apply them: the rows of a
        table whose width is unchanged as an update (L3, L2, L1); a table the configuration
        widened, or added, imported whole into a new entry that then replaces it (lookups of it
        wait for the import); a table the configuration no longer lists, removed.

        The settings come from the configuration file again when the server was opened from
        one (``from_config``; the daily chain's train step rewrites it), so a new width or
        vocabulary version is served without a restart; server-wide settings (tiers, cache
        device) still need one. Keys that left a source stay in L3. Every source is read
        (and checked) before any table changes, so a source that cannot be read, or a
        configuration that does not load, leaves all of them as they were. Returns the rows
        read per table.

        ``applying``: entered once every source is read, around the changes (the API holds
        its rankings there, so that no score reads some tables old and others new).
        """
        with self._reload_lock:
            return self._reload(model, applying or contextlib.nullcontext())

    def _reload(self, model: str, applying: AbstractContextManager[Any]) -> dict[str, int]:
        settings = self._model_settings(model)
        served = self.tables[model]
        for config in settings.tables:
            entry = served.get(config.name)
            if config.source is None and (entry is None or entry.config.dim != config.dim):
                raise ConfigError(f"hps.models.{model}.tables.{config.name}",
                                  "a table without a source can be added or change width only "
                                  "by a restart with an empty persistent store")
        sources = {}
        for config in settings.tables:
            if config.source is not None:
                mark = fingerprint(config.source, config.format)
                sources[config.name] = (config, mark,
                                        *read_table(config.source, config.format, config.dim))
        with applying:
            for name, (config, mark, keys, vectors) in sources.items():
                entry = served.get(name)
                if entry is not None and entry.config.dim == config.dim:
                    with entry.lock:
                        entry.config = config  # its vocabulary version, source, default value
                    self.apply_update(model, name, keys, vectors)
                    self.persistent.set_import_mark(entry.key, mark)
                    entry.size = self.persistent.size(entry.key)
                else:
                    self._replace(model, settings, config, entry, mark, keys, vectors)
            for name in [n for n in served if n not in {t.name for t in settings.tables}]:
                with served[name].lock:
                    served[name].retired = True
                    self._serve(model, name, None)
        self.config = self.config.model_copy(update={"models": [
            settings if m.name == model else m for m in self.config.models]})
        return {name: len(keys) for name, (_, _, keys, _) in sources.items()}

    def _model_settings(self, model: str) -> ModelConfig:
        """The model's settings as they are now: read again from the configuration file when
        there is one."""
        if model not in self.tables:
            raise UnknownModelError(model, list(self.tables))
        config = load_hps_config(self.config_path) if self.config_path else self.config
        settings = next((m for m in config.models if m.name == model), None)
        if settings is None:
            raise ConfigError("hps.models", f"{self.config_path}: model {model!r} is no longer "
                              "configured; it is served as it was until a restart")
        return settings

    def _replace(self, model: str, settings: ModelConfig, config: TableConfig,
                 entry: Table | None, mark: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Import a table whole into L3 and serve it from a new entry (a new L1 of its width;
        L2 names it with its width, ``cache_key``), retiring the entry it replaces."""
        key = table_key(model, config.name)
        new = self._entry(model, config, len(keys), settings.cache_fraction,
                          settings.hit_rate_threshold)
        with entry.lock if entry is not None else contextlib.nullcontext():
            self.persistent.drop(key)
            write_table(self.persistent, key, keys, vectors, mark)
            self._warm(model, config, keys, vectors)
            self._serve(model, config.name, new)
            if entry is not None:
                entry.retired = True
                entry.generation += 1  # its queued background insertions are dropped

    def _serve(self, model: str, name: str, entry: Table | None) -> None:
        """Serve ``entry`` as the table (None: no longer serve it). The model's tables are
        replaced, not changed, so a thread iterating them (stats, health) never sees them
        change size."""
        tables = {n: t for n, t in self.tables[model].items() if n != name}
        self.tables[model] = tables if entry is None else {**tables, name: entry}
