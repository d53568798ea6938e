"""What the online store holds: the stamp ``featureline publish`` leaves in Redis beside the
values, so that every API worker can tell which dataset and vocabularies it serves
(docs/ARCHITECTURE.md, "Version stamps").

One hash per Feast project, ``featureline:publication:<project>``: the dataset version, the
ETL output it came from, when, each vocabulary's version and lineage, and the generation of
entity vectors readers read (docs/ARCHITECTURE.md, "Publishing").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from featureline.core.metadata import Metadata

KEY_PREFIX = "featureline:publication:"
# How a generation's keys are named. 2: tile keys end in a Redis Cluster hash tag
# (``feature_store.tiles.tile_key``). A stamp of another layout (one without the field: 1)
# makes the next publish a replace, which writes every key under the names read now.
STORE_LAYOUT = 2


def publication_key(project: str) -> str:
    return f"{KEY_PREFIX}{project}"


def generations_key(project: str) -> str:
    """The counter of the project's generations of entity vectors: a replace takes the next
    number, so a killed replace's partial generation is never written into again."""
    return f"featureline:generations:{project}"


@dataclass(frozen=True)
class Publication:
    dataset_version: str
    output: str
    published_at: str
    # column → lineage (root first, the published vocabulary's version last)
    vocabularies: dict[str, list[str]] = field(default_factory=dict)
    # The entity vectors served: a replace writes the next generation beside this one, then
    # moves this number (0: a store without vectors).
    generation: int = 0
    # The key layout the generation was written in (:data:`STORE_LAYOUT`).
    layout: int = STORE_LAYOUT

    @classmethod
    def of(cls, metadata: Metadata, output: str, published_at: str,
           generation: int) -> Publication:
        """The stamp of an ETL output's metadata.json, serving vectors of ``generation``."""
        return cls(dataset_version=metadata.dataset_version, output=output,
                   published_at=published_at,
                   vocabularies={column: list(entry.lineage) for column, entry
                                 in metadata.vocabularies.items()}, generation=generation)

    def to_json(self) -> dict[str, Any]:
        return {"dataset_version": self.dataset_version, "output": self.output,
                "published_at": self.published_at,
                "vocabularies": {c: lineage[-1] for c, lineage in self.vocabularies.items()}}
