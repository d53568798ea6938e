"""The ``metadata.json`` contract between the ETL and every stage that reads its output.

The ETL writes one ``metadata.json`` per output folder (docs/ARCHITECTURE.md, "Contracts");
the feature store, the parameter server's exports and the API read it and the vocabularies
beside it. The id convention of every categorical feature: 0 is padding, 1 is
out-of-vocabulary (unseen, null, or below the frequency threshold), known values start at 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from featureline.core.aggregations import GroupSpec
from featureline.core.errors import MetadataFormatError, MetadataNotFoundError
from featureline.core.events import EventContract
from featureline.core.ids import FIRST_ID as FIRST_ID
from featureline.core.ids import OOV_ID as OOV_ID
from featureline.core.ids import PADDING_ID as PADDING_ID
from featureline.core.model_inputs import ModelInputs

METADATA_FILE = "metadata.json"
# Where the ETL writes and every later stage reads, unless configured otherwise.
DEFAULT_OUTPUT = "data/output"
# The timestamp column of the entity tables: a value at t uses only events before t.
EVENT_TIMESTAMP = "event_timestamp"
# artifacts/categorify/<column>/: Parquet (value, id, count), one row per known value.
VOCABULARY_DIR = "artifacts/categorify"
# tiles/<group>/<feature>/: Parquet, the aggregations' tiles as of the last event.
TILES_DIR = "tiles"
# state/events/: Parquet, the accepted events (a folder per UTC day), which an incremental
# run reads and ``featureline consistency`` recomputes the aggregations from.
STATE_DIR = "state"
# The examples' folder per UTC day under each split's: examples/split=<s>/day=YYYY-MM-DD/.
EXAMPLE_DAY = "day"
EVENTS_DIR = "events"
# aggregations/<group>/: Parquet, the groups' daily snapshots (Feast's offline store).
AGGREGATIONS_DIR = "aggregations"


def encoded_name(column: str) -> str:
    """The feature holding ``column``'s encoded ids: ``user_id`` → ``user_id_cat``."""
    return f"{column}_cat"


def compatible(lineage: list[str], other: list[str]) -> bool:
    """Whether ids encoded with two vocabularies, given by their lineages (root first, the
    vocabulary's own version last), mean the same: one extends the other, or they are one."""
    return bool(lineage and other) and (lineage[-1] in other or other[-1] in lineage)


# The metadata.json format this code writes. 1: outputs written before the field existed;
# they hold the same sections and are read as they are. A newer format is refused.
FORMAT_VERSION = 2
Section = TypeVar("Section")


class Contract(BaseModel):
    """A section of metadata.json: typed where readers use it; members a newer writer adds
    within the same format are kept, not refused."""

    model_config = ConfigDict(extra="allow", frozen=True)


class SourceInfo(Contract):
    path: str
    format: str


class RowAccounting(Contract):
    """Rows read = accepted + duplicates + quarantined (by reason)."""

    read: int
    accepted: int
    duplicates: int
    quarantined: dict[str, int]
    # With a label join: accepted = examples + positives + held_open + other, and the
    # positives without an impression before them (etl/label_join.py).
    label_join: dict[str, int] | None = None


class SplitInfo(Contract):
    column: str
    valid_days: int
    valid_from: str
    rows: dict[str, int]


class LabelInfo(Contract):
    name: str
    short_name: str
    dtype: str
    rule: str = ""


class FeatureInfo(Contract):
    """One output column of the examples (``etl.features.base.FeatureSpec.to_json``)."""

    name: str
    short_name: str
    dtype: str
    kind: str
    width: int = 1
    cardinality: int | None = None
    shares: str | None = None
    transform: dict[str, Any] | None = None
    # An aggregation feature's definition (etl/features/aggregate.py).
    aggregation: dict[str, Any] | None = None
    # A derived feature's expression (etl/features/derived.py).
    derived: str | None = None


class PlanEntry(Contract):
    """A categorical feature's embedding: rows, width, and its place in a fused table."""

    cardinality: int
    width: int
    fused_table: str | None = None
    row_offset: int = 0
    shares: str | None = None


class EmbeddingPlan(Contract):
    dtype: str = "float32"
    alignment_bytes: int = 16
    features: dict[str, PlanEntry]
    fused_tables: dict[str, Any] = Field(default_factory=dict)


class EntityColumn(Contract):
    name: str
    dtype: str


class EntityTable(Contract):
    """An entity snapshot table for Feast (``entities/<name>``)."""

    path: str
    join_key: str
    timestamp_field: str = EVENT_TIMESTAMP
    join_key_dtype: str = "string"
    features: list[EntityColumn]
    # The engine's spec of its features (``core.aggregations.GroupSpec`` as JSON).
    group: dict[str, Any] | None = None


class AggregationTable(Contract):
    """A group's daily snapshots for Feast (``aggregations/<group>``): its keys (raw values
    of the events' columns) and each output, by its name in the group."""

    path: str
    keys: list[EntityColumn]
    timestamp_field: str = EVENT_TIMESTAMP
    features: list[EntityColumn]


class TfrecordGroup(Contract):
    dtype: str
    columns: list[str]
    width: int


class TfrecordFile(Contract):
    path: str
    split: str
    rows: int
    # The UTC day of its examples (None: an output written before the day layout).
    day: str | None = None


class TfrecordInfo(Contract):
    prebatch_size: int
    compression: str = ""
    groups: dict[str, TfrecordGroup]
    files: list[TfrecordFile]


class VocabularyInfo(Contract):
    """A categorical column's vocabulary: its version, the one it extends, root first."""

    version: str
    parent: str | None = None
    lineage: list[str]
    path: str


class DatasetStamp(Contract):
    version: str
    config_hash: str = ""
    vocabularies: dict[str, str] = Field(default_factory=dict)
    extends: str | None = None


