"""Prometheus metrics: latency per route, errors by kind, the HPS keys per tier and tier
health, online updates and their lag, the online store's health and the version stamps
(what k8s/monitoring's dashboard and alert rules read)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class HpsCollector(Collector):
    """Read at scrape time from the parameter server's own counters."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        share = GaugeMetricFamily("featureline_hps_keys_share",
                                  "Share of looked-up keys answered by each tier",
                                  labels=["model", "table", "tier"])
        keys = GaugeMetricFamily("featureline_hps_table_keys", "Keys in each table",
                                 labels=["model", "table"])
        for model, tables in self.stats().items():
            for table, entry in tables.items():
                answered = entry["keys_by_tier"]
                total = sum(answered.values()) or 1
                for tier, count in answered.items():
                    share.add_metric([model, table, tier], count / total)
                keys.add_metric([model, table], entry["keys"])
        yield share
        yield keys


class TiersCollector(Collector):
    """Whether the parameter server's lower tiers answer, read at scrape time."""

    def __init__(self, health: Callable[[], dict[str, bool]]) -> None:
        self.health = health

    def collect(self) -> Iterator[Metric]:
        available = GaugeMetricFamily("featureline_hps_tier_available",
                                      "1 when the tier answers (l2: its circuit breaker is "
                                      "closed), else 0", labels=["tier"])
        for tier, up in self.health().items():
            available.add_metric([tier], 1.0 if up else 0.0)
        yield available


class UpdatesCollector(Collector):
    """Online updates of this process, read at scrape time from its consumers."""

    def __init__(self, consumers: Callable[[], list[Any]]) -> None:
        self.consumers = consumers

    def collect(self) -> Iterator[Metric]:
        updates = CounterMetricFamily(
            "featureline_hps_updates", "Update messages by outcome: applied, or dead-lettered "
            "(could never apply; kept in the model's dead-letter stream)",
            labels=["model", "outcome"])
        lag = GaugeMetricFamily(
            "featureline_hps_update_lag_seconds", "How far the update consumer is behind its "
            "stream: the newest message's time less the last one delivered", labels=["model"])
        for consumer in self.consumers():
            updates.add_metric([consumer.model, "applied"], consumer.applied)
            updates.add_metric([consumer.model, "dead_lettered"], consumer.dead_lettered)
            behind = consumer.lag_seconds()
            if behind is not None:
                lag.add_metric([consumer.model], behind)
        yield updates
        yield lag


class FeatureCacheCollector(Collector):
    """Entities answered from the process's feature cache, and those read from Redis."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        lookups = CounterMetricFamily(
            "featureline_feature_cache_lookups", "Entity lookups of the online-feature cache, "
            "by result (hit: answered from memory; miss: read from Redis)", labels=["result"])
        lookups.add_metric(["hit"], self.cache.hits)
        lookups.add_metric(["miss"], self.cache.misses)
        yield lookups


class FeatureLogCollector(Collector):
    """Feature logging of this process (api/feature_log.py)."""

    def __init__(self, feature_log: Any) -> None:
        self.feature_log = feature_log

    def collect(self) -> Iterator[Metric]:
        log = self.feature_log
        for name, text, value in (
                ("rows", "Served rows written to the feature log", log.rows),
                ("files", "Feature log files published", log.files),
                ("dropped_requests", "Sampled requests not logged (the queue was full, or "
                 "a file could not be written)", log.dropped)):
            family = CounterMetricFamily(f"featureline_feature_log_{name}", text)
            family.add_metric([], value)
            yield family


class ReportCollector(Collector):
    """A job's metrics in Prometheus' text format (``featureline consistency``'s report, the
    ETL's checks), read at scrape time from the file the job wrote (none until it ran)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self) -> Iterator[Metric]:
        try:
            text = self.path.read_text()
        except OSError:
            return
        yield from text_string_to_metric_families(text)


class StoreCollector(Collector):
    """The online store's health and the version stamps (docs/ARCHITECTURE.md, "Version
    stamps"), read at scrape time as /readyz reads them."""

    def __init__(self, ping: Callable[[], bool], versions: Callable[[], Any]) -> None:
        self.ping = ping
        self.versions = versions

    def collect(self) -> Iterator[Metric]:
        up = self.ping()
        versions = self.versions() if up else None
        published = versions is not None and versions.online_store is not None
        available = GaugeMetricFamily("featureline_online_store_available",
                                      "1 when the online store's Redis answers and holds a "
                                      "published dataset, else 0")
        available.add_metric([], 1.0 if up and published else 0.0)
        yield available
        holds = GaugeMetricFamily("featureline_online_store_published",
                                  "1 when the online store holds a published dataset, 0 when "
                                  "it answers empty (absent while it does not answer)")
        if up:
            holds.add_metric([], 1.0 if published else 0.0)
        yield holds
        info = GaugeMetricFamily(
            "featureline_dataset_info", "The dataset whose vocabularies the API encodes ids "
            "with, and the one the online store holds (1 per pair)",
            labels=["api_dataset", "online_dataset"])
        compatible = GaugeMetricFamily(
            "featureline_versions_compatible", "1 when the online store and every embedding "
            "table encode ids as the API does and the tables were trained on its data's fit, "
            "else 0")
        if versions is not None:
            online = (versions.online_store or {}).get("dataset_version", "")
            info.add_metric([versions.dataset_version, online], 1.0)
        if versions is not None and published:  # empty: _published 0, not a skew
            compatible.add_metric([], 0.0 if versions.problems else 1.0)
        yield info
        yield compatible


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram("featureline_api_request_seconds", "Request latency by route",
                                 ["route", "method", "status"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.errors = Counter("featureline_api_errors_total", "Errors by kind", ["kind"],
                              registry=self.registry)
        self.version_skew = Counter(
            "featureline_version_skew_total",
            "Readiness checks that found the online store or an embedding table encoding ids "
            "with a vocabulary incompatible with the API's, or a table trained on another fit",
            registry=self.registry)

    def count_error(self, kind: str) -> None:
        self.errors.labels(kind=kind).inc()

    def watch_hps(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.registry.register(HpsCollector(stats))

    def watch_tiers(self, health: Callable[[], dict[str, bool]]) -> None:
        self.registry.register(TiersCollector(health))

    def watch_store(self, ping: Callable[[], bool], versions: Callable[[], Any]) -> None:
        self.registry.register(StoreCollector(ping, versions))

    def watch_feature_cache(self, cache: Any) -> None:
        self.registry.register(FeatureCacheCollector(cache))

    def watch_feature_log(self, feature_log: Any) -> None:
        self.registry.register(FeatureLogCollector(feature_log))

    def watch_report(self, path: Path) -> None:
        self.registry.register(ReportCollector(path))

    def watch_updates(self, consumers: Callable[[], list[Any]]) -> None:
        self.registry.register(UpdatesCollector(consumers))
