"""The stream processor's Prometheus metrics, served on ``stream.metrics_port`` (what
k8s/monitoring's dashboard and alert rules read): freshness — seconds from an event's
acceptance by ``POST /v1/push`` to its features being servable, one observation per log
record (the events of a record were accepted at one time and written at one time) — and
events processed."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

FRESHNESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class StreamMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.freshness = Histogram(
            "featureline_feature_freshness_seconds",
            "Seconds from an event accepted by POST /v1/push to its features servable",
            buckets=FRESHNESS_BUCKETS, registry=self.registry)
        self.events = Counter("featureline_stream_events",
                              "Events the stream processor wrote into the online store",
                              registry=self.registry)

    def observe(self, freshness_s: Sequence[float], events: int) -> None:
        """One freshness per log record written, and the events they held."""
        for seconds in freshness_s:
            self.freshness.observe(max(0.0, seconds))
        self.events.inc(events)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` on ``port`` from a background thread."""
        start_http_server(port, addr=host, registry=self.registry)
