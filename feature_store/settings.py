"""The ``feature_store`` section of featureline.yaml: how Feast publishes the ETL's entity
tables."""

from __future__ import annotations

from typing import Literal

from featureline.core.settings import Duration, Settings


class FeatureStoreConfig(Settings):
    """How Feast publishes the ETL's entity tables (``feature_store/``)."""

    # The Feast repository: feature_store.yaml and the definitions derived from metadata.json.
    repo: str = "feature_store/feast_repo"
    # How long an entity's latest snapshot stands in point-in-time joins.
    ttl: Duration = "30d"
    # redis | redis_cluster | redis_sentinel; REDIS_URL names the server (a cluster: any
    # one of its nodes; Sentinel: redis+sentinel://host:26379,…/<primary>/<db>).
    redis_type: Literal["redis", "redis_cluster", "redis_sentinel"] = "redis"
    # With REDIS_URL unset, a private redis-server keeps its data here.
    redis_dir: str = "data/redis"
    # duckdb (embedded, in-process) | spark (Feast's Spark offline store, for scale).
    offline_store: Literal["duckdb", "spark"] = "duckdb"

    @property
    def cluster(self) -> bool:
        """The online store is a Redis Cluster (its clients route each key to its node)."""
        return self.redis_type == "redis_cluster"