class ChecksVerdict(Contract):
    """The validation gate's verdict on the run (``core/drift.py``): passed, the reference
    output checked against (None: none to check against), and each breach (check, column,
    value, threshold)."""

    passed: bool = True
    reference: str | None = None
    breaches: list[dict[str, Any]] = Field(default_factory=list)


class TilesInfo(Contract):
    """The tiles as of the output's last event (``etl.aggregations.output_tiles``) of the
    aggregations' groups and of the entity tables' (``Metadata.tile_groups``): ``cut_us``,
    after every event; per output (``<group>:<feature>``) the table of its keys' tiles,
    relative to the output folder."""

    cut_us: int
    tables: dict[str, str] = Field(default_factory=dict)
    # The spec the tiles were computed with (the top-level ``aggregations:`` of the run):
    # what publish writes and the API serves.
    groups: list[GroupSpec] = Field(default_factory=list)


class FitInfo(Contract):
    """The fitted statistics the output's features were computed with (docs/ARCHITECTURE.md,
    "Fits"): ``version`` is the dataset version of the run that fitted them, ``from`` the
    output they were read from (None: fitted by this run), ``values_hash`` the settings they
    were fitted for."""

    version: str
    fitted_at: str
    # Where the fit's training split ended; None: not recorded.
    trained_until: str | None = None
    source: str | None = Field(default=None, alias="from")
    values_hash: str
    # From the end of the fit's training split to the end of this output's; None: unknown.
    age_days: float | None = 0.0


class Metadata(Contract):
    """``metadata.json``: the one contract between the ETL and every later stage."""

    format_version: int = 1
    featureline_version: str = ""
    created_at: str = ""
    config_hash: str = ""
    # Every section the ETL writes; a reader checks the ones it needs (``present``), so an
    # output holding only what Feast reads (its entity tables) is read too.
    source: SourceInfo | None = None
    rows: RowAccounting | None = None
    split: SplitInfo | None = None
    keys: list[str] = Field(default_factory=list)
    label: LabelInfo | None = None
    features: list[FeatureInfo] = Field(default_factory=list)
    embedding_plan: EmbeddingPlan | None = None
    entities: dict[str, EntityTable] = Field(default_factory=dict)
    # Per group of the aggregations' spec, its daily snapshots.
    aggregations: dict[str, AggregationTable] = Field(default_factory=dict)
    outputs: dict[str, str] = Field(default_factory=dict)
    artifacts: dict[str, Any] = Field(default_factory=dict)
    timings_s: dict[str, float] = Field(default_factory=dict)
    tfrecord: TfrecordInfo | None = None
    vocabularies: dict[str, VocabularyInfo] = Field(default_factory=dict)
    dataset: DatasetStamp | None = None
    # How the raw events were validated and labelled (pushed events are read the same way).
    events: EventContract | None = None
    # The validation gate's verdict on this run; None: written before the gate existed.
    checks: ChecksVerdict | None = None
    # The tiles of the aggregations' groups and the entity tables' groups.
    tiles: TilesInfo | None = None
    # The fit of its statistics; None: written before fits were recorded.
    fit: FitInfo | None = None
    # How each example feature is computed at a request time (``core.model_inputs``); None:
    # written before the model's inputs were served.
    inputs: ModelInputs | None = None
    # The output folder it was read from (not in the file): where its paths are relative to.
    folder: Path | None = Field(default=None, exclude=True)

    @property
    def dataset_version(self) -> str:
        """The version stamp of the output; outputs written before stamps existed get one
        from their creation time."""
        return self.dataset.version if self.dataset else f"unversioned:{self.created_at}"

    def events_folder(self) -> Path:
        """Where the output keeps its accepted events (``state/events``, a folder per day)."""
        return Path(self.folder or ".") / STATE_DIR / EVENTS_DIR

    def tile_groups(self) -> list[GroupSpec]:
        """Every group the output has tiles of: the aggregations' spec, then the entity
        tables' groups (``user``, ``item``: what the stream adds pushed events to)."""
        if self.tiles is None:
            return []
        tabled = {name.split(":", 1)[0] for name in self.tiles.tables}
        entities = [GroupSpec.model_validate(table.group) for table in self.entities.values()
                    if table.group is not None]
        return [*self.tiles.groups, *(g for g in entities if g.name in tabled)]

    @classmethod
    def parse(cls, data: dict[str, Any], source: str = "metadata.json") -> Metadata:
        """The typed metadata of ``data``; a format this code does not read, or a section
        that does not fit, is a :class:`MetadataFormatError` naming it."""
        version = data.get("format_version", 1)
        if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
            raise MetadataFormatError(source, f"format_version {version!r}; this Featureline "
                                              f"reads 1 to {FORMAT_VERSION}")
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise MetadataFormatError(source, f"{where}: {first['msg']} (format_version "
                                              f"{version})") from error


def present(value: Section | None, metadata: Metadata, section: str) -> Section:
    """``value``, a section of ``metadata`` that the reader needs; a
    :class:`MetadataFormatError` naming it when the output has none."""
    if value is None:
        raise MetadataFormatError(str(metadata_path(metadata.folder or ".")),
                                  f"no {section!r} section (format_version "
                                  f"{metadata.format_version})")
    return value


def metadata_path(output: str | Path) -> Path:
    return Path(output) / METADATA_FILE


def read_metadata(output: str | Path) -> Metadata:
    """The ``metadata.json`` of an ETL output folder, typed."""
    path = metadata_path(output)
    if not path.is_file():
        raise MetadataNotFoundError(str(output))
    metadata = Metadata.parse(json.loads(path.read_text()), str(path))
    return metadata.model_copy(update={"folder": Path(output)})
