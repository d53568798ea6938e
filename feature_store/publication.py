"""What the online store holds: the stamp ``featureline publish`` leaves in Redis beside the
values, so that every API worker can tell which dataset and vocabularies it serves
(docs/ARCHITECTURE.md, "Version stamps").

One hash per Feast project, ``featureline:publication:<project>``: the dataset version, the
ETL output it came from, when, and each vocabulary's version and lineage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from featureline.core.metadata import Metadata

KEY_PREFIX = "featureline:publication:"


def publication_key(project: str) -> str:
    return f"{KEY_PREFIX}{project}"


@dataclass(frozen=True)
class Publication:
    dataset_version: str
    output: str
    published_at: str
    # column → lineage (root first, the published vocabulary's version last)
    vocabularies: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, metadata: Metadata, output: str, published_at: str) -> Publication:
        """The stamp of an ETL output's metadata.json."""
        return cls(dataset_version=metadata.dataset_version, output=output,
                   published_at=published_at,
                   vocabularies={column: list(entry.lineage) for column, entry
                                 in metadata.vocabularies.items()})

    def to_json(self) -> dict[str, Any]:
        return {"dataset_version": self.dataset_version, "output": self.output,
                "published_at": self.published_at,
                "vocabularies": {c: lineage[-1] for c, lineage in self.vocabularies.items()}}


def read_publication(client: Any, project: str) -> Publication | None:
    """The stamp of the last publish into this store; None before the first."""
    fields = client.hgetall(publication_key(project))
    if not fields:
        return None
    text = {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
            for k, v in fields.items()}
    return Publication(dataset_version=text["dataset_version"], output=text["output"],
                       published_at=text["published_at"],
                       vocabularies=json.loads(text.get("vocabularies", "{}")))


def write_publication(client: Any, project: str, publication: Publication) -> None:
    client.hset(publication_key(project), mapping={
        "dataset_version": publication.dataset_version, "output": publication.output,
        "published_at": publication.published_at,
        "vocabularies": json.dumps(publication.vocabularies)})
