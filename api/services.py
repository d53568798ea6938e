"""What the routes work with, opened once per process: the online reader, the vocabularies,
the parameter server, the metrics and the API keys."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from fastapi import Request
from feast import ValueType

from featureline.api.broadcast import EvictionListener, ReloadListener, announce
from featureline.api.errors import LimitExceededError, UnknownEntityKeyError
from featureline.api.feature_log import Activity, FeatureLogger
from featureline.api.metrics import Metrics
from featureline.api.model_inputs import ServedInputs
from featureline.api.settings import Scope, ServingConfig, api_keys
from featureline.api.versions import check, embedding_versions
from featureline.api.vocabulary import Vocabularies
from featureline.core.aggregations import GroupSpec
from featureline.core.drift import METRICS_FILE as CHECKS_METRICS
from featureline.core.errors import UnavailableError
from featureline.core.events import EventContract
from featureline.core.metadata import encoded_name, read_metadata
from featureline.core.scoring import GATE_METRICS, Ranker, load_rankers
from featureline.feature_store.feature_log import (
    REPORT_METRICS,
    feature_types,
    input_types,
    logged_aggregations,
)
from featureline.feature_store.online import OnlineReader, ValueCache
from featureline.feature_store.repo import open_repo
from featureline.hps import ParameterServer
from featureline.hps.errors import UnknownModelError
from featureline.hps.updates import UpdateConsumer, start_consumers
from featureline.stream.log import EventLog, open_event_log, written_topic
from featureline.stream.push import Pusher

logger = logging.getLogger("featureline.api")
T = TypeVar("T")


class ModelSwap:
    """A sequence lock between /v1/rank and a reload: a ranking waits while a reload changes
    the tables, the dense part and the vocabularies, and runs again when one began while it
    ran — every score reads one model (docs/ARCHITECTURE.md, "Scoring")."""

    def __init__(self) -> None:
        self._generation = 0  # odd while a reload changes the model
        self._writer = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        # How long the latest change held the rankings.
        self.held_s = 0.0

    @contextmanager
    def changing(self) -> Iterator[None]:
        with self._writer:
            self._idle.clear()
            self._generation += 1
            started = time.perf_counter()
            try:
                yield
            finally:
                self.held_s = time.perf_counter() - started
                self._generation += 1
                self._idle.set()

    def read(self, compute: Callable[[], T]) -> T:
        while True:
            self._idle.wait()
            start = self._generation
            if start % 2:
                continue
            result = compute()
            if self._generation == start:
                return result


@dataclass
class Services:
    config: ServingConfig
    reader: OnlineReader
    vocabularies: Vocabularies
    hps: ParameterServer | None
    metrics: Metrics
    api_keys: dict[str, Scope]
    # The served ETL output's dataset version, and each vocabulary's lineage.
    dataset_version: str
    lineages: dict[str, list[str]]
    # The fit of its statistics (metadata.json's fit.version; None: not recorded).
    fit_version: str | None = None
    # Background work of this process: reloads announced by other workers, online updates.
    listener: ReloadListener | None = None
    evictions: EvictionListener | None = None
    consumers: list[UpdateConsumer] = field(default_factory=list)
    # The ETL output served (api.data): a reload reads its vocabularies and stamp again.
    output: Path | None = None
    # Where POST /v1/push appends; None when the served output records no event contract.
    event_log: EventLog | None = None
    contract: EventContract | None = None
    # What /v1/features and /v1/ranking-inputs served (api.feature_logging); None: off.
    feature_log: FeatureLogger | None = None
    # Requests in flight (the serving middleware counts them): background work waits for
    # a moment without any.
    activity: Activity = field(default_factory=Activity)
    # How the served output's example features are computed at a request time; None: it
    # records none.
    inputs: ServedInputs | None = None
    # The models exported beside the parameter server's tables (the dense part, the trees),
    # by name.
    rankers: dict[str, Ranker] = field(default_factory=dict)
    # What a reload holds /v1/rank with.
    swap: ModelSwap = field(default_factory=ModelSwap)

    def pusher(self) -> Pusher:
        if self.event_log is None or self.contract is None:
            raise UnavailableError("the served ETL output records no event contract "
                                   "(metadata.json 'events'): run the ETL again to push "
                                   "events")
        return Pusher(self.contract, self.event_log)

    def parameter_server(self) -> ParameterServer:
        if self.hps is None:
            raise UnavailableError("no parameter server is configured (api.hps)")
        return self.hps

    def ranker(self, name: str) -> Ranker:
        """The model ``name`` that /v1/rank scores with: 404 when none of that name was
        exported, 503 when it was trained on another fit than the served dataset's."""
        model = self.rankers.get(name)
        if model is None:
            raise UnknownModelError(name, sorted(self.rankers))
        fit = model.versions.get("fit")
        if fit is not None and self.fit_version is not None and fit != self.fit_version:
            raise UnavailableError(f"model {name}: trained on examples of fit {fit}; the "
                                   f"served dataset {self.dataset_version} is of fit "
                                   f"{self.fit_version}: train on it and reload the model")
        return model

    def check_limit(self, field: str, got: int, limit: int) -> None:
        if got > limit:
            raise LimitExceededError(field, limit, got)

    def raw_entities(self, entities: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
        """Join key → ids, decoding encoded ids (``user_id_cat``) with the vocabularies."""
        join_keys = {layout.join_key: layout.value_type for layout in self.reader.views.values()}
        for group in self.reader.groups.values():  # raw event columns: text
            join_keys.update(dict.fromkeys(group.keys, ValueType.STRING))
        raw: dict[str, list[Any]] = {}
        for key, ids in entities.items():
            column = self.vocabularies.column_of(key)
            if key in join_keys:
                as_text = join_keys[key] == ValueType.STRING
                raw[key] = [str(i) for i in ids] if as_text else list(ids)
            elif column in join_keys:
                if not all(isinstance(i, int) for i in ids):
                    raise UnknownEntityKeyError(key, [], "encoded ids are integers")
                raw[column] = self.vocabularies.decode(column, ids)
            else:
                known = [*join_keys, *(encoded_name(c) for c in join_keys
                                       if c in self.vocabularies.encoding)]
                raise UnknownEntityKeyError(key, known)
        return raw

    def reload(self, model: str) -> tuple[dict[str, int], int]:
        """Reload ``model`` here and announce it to every other process: rows read per table,
        and how many processes heard the announcement (this one included). A served ranker's
        name (``ranker-gbdt``) reloads the tables it scores with (``api.ranking.model``) and
        every exported ranker with them."""
        tables = self.tables_model(model)
        rows = self.reload_here(tables)
        return rows, announce(self.reader.store, self.reader.project, tables)

    def tables_model(self, model: str) -> str:
        """The parameter server's model a reload of ``model`` reads: its own tables, or the
        ranking tables of a served ranker."""
        served = list(self.parameter_server().tables)
        if model in served:
            return model
        if model in self.rankers:
            return self.config.api.ranking.model
        raise UnknownModelError(model, [*served, *(r for r in self.rankers if r not in served)])

    def reload_here(self, model: str) -> dict[str, int]:
        """The model's tables (``ParameterServer.reload``), its dense part, and the served
        output's vocabularies and version stamp, read again: the daily chain rewrote all of
        them, and ids the new vocabularies added would otherwise be encoded
        out-of-vocabulary until a restart. Everything is read before anything changes (a part
        that does not load stops the reload), then changed together while /v1/rank waits."""
        server = self.parameter_server()
        dataset = _dataset(self.output) if self.output is not None else None
        rankers = _rankers(self.config.api.hps)

        @contextmanager
        def swapping() -> Iterator[None]:
            with self.swap.changing():
                yield
                self.rankers = rankers
                if dataset is not None:
                    self.vocabularies, self.lineages = dataset.vocabularies, dataset.lineages
                    self.dataset_version, self.fit_version = dataset.version, dataset.fit_version
                    self.contract, self.inputs = dataset.contract, dataset.inputs
                    self.reader.set_groups(dataset.groups, dataset.entity_groups)

        return server.reload(model, applying=swapping())

    def close(self) -> None:
        if self.feature_log is not None:
            self.feature_log.close()
        for consumer in self.consumers:
            consumer.stop()
        if self.listener is not None:
            self.listener.stop()
        if self.evictions is not None:
            self.evictions.stop()
        if self.hps is not None:
            self.hps.close()
        if self.event_log is not None:
            self.event_log.close()
        self.reader.store.close()


def open_services(config: ServingConfig, *, output: str | Path | None = None,
                  redis_url: str | None = None) -> Services:
    output = output or config.data
    repo = open_repo(config.feature_store, output, url=redis_url)
    caching = config.api.feature_cache
    cache = ValueCache(caching.ttl_s, caching.max_entities) if caching.ttl_s > 0 else None
    dataset = _dataset(output)
    reader = OnlineReader.from_store(repo.store, repo.redis_url, cache, dataset.groups,
                                     dataset.entity_groups)
    hps = ParameterServer.from_config(config.api.hps) if config.api.hps else None
    metrics = Metrics()
    if hps is not None:
        metrics.watch_hps(hps.stats)
    keys = api_keys(config.api.auth)
    if config.api.auth.enabled and not keys:
        logger.warning("API authentication is on but no key is configured (api.auth.keys_file, "
                       "FEATURELINE_API_KEYS): every request will be answered 401")
    services = Services(config, reader, dataset.vocabularies, hps, metrics, keys,
                        dataset.version, dataset.lineages, dataset.fit_version,
                        output=Path(output), contract=dataset.contract,
                        inputs=dataset.inputs, rankers=_rankers(config.api.hps),
                        event_log=open_event_log(config.stream, reader.url,
                                                 config.feature_store.cluster))
    metrics.watch_store(reader.ping, lambda: check(services))
    # The newest ETL run's validation gate (written whether or not it was published).
    metrics.watch_report(Path(output) / CHECKS_METRICS)
    if config.api.feature_logging.path:
        services.feature_log = FeatureLogger(
            config.api.feature_logging, feature_types(repo.definitions.views),
            {name: layout.join_key for name, layout in reader.views.items()},
            lambda: (services.dataset_version, json.dumps(embedding_versions(services))),
            services.activity, logged_aggregations(repo.definitions.group_views,
                                                   repo.definitions.join_keys),
            input_types(dataset.inputs.features) if dataset.inputs is not None else None)
        metrics.watch_feature_log(services.feature_log)
        metrics.watch_report(Path(config.api.feature_logging.path) / REPORT_METRICS)
    if cache is not None:
        metrics.watch_feature_cache(cache)
        services.evictions = EvictionListener(reader.store, written_topic(reader.project),
                                              cache)
    if hps is not None:
        # The quality gate's latest verdict on what replaces the served model.
        metrics.watch_report(Path(str(config.api.hps)).parent / GATE_METRICS)
        services.listener = ReloadListener(reader.store, reader.project,
                                           services.reload_here).start()
        services.consumers = start_consumers(hps)
        metrics.watch_updates(lambda: services.consumers)
        metrics.watch_tiers(hps.health)
    return services


def _rankers(hps: str | None) -> dict[str, Ranker]:
    """The models the trainer exported beside the parameter server's configuration, by
    name; none without one."""
    return load_rankers(Path(hps).parent) if hps else {}


class _Dataset(NamedTuple):
    """What the API reads of its ETL output."""

    vocabularies: Vocabularies
    # Each vocabulary's lineage.
    lineages: dict[str, list[str]]
    version: str
    # The contract of its raw events.
    contract: EventContract | None
    # The aggregation groups of its tiles.
    groups: list[GroupSpec]
    fit_version: str | None
    # The entity tables' groups of its tiles.
    entity_groups: list[GroupSpec]
    inputs: ServedInputs | None


def _dataset(output: str | Path) -> _Dataset:
    metadata = read_metadata(output)
    lineages = {column: list(entry.lineage) for column, entry in metadata.vocabularies.items()}
    entity_groups = [group for group in metadata.tile_groups() if group.name in metadata.entities]
    return _Dataset(Vocabularies.from_output(output), lineages, metadata.dataset_version,
                    metadata.events, metadata.tiles.groups if metadata.tiles else [],
                    metadata.fit.version if metadata.fit else None, entity_groups,
                    ServedInputs.of(output, metadata))


async def get_services(request: Request) -> Services:
    # async: FastAPI runs a plain def dependency in its thread pool, a hop per request.
    return request.app.state.services
