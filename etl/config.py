"""The ETL's settings: the ``etl`` section of ``featureline.yaml``, validated by pydantic
before Spark starts.

Feature ops name their input columns by role (``user_id``, ``item_id``, ``event_type``,
``ts``, ``value``) or by context column; the selectors ``@categorical`` and ``@continuous``
stand for every declared context column of that kind, so the ``--categorical`` and
``--continuous`` flags retarget the default pipeline at another log without editing YAML.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args

from pydantic import Field, field_validator, model_validator

from featureline.core.aggregations import LABEL as LABEL_COLUMN
from featureline.core.aggregations import GroupSpec, check_groups, operation_of
from featureline.core.derive import DeriveSpec, references
from featureline.core.drift import ChecksConfig
from featureline.core.errors import ConfigError
from featureline.core.events import (
    ROLES,
    UNTYPED_EVENT,
    ColumnRole,
    EventContract,
    LabelSpec,
    parse_rule,
)
from featureline.core.metadata import DEFAULT_OUTPUT
from featureline.core.settings import Duration, Settings, duration_seconds, validate
from featureline.etl.errors import LabelRuleError
from featureline.etl.features import OP_SETTINGS
from featureline.etl.features.base import (
    CATEGORICAL_SELECTOR,
    CONTINUOUS_SELECTOR,
    ColumnRoles,
    OpSettings,
)
from featureline.etl.features.categorify import CategorifySettings
from featureline.etl.features.count_encode import CountEncodeSettings
from featureline.etl.features.cyclic_time import CyclicTimeSettings
from featureline.etl.features.hashed_cross import HashedCrossSettings
from featureline.etl.features.history import HistorySettings
from featureline.etl.features.lag_features import LagFeaturesSettings
from featureline.etl.features.model_ready import ModelReadyConfig
from featureline.etl.features.normalize import NormalizeSettings
from featureline.etl.features.target_encode import TargetEncodeSettings
from featureline.etl.stages import InputFormat

SHORT_NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,2}$")
# A value of etl.source.options: Spark's reader takes every option as text.
ReaderOption = str | bool | int | float
# The text between two values of a multi-valued column, taken as it is (not a pattern).
Separator = Annotated[str, Field(min_length=1)]


class RoleColumns(Settings):
    """The source's own column names for each role of the canonical raw-log schema."""

    # The column holding the user's id.
    user_id: str = "user_id"
    # The column holding the item's id.
    item_id: str = "item_id"
    # The column holding the event's type (one of etl.validation.event_types); null: the log
    # has none, and every event's type is "event" (UNTYPED_EVENT).
    event_type: str | None = "event_type"
    # The column holding the event's time: ISO-8601 text or epoch seconds / milliseconds.
    ts: str = "ts"
    # The column holding an optional number (rating, price, dwell time); null: none.
    value: str | None = "value"


_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def safe_name(column: str) -> str:
    """The name a column of the file goes by in the job, its features and its TFRecords:
    every character but ASCII letters, digits and ``_`` made ``_`` (``occupation:token`` →
    ``occupation_token``), ``c_`` before a leading digit."""
    safe = _UNSAFE.sub("_", column)
    return f"c_{safe}" if safe[:1].isdigit() else safe


def _renamed(data: dict[str, Any], kinds: tuple[str, ...]) -> dict[str, Any]:
    """A section's context columns by their safe names, ``source_names`` keeping each
    renamed one's name in the file; two names made one are an error naming the key."""
    names = dict(data.get("source_names") or {})
    data = dict(data)
    for kind in kinds:
        columns = data.get(kind)
        if not isinstance(columns, list):
            continue
        safe = []
        for column in columns:
            if not isinstance(column, str) or not column:
                safe.append(column)
                continue
            name = safe_name(column)
            if name != column and names.setdefault(name, column) != column:
                raise ValueError(f"{kind}: {column!r} and {names[name]!r} both go by "
                                     f"{name!r} in the features: rename one in the file")
            safe.append(name)
        data[kind] = safe
    if isinstance(data.get("roles"), dict):
        data["roles"] = {safe_name(k) if isinstance(k, str) and k else k: v
                         for k, v in data["roles"].items()}
    return {**data, "source_names": names} if names else data


def _value_role() -> dict[str, ColumnRole]:
    """The value role (a rating, a dwell time) is observed after the event, unless listed."""
    return {"value": "outcome"}


def _demo_roles() -> dict[str, ColumnRole]:
    return {**_value_role(), "category": "item", "price": "item", "device": "request"}


class ReaderSettings(Settings):
    """A file Spark reads: where, in which format, with which of the reader's options."""

    # A path or a glob.
    path: str
    # The files' format.
    format: InputFormat = "csv"
    # Options of Spark's reader for the format, as Spark names them (csv: sep, header, quote,
    # escape, encoding, nullValue, comment, …; parquet: mergeSchema, …). CSV files have a
    # header line unless header is false; a headerless file's columns are _c0, _c1, …
    options: dict[str, ReaderOption] = Field(default_factory=dict)
    # The file's own name of each context column renamed to a safe name (filled in from the
    # declared columns; see safe_name).
    source_names: dict[str, str] = Field(default_factory=dict)

    def reader_options(self) -> dict[str, str]:
        """``options`` as Spark's reader takes them: every value as text (true, not True)."""
        return {name: str(value).lower() if isinstance(value, bool) else str(value)
                for name, value in self.options.items()}

    @property
    def encoding(self) -> str:
        """The files' character set: Spark's ``encoding`` option (or ``charset``), UTF-8."""
        options = self.reader_options()
        return options.get("encoding", options.get("charset", "UTF-8"))

    def source_name(self, column: str) -> str:
        """A column's name in the file."""
        return self.source_names.get(column, column)


class AttributeFile(ReaderSettings):
    """A table of user or item attributes beside the log (docs/ARCHITECTURE.md, "Raw
    events"): each event reads its key's row, or with ``valid_from`` the row valid at the
    event's time (never a later one). Its columns are context columns of the events, known
    as attributes of the key's entity."""

    # The table's name, in messages.
    name: str
    # The role the table is keyed by and the file's column holding it: {item_id: movie_id}.
    key: dict[Literal["user_id", "item_id"], str] = Field(min_length=1, max_length=1)
    # Its categorical columns.
    categorical: list[str] = Field(default_factory=list)
    # Its numeric columns.
    continuous: list[str] = Field(default_factory=list)
    # Its multi-valued columns, each with the text between two values: {genres: "|"}. Each
    # is a categorical column whose feature is the list of its values' ids (categorify).
    lists: dict[str, Separator] = Field(default_factory=dict)
    # The file's column of the time from which a row holds (ISO-8601 or epoch, read as
    # etl.validation.ts_unit says); null: one row per key, always valid.
    valid_from: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _safe_names(cls, data: Any) -> Any:
        """Context columns by their safe names; each list column is a categorical one."""
        if not isinstance(data, dict):
            return data
        data = _lists_categorical(data)
        lists = data.get("lists")
        if isinstance(lists, dict):
            data = {**data, "lists": {safe_name(c) if isinstance(c, str) and c else c: sep
                                      for c, sep in lists.items()}}
        return _renamed(data, ("categorical", "continuous"))

    @model_validator(mode="after")
    def _columns_distinct(self) -> AttributeFile:
        both = set(self.categorical) & set(self.continuous)
        if both:
            raise ValueError(f"columns declared both categorical and continuous: {sorted(both)}")
        return self

    @property
    def key_role(self) -> Literal["user_id", "item_id"]:
        return next(iter(self.key))

    @property
    def role(self) -> ColumnRole:
        return "user" if self.key_role == "user_id" else "item"

    @property
    def columns(self) -> list[str]:
        """Its attribute columns, by their safe names."""
        return [*self.categorical, *self.continuous]


def _lists_categorical(entry: dict[str, Any]) -> dict[str, Any]:
    """An attribute file's entry as written, its list columns added to its categorical ones
    (by the names written: safe names come after)."""
    lists, categorical = entry.get("lists"), entry.get("categorical")
    if not isinstance(lists, dict) or not lists:
        return entry
    categorical = list(categorical) if isinstance(categorical, list) else []
    return {**entry, "categorical": [*categorical, *(c for c in lists if c not in categorical)]}


class SourceConfig(ReaderSettings):
    """The raw log: where it is, its format, and what its columns mean."""

    # A path or a glob; --input overrides it.
    path: str = "data/raw/events.jsonl"
    # The files' format; --format overrides it.
    format: InputFormat = "jsonl"
    columns: RoleColumns = RoleColumns()
    # Context columns; the defaults are those of `featureline datagen`.
    categorical: list[str] = Field(default_factory=lambda: ["category", "device"])
    # Numeric context columns; --continuous overrides them.
    continuous: list[str] = Field(default_factory=lambda: ["price"])
    # When each column is known: request (the caller sends it), user or item (an attribute
    # of that entity), outcome (observed after the event: the label and aggregations over
    # earlier events read it, never a feature of its own example). A declared column listed
    # nowhere is a request column, a listed column the source does not declare is ignored.
    # The defaults are the demo's columns' roles; a source that lists roles or declares its
    # own columns (categorical, continuous) starts with value: outcome alone.
    roles: dict[str, ColumnRole] = Field(default_factory=_demo_roles)

    @model_validator(mode="before")
    @classmethod
    def _own_columns_own_roles(cls, data: Any) -> Any:
        """The default roles are those of the demo's columns: a source that declares its own
        context columns starts with none (every column a request column unless listed)."""
        if not isinstance(data, dict):
            return data
        own = {"categorical", "continuous"} & data.keys()
        roles = data.get("roles")
        if isinstance(roles, dict) or own:
            data = {**data, "roles": {**_value_role(), **(roles or {})}}
        return _renamed(data, ("categorical", "continuous"))

    @model_validator(mode="before")
    @classmethod
    def _delimiter_into_options(cls, data: Any) -> Any:
        """``csv_delimiter`` (the older key) is Spark's ``sep`` option."""
        if not isinstance(data, dict) or "csv_delimiter" not in data:
            return data
        data = dict(data)
        delimiter = data.pop("csv_delimiter")
        options = dict(data.get("options") or {})
        if options.setdefault("sep", delimiter) != delimiter:
            raise ValueError("csv_delimiter: give the separator once, as options.sep")
        return {**data, "options": options}

    @model_validator(mode="after")
    def _context_columns_distinct(self) -> SourceConfig:
        both = set(self.categorical) & set(self.continuous)
        if both:
            raise ValueError(f"columns declared both categorical and continuous: {sorted(both)}")
        clash = (set(self.categorical) | set(self.continuous)) & set(ROLES)
        if clash:
            raise ValueError(f"context columns may not reuse role names: {sorted(clash)}")
        return self

    def role(self, column: str) -> ColumnRole:
        """When ``column`` is known (``roles``; a request column unless listed)."""
        return self.roles.get(column, "request")

    def declared_roles(self) -> dict[str, ColumnRole]:
        """The role of the value column (where mapped) and of every declared context column."""
        value = ["value"] if self.columns.value else []
        return {column: self.role(column)
                for column in [*value, *self.categorical, *self.continuous]}


class ValidationConfig(Settings):
    """What an event must be to be accepted; a row that fails is quarantined with a reason."""

    # The accepted event types; any other is unknown_event_type.
    event_types: list[str] = Field(
        default_factory=lambda: ["view", "click", "add_to_cart", "purchase"], min_length=1
    )
    # Events before this time are timestamp_out_of_window; None: no lower bound (a run warns
    # when its events span an implausible time).
    ts_min: datetime | None = None
    # Events at or after this time are timestamp_out_of_window; None: no upper bound.
    ts_max: datetime | None = None
    # How numeric timestamps are read; "auto" takes values above 1e11 as milliseconds.
    ts_unit: Literal["auto", "s", "ms"] = "auto"
    # Events later than the run's start by more than this are out of the window (a clock gone
    # wrong); None: only ts_max bounds them.
    future_tolerance: Duration | None = "1d"

    @field_validator("ts_min", "ts_max")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return value if value is None or value.tzinfo else value.replace(tzinfo=timezone.utc)

    @model_validator(mode="after")
    def _window_ordered(self) -> ValidationConfig:
        if self.ts_min is not None and self.ts_max is not None and self.ts_min >= self.ts_max:
            raise ValueError("ts_min must be before ts_max")
        return self


class LabelRule(Settings):
    """How the binary label is derived from an event: ``value >= 4`` or ``event_type in (...)``."""

    # The event column the rule reads.
    column: str
    # The comparison.
    op: Literal[">=", ">", "<=", "<", "==", "!=", "in"]
    # What the column is compared with: a number, a text, or a list of them for "in".
    value: float | str | list[str | float]

    @classmethod
    def parse(cls, expression: str) -> LabelRule:
        """Parse the CLI / YAML form of a label rule."""
        try:
            rule = parse_rule(expression)
        except ValueError as exc:
            raise LabelRuleError("label", str(exc)) from None
        return cls(column=rule.column, op=rule.op, value=rule.value)

    def __str__(self) -> str:
        if isinstance(self.value, list):
            return f"{self.column} in ({', '.join(str(v) for v in self.value)})"
        return f"{self.column} {self.op} {self.value}"


class LabelJoin(Settings):
    """Examples that are impressions, labelled by what followed them: an event matching
    ``of`` is an example; its label is 1 when an event matching ``positive`` of the same user
    and item follows it within ``within`` (strictly after it, at most ``within`` later), and
    no other impression of that pair came between them: a positive labels the latest
    impression before it (docs/ARCHITECTURE.md, "Label joins")."""

    # Which events are examples (the impressions): a rule as text.
    of: LabelRule
    # Which later events label an impression 1: a rule as text.
    positive: LabelRule
    # How long after an impression a positive still labels it: 30m, 1h, 1d.
    within: Duration

    @field_validator("of", "positive", mode="before")
    @classmethod
    def _rule_from_text(cls, value: Any) -> Any:
        return _rule_from_text(value)

    @classmethod
    def parse(cls, expression: str) -> LabelJoin | None:
        """``<positive> within <duration> of <impression>`` (the CLI form), e.g.
        ``event_type in (click) within 30m of event_type in (view)``; None: not that form."""
        match = _JOIN.match(expression)
        if match is None:
            return None
        positive, within, of = match.groups()
        return cls(of=LabelRule.parse(of), positive=LabelRule.parse(positive), within=within)

    def __str__(self) -> str:
        return f"{self.positive} within {self.within} of {self.of}"


_JOIN = re.compile(r"^\s*(.+?)\s+within\s+(\S+)\s+of\s+(.+?)\s*$", re.IGNORECASE)


def _rule_from_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return LabelJoin.parse(value) or LabelRule.parse(value)
    except LabelRuleError as exc:
        raise ValueError(exc.message) from None


def label_rule(text: str) -> LabelRule | LabelJoin:
    """A label as the CLI and the YAML text form give it: a rule of each event, or a join
    (``<positive> within <duration> of <impression>``)."""
    return LabelJoin.parse(text) or LabelRule.parse(text)


if TYPE_CHECKING:  # the union is built from the ops' registry, which type checkers cannot read
    FeatureOpConfig = OpSettings
else:
    FeatureOpConfig = Annotated[Union[OP_SETTINGS], Field(discriminator="op")]  # noqa: UP007
OP_NAMES = frozenset(get_args(op.model_fields["op"].annotation)[0] for op in OP_SETTINGS)


class SplitConfig(Settings):
    """Which events are the validation split."""

    # Events of the last N calendar days (UTC) of the log form the validation split.
    valid_days: int = Field(default=1, ge=1)


class EmbeddingPlanConfig(Settings):
    """The embedding plan's widths: 1.6·n^0.56 for a vocabulary of n, clipped to these."""

    # The widest embedding any categorical feature gets.
    max_width: int = Field(default=128, ge=4)
    # The narrowest embedding any categorical feature gets.
    min_width: int = Field(default=4, ge=1)


class EntitiesConfig(Settings):
    """The entity snapshots Feast serves (entities/user, entities/item)."""

    # Rolling window of the "recent" entity aggregates, in days.
    recent_days: int = Field(default=7, ge=1)


class OutputConfig(Settings):
    """Where the job writes."""

    # The output folder; --output overrides it.
    path: str = DEFAULT_OUTPUT
    # Parquet files per day of examples/ (at most); fixed so that two runs give the same files.
    examples_files: int = Field(default=4, ge=1)


class VocabularyConfig(Settings):
    """Where a run's vocabularies start from (docs/ARCHITECTURE.md, "Categorical ids")."""

    # The ETL output whose vocabularies this run extends; None: the output path's current
    # publication, when there is one.
    previous: str | None = None
    # Start a new lineage: every id is assigned afresh, incompatible with earlier outputs.
    refit: bool = False

    @model_validator(mode="after")
    def _one_start(self) -> VocabularyConfig:
        if self.refit and self.previous:
            raise ValueError("give previous (--vocabulary-from) or refit "
                             "(--refit-vocabularies), not both")
        return self


# How long a daily (incremental) run keeps its output's fit where etl.fit.refit_every is unset:
# a day's run then transforms and writes only the day, and its ids never change once written.
INCREMENTAL_REFIT_EVERY = "7d"


class FitConfig(Settings):
    """Where the fitted statistics come from (docs/ARCHITECTURE.md, "Fits")."""

    # The ETL output whose fit this run transforms with: its encodings, normalisation and
    # standardisation as they are (none recomputed), its vocabularies extended with new ids;
    # None: fit on this run's training split (a new fit), or keep the replaced output's fit as
    # refit_every says.
    from_output: str | None = None
    # Keep the fit of the output a run replaces or extends until it is this old (e.g. 7d), in
    # the events' time: from the end of the fit's training split to the end of this run's.
    # None: an incremental run keeps it for INCREMENTAL_REFIT_EVERY, a full run fits anew.
    refit_every: Duration | None = None
    # Fit anew this run whatever refit_every says (--refit).
    refit: bool = False

    def kept_for(self, mode: Literal["full", "incremental"]) -> Duration | None:
        """How long a run of ``mode`` keeps the fit of the output it replaces or extends;
        None: it fits anew."""
        if self.refit_every is not None:
            return self.refit_every
        return INCREMENTAL_REFIT_EVERY if mode == "incremental" else None

    @model_validator(mode="after")
    def _one_source(self) -> FitConfig:
        if self.refit and self.from_output is not None:
            raise ValueError("give from_output (--fit-from) or refit (--refit), not both")
        return self


class IncrementalConfig(Settings):
    """How an incremental run treats events dated before the output's latest
    (docs/ARCHITECTURE.md, "Incremental runs")."""

    # Accept them (their days are computed again with them) instead of quarantining them as
    # late_event.
    allow_late: bool = False


class TFRecordConfig(Settings):
    """The TFRecords written beside the examples: tfrecord/<split>/."""

    # false: no TFRecords.
    enabled: bool = True
    # Rows per tf.train.Example; 1 writes plain per-example records.
    prebatch_size: int = Field(default=4096, ge=1)
    # One feature per type (categorical ids, continuous values, lists, label) instead of one
    # per column.
    group_types: bool = True
    # 1-3 character feature names (the map is in metadata.json).
    short_names: bool = True
    # The files' compression.
    compression: Literal["none", "gzip"] = "none"


class SparkSettings(Settings):
    """The Spark session the job runs in."""

    # The properties file spark_conf/<profile>.conf; --profile overrides it.
    profile: Literal["cpu", "gpu", "k8s-cpu", "k8s-gpu"] = "cpu"
    # Spark's master URL; null: the profile's (local[*] for cpu and gpu).
    master: str | None = None
    # The application's name in Spark's UI and event logs.
    app_name: str = "featureline-etl"
    # Path (or Maven coordinates) of the RAPIDS Accelerator jar; RAPIDS_JAR overrides it.
    rapids_jar: str | None = None
    # Spark properties set over the profile's.
    properties: dict[str, str] = Field(default_factory=dict)


def _default_features() -> list[Any]:
    return [
        CategorifySettings(op="categorify",
                           columns=["user_id", "item_id", CATEGORICAL_SELECTOR]),
        CountEncodeSettings(op="count_encode", columns=["user_id", "item_id"]),
        TargetEncodeSettings(op="target_encode", columns=["item_id"]),
        LagFeaturesSettings(op="lag_features"),
        CyclicTimeSettings(op="cyclic_time"),
        HashedCrossSettings(op="hashed_cross", crosses=[[CATEGORICAL_SELECTOR]],
                            buckets=10_000),
        NormalizeSettings(op="normalize", columns=[CONTINUOUS_SELECTOR]),
        HistorySettings(op="history"),
    ]


class EtlConfig(Settings):
    """The ETL job: `featureline etl run`."""

    source: SourceConfig = SourceConfig()
    validation: ValidationConfig = ValidationConfig()
    # The binary label: a rule of each event as text ("value >= 4", "event_type in (click,
    # purchase)") or as column, op and value; or a join of later events onto impressions
    # (of, positive, within: ``LabelJoin``); --label overrides it.
    label: LabelRule | LabelJoin = LabelJoin(
        of=LabelRule(column="event_type", op="in", value=["view"]),
        positive=LabelRule(column="event_type", op="in", value=["click", "purchase"]),
        within="30m")
    split: SplitConfig = SplitConfig()
    # The feature ops, run in this order (their keys below); @categorical and @continuous
    # stand for the declared context columns.
    features: list[FeatureOpConfig] = Field(default_factory=_default_features)
    model_ready: ModelReadyConfig = ModelReadyConfig()
    embeddings: EmbeddingPlanConfig = EmbeddingPlanConfig()
    entities: EntitiesConfig = EntitiesConfig()
    output: OutputConfig = OutputConfig()
    vocabulary: VocabularyConfig = VocabularyConfig()
    fit: FitConfig = FitConfig()
    tfrecord: TFRecordConfig = TFRecordConfig()
    spark: SparkSettings = SparkSettings()
    # full: every raw file of etl.source.path; incremental: only the new ones, extending the
    # output's state.
    mode: Literal["full", "incremental"] = "full"
    incremental: IncrementalConfig = IncrementalConfig()
    # Tables of user or item attributes beside the log, joined onto each event by its key
    # (AttributeFile); their columns are context columns of the events, with the key's role.
    attributes: list[AttributeFile] = Field(default_factory=list)
    # featureline.yaml's top-level ``aggregations:`` (the stream and the API read it too),
    # copied here by the launcher: the examples hold its values.
    aggregations: list[GroupSpec] = Field(default_factory=list)
    # featureline.yaml's top-level ``derive:`` (copied here by the launcher): features named
    # by an expression over other features (core.derive), after the aggregations.
    derive: list[DeriveSpec] = Field(default_factory=list)
    # featureline.yaml's top-level ``checks:`` (featureline validate reads it too), copied
    # here by the launcher: the run profiles its newest day and checks it.
    checks: ChecksConfig = ChecksConfig()

    @field_validator("label", mode="before")
    @classmethod
    def _label_from_text(cls, value: Any) -> Any:
        return _rule_from_text(value)

    @property
    def positive(self) -> LabelRule:
        """The rule of each event: which events are positives (the label of each event, or
        the positives a join labels impressions with): what the features' label history and
        the aggregations' label read."""
        return self.label.positive if isinstance(self.label, LabelJoin) else self.label

    @property
    def label_join(self) -> LabelJoin | None:
        return self.label if isinstance(self.label, LabelJoin) else None

    @model_validator(mode="before")
    @classmethod
    def _attributes_are_context_columns(cls, data: Any) -> Any:
        """Each attribute file's columns join the source's context columns (by their safe
        names), known as attributes of the key's entity unless the roles say otherwise."""
        if not isinstance(data, dict) or not data.get("attributes"):
            return data
        source = data.get("source") or {}
        if not isinstance(source, dict) or not isinstance(data["attributes"], list):
            return data
        source = dict(source)
        roles = dict(source.get("roles") or {})
        defaults = SourceConfig.model_fields
        for entry in data["attributes"]:
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), dict):
                continue
            role = "user" if "user_id" in entry["key"] else "item"
            entry = _lists_categorical(entry)
            for kind in ("categorical", "continuous"):
                declared = list(source.get(kind, defaults[kind].get_default(
                    call_default_factory=True)))
                for column in entry.get(kind) or []:
                    name = safe_name(column) if isinstance(column, str) and column else column
                    if name not in declared:
                        declared.append(name)
                    roles.setdefault(name, role)
                source[kind] = declared
        return {**data, "source": {**source, "roles": roles}}

    @model_validator(mode="after")
    def _attribute_columns_once(self) -> EtlConfig:
        seen: dict[str, str] = {}
        names: set[str] = set()
        for index, table in enumerate(self.attributes):
            if table.name in names:
                raise ValueError(f"attributes[{index}].name: {table.name!r} names two files")
            names.add(table.name)
            for column in table.columns:
                if column in seen:
                    raise ValueError(f"attributes[{index}]: {table.name} and {seen[column]} "
                                     f"both hold {column!r}")
                seen[column] = table.name
        return self

    def attribute_columns(self) -> list[str]:
        """The context columns the attribute files hold (not the log)."""
        return [column for table in self.attributes for column in table.columns]

    def list_columns(self) -> dict[str, str]:
        """The multi-valued columns, each with its separator."""
        return {column: sep for table in self.attributes for column, sep in table.lists.items()}

    @model_validator(mode="before")
    @classmethod
    def _one_type_without_event_types(cls, data: Any) -> Any:
        """A log without an event type column has events of one type, UNTYPED_EVENT: the
        accepted types default to it."""
        if not isinstance(data, dict):
            return data
        source = data.get("source")
        columns = source.get("columns") if isinstance(source, dict) else None
        validation = data.get("validation") or {}
        if not (isinstance(columns, dict) and "event_type" in columns
                and columns["event_type"] is None and isinstance(validation, dict)
                and "event_types" not in validation):
            return data
        return {**data, "validation": {**validation, "event_types": [UNTYPED_EVENT]}}

    @model_validator(mode="after")
    def _event_types_of_a_log_without_them(self) -> EtlConfig:
        if self.source.columns.event_type is not None:
            return self
        if UNTYPED_EVENT not in self.validation.event_types:
            raise ValueError(f"validation.event_types: the log has no event type column "
                             f"(etl.source.columns.event_type: null), so every event's type "
                             f"is {UNTYPED_EVENT!r}: list it, or leave event_types out")
        join = self.label_join
        rules = [("label", self.positive)] if join is None else [
            ("label.of", join.of), ("label.positive", join.positive)]
        for key, rule in rules:
            if rule.column == "event_type" and (rule.op != "in" or rule.value != [UNTYPED_EVENT]):
                raise ValueError(f"{key}: the log has no event type column "
                                 f"(etl.source.columns.event_type: null); label by another "
                                 f"column, e.g. value >= 4")
        return self

    @model_validator(mode="after")
    def _features_refer_to_known_columns(self) -> EtlConfig:
        check_features(self)
        check_aggregations(self)
        check_derive(self)
        return self

    @model_validator(mode="after")
    def _one_fit(self) -> EtlConfig:
        frozen = self.fit.from_output
        if frozen is None:
            return self
        if self.mode == "incremental":
            raise ValueError("fit.from_output: an incremental run transforms with its "
                             "output's own fit (kept as fit.refit_every says) or fits anew; "
                             "transform with another output's fit in a full run")
        if self.vocabulary.refit:
            raise ValueError("fit.from_output: a fit's vocabularies are extended, not "
                             "refitted: drop --refit-vocabularies")
        previous = self.vocabulary.previous
        if previous is not None and Path(previous).resolve() != Path(frozen).resolve():
            raise ValueError("fit.from_output: the vocabularies come with the fit: drop "
                             "--vocabulary-from or name the same output")
        return self

    def column_roles(self) -> ColumnRoles:
        """The columns feature ops may read, by kind, for selectors and checks."""
        return ColumnRoles(
            categorical=tuple(categorical_columns(self)),
            continuous=tuple(continuous_columns(self)),
            categorical_context=tuple(self.source.categorical),
            continuous_context=tuple(continuous_columns(self)),
            label_column=self.positive.column,
            outcomes=tuple(c for c, role in self.source.declared_roles().items()
                           if role == "outcome"),
            lists=tuple(self.list_columns().items()))

    def event_contract(self) -> EventContract:
        """How this run reads raw events, as metadata.json records it (``events``)."""
        validation = self.validation
        tolerance = validation.future_tolerance
        return EventContract(
            event_types=validation.event_types, ts_min=validation.ts_min,
            ts_max=validation.ts_max, ts_unit=validation.ts_unit,
            future_tolerance_s=duration_seconds(tolerance) if tolerance else None,
            value=self.source.columns.value is not None,
            typed_events=self.source.columns.event_type is not None,
            continuous=self.source.continuous, categorical=self.source.categorical,
            roles=self.source.declared_roles(),
            label=LabelSpec(column=self.positive.column, op=self.positive.op,
                            value=self.positive.value),
            recent_days=self.entities.recent_days)

    def hash(self, exclude_source_path: bool = False) -> str:
        """A stable digest of the settings that decide the output values, for metadata.json.

        Where the output goes and how Spark runs (``output``, ``spark``) do not change values,
        so they are left out: the same input and features give the same hash anywhere. Where
        the vocabularies and the fitted statistics come from is recorded by their versions
        instead (``vocabularies``, ``fit``); whether the run
        is full or incremental, and what the validation gate checks, do not change the values
        either.
        """
        settings = self.model_dump(mode="json", exclude={"output", "spark", "vocabulary",
                                                         "fit", "mode", "incremental",
                                                         "checks"})
        if exclude_source_path:
            settings["source"].pop("path")
        canonical = json.dumps(settings, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()


def output_fingerprints(config: EtlConfig) -> dict[str, str]:
    """Per aggregation output (``group:output``) and derived feature, a digest of its
    definition: the group's keys, the operation and its version, the column, filter, the
    operation's parameters, window and hop; a derived feature's expression and the digests
    of the outputs it reads."""
    found: dict[str, str] = {}
    for group in config.aggregations:
        for feature in group.outputs():
            found[feature.qualified] = _digest({
                "keys": group.keys, "version": feature.operation().version,
                "spec": {**feature.spec.model_dump(mode="json", exclude={
                    "windows", "name", "params"}), **feature.spec.parameters()},
                "window": feature.window.text, "hop": feature.window.hop})
    for spec in config.derive:
        found[spec.name] = _digest({"expr": spec.expr, "reads": {
            name: found.get(name) for name in sorted(references(spec.tree))}})
    return found


def other_settings_hash(config: EtlConfig) -> str:
    """:meth:`EtlConfig.hash` of everything but the aggregations and the derived features,
    less where the raw files are."""
    return config.model_copy(update={"aggregations": [], "derive": []}).hash(
        exclude_source_path=True)


def changed_outputs(before: dict[str, str], now: dict[str, str]) -> str:
    """What differs between two :func:`output_fingerprints`: ``added a, b; changed c;
    removed d`` (empty where nothing does)."""
    parts = [(verb, sorted(names)) for verb, names in (
        ("added", now.keys() - before.keys()),
        ("changed", {name for name in now.keys() & before.keys() if now[name] != before[name]}),
        ("removed", before.keys() - now.keys())) if names]
    return "; ".join(f"{verb} {', '.join(names)}" for verb, names in parts)


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def categorical_columns(config: EtlConfig) -> list[str]:
    """Columns that hold categories: the id roles, the event type and categorical context."""
    return ["user_id", "item_id", "event_type", *config.source.categorical]


def continuous_columns(config: EtlConfig) -> list[str]:
    """Columns that hold numbers: the value role (when mapped) and continuous context."""
    value = ["value"] if config.source.columns.value else []
    return [*value, *config.source.continuous]


def check_features(config: EtlConfig) -> None:
    """Every feature input exists, has the right kind and is not the label's own column; an
    op that reads encoded ids comes after the categorify that assigns them."""
    roles = config.column_roles()
    known = set(roles.categorical) | set(roles.continuous) | {"ts"}
    join = config.label_join
    for column in (roles.label_column, *([join.of.column] if join else [])):
        if column not in known:
            raise ValueError(f"label: unknown column {column!r} (known: {sorted(known)})")
    wanted = {"categorical": set(roles.categorical), "continuous": set(roles.continuous)}
    encoded: set[str] = set()
    for index, op in enumerate(config.features):
        key = f"features[{index}]"
        for short in op.short_names.values():
            if not SHORT_NAME_PATTERN.match(short):
                raise ValueError(
                    f"{key}.short_names: {short!r} must be 1-3 characters [A-Za-z0-9_]")
        for column in op.inputs(roles):
            if column not in known:
                raise ValueError(
                    f"{key}.columns: unknown column {column!r} (known: {sorted(known)})")
            if column not in wanted[op.input_kind]:
                raise ValueError(f"{key}.columns: {column!r} is not a valid input of {op.op}")
            if column == roles.label_column:
                raise ValueError(
                    f"{key}.columns: {column!r} is the label's column; "
                    "using it would leak the label"
                )
            if column in roles.outcomes:
                raise ValueError(
                    f"{key}.columns: {column!r} is an outcome (etl.source.roles), known only "
                    "after the event: its own example would read it; aggregations over "
                    "earlier events may")
        for column in op.needs_encoded:
            if column not in encoded:
                raise ValueError(f"{key}: {op.op} needs a categorify of {column} before it")
        encoded.update(op.encodes(roles))


def encoded_columns(config: EtlConfig) -> list[str]:
    """The columns whose ids the configured ops assign (categorify's)."""
    roles = config.column_roles()
    return list(dict.fromkeys(column for op in config.features for column in op.encodes(roles)))


def check_aggregations(config: EtlConfig) -> None:
    """The spec reads columns the events have; a ``last`` or ``last_k`` of a text column in
    the examples needs its ids (a categorify of it). Raises :class:`ConfigError` naming the
    key as featureline.yaml holds it (``aggregations[0].features[2].column``)."""
    contract = config.event_contract()
    try:
        check_groups(config.aggregations, contract)
    except ValueError as exc:
        key, _, message = str(exc).partition(": ")
        raise ConfigError(f"aggregations{key}", message) from None
    numeric = {*contract.numeric, LABEL_COLUMN}
    encoded = set(encoded_columns(config))
    for g, group in enumerate(config.aggregations):
        for f, feature in enumerate(group.features):
            column = feature.column
            operation = operation_of(feature.op, feature.params)
            if operation.ordered and operation.list_length() is not None and column in numeric:
                raise ConfigError(f"aggregations[{g}].features[{f}].column",
                                  f"{feature.op} keeps ids of a text column; a number's "
                                  "latest values are not an example feature")
            # An operation that gives the value it read gives a text column's ids.
            if operation.ordered and column not in numeric and column not in encoded:
                raise ConfigError(f"aggregations[{g}].features[{f}].column",
                                  f"{feature.op} of {column!r} gives ids: add {column} to a "
                                  f"categorify op's columns in etl.features")


def derive_inputs(config: EtlConfig) -> dict[str, str]:
    """What a derived feature may read, each name with the example column holding it: every
    continuous feature of the configured ops, every number an aggregation gives
    (``group:output``), the numeric event columns other than the label's and the outcomes."""
    roles = config.column_roles()
    readable = {spec.name: spec.name for op in config.features for spec in op.build(roles)
                .features() if spec.kind == "continuous"}
    readable.update((column, column) for column in roles.continuous
                    if column != roles.label_column and column not in roles.outcomes)
    numeric = {*config.event_contract().numeric, LABEL_COLUMN}
    for group in config.aggregations:
        for feature in group.outputs():
            if feature.operation().list_length() is None and not (
                    feature.operation().ordered and feature.spec.column not in numeric):
                readable[feature.qualified] = feature.column_name
    return readable


def check_derive(config: EtlConfig) -> None:
    """Each derived feature has a name no other feature has and reads what it may
    (:func:`derive_inputs`, or a derived feature listed before it). Raises
    :class:`ConfigError` naming the entry (``derive[1].expr``)."""
    if not config.derive:
        return
    readable = derive_inputs(config)
    roles = config.column_roles()
    taken = {*readable, *roles.categorical,
             *(spec.name for op in config.features for spec in op.build(roles).features()),
             *(feature.column_name for group in config.aggregations
               for feature in group.outputs())}
    for index, spec in enumerate(config.derive):
        if spec.name in taken:
            raise ConfigError(f"derive[{index}].name", f"{spec.name!r} is already a feature's "
                              "or a column's name")
        for name in sorted(references(spec.tree)):
            if name == roles.label_column or name in roles.outcomes:
                raise ConfigError(f"derive[{index}].expr", f"{name!r} is known only after "
                                  "the event (the label's column or an outcome): reading it "
                                  "would leak the label")
            if name not in readable:
                raise ConfigError(f"derive[{index}].expr", f"{name!r} is not a number it can "
                                  f"read: {_close_names(name, readable)}")
        readable[spec.name] = spec.name
        taken.add(spec.name)


def _close_names(name: str, readable: dict[str, str]) -> str:
    """The names a derived feature may read, those closest to ``name`` first."""
    close = difflib.get_close_matches(name, list(readable), n=3, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(close)}?"
    return f"a continuous feature, a numeric column or group:output (known: {sorted(readable)})"


def with_overrides(config: EtlConfig, **flags: Any) -> EtlConfig:
    """Apply command-line flags (:func:`flags_applied`'s) on top of a validated
    configuration, re-validating the result."""
    data = flags_applied(config.model_dump(mode="json"), **flags)
    return validate(EtlConfig, data, origin="command-line flags", prefix=("etl",), tags=OP_NAMES)


def flags_applied(
    data: dict[str, Any],
    *,
    input_path: str | None = None,
    input_format: str | None = None,
    output: str | None = None,
    profile: str | None = None,
    label: str | None = None,
    categorical: list[str] | None = None,
    continuous: list[str] | None = None,
    vocabulary_from: str | None = None,
    refit_vocabularies: bool = False,
    fit_from: str | None = None,
    refit: bool = False,
    valid_days: int | None = None,
    incremental: bool = False,
) -> dict[str, Any]:
    """The ``etl`` section's data (as the file holds it, or a dump) with the command-line
    flags applied, before anything checks it: a check reads the columns the flags declare."""
    data = dict(data)

    def put(section: str, key: str, value: Any) -> None:
        data[section] = {**(data.get(section) or {}), key: value}

    if input_path is not None:
        put("source", "path", input_path)
    source_format = input_format or (input_path and _format_from_suffix(input_path))
    if source_format:
        put("source", "format", source_format)
    if output is not None:
        put("output", "path", output)
    if profile is not None:
        put("spark", "profile", profile)
    if label is not None:
        try:
            data["label"] = label_rule(label).model_dump(mode="json")
        except LabelRuleError as exc:
            raise LabelRuleError("--label", exc.message) from None
    if categorical is not None:
        put("source", "categorical", categorical)
    if continuous is not None:
        put("source", "continuous", continuous)
    if vocabulary_from is not None:
        put("vocabulary", "previous", vocabulary_from)
    if refit_vocabularies:
        put("vocabulary", "refit", True)
    if fit_from is not None:
        put("fit", "from_output", fit_from)
    if refit:
        put("fit", "refit", True)
    if valid_days is not None:
        put("split", "valid_days", valid_days)
    if incremental:
        if input_path is None:
            raise ConfigError("--input", "an incremental run reads only the new raw files: "
                              "name them with --input")
        data["mode"] = "incremental"
    return data


def _format_from_suffix(path: str) -> str | None:
    name = path.rstrip("/").lower()
    for suffix, fmt in ((".jsonl", "jsonl"), (".json", "jsonl"), (".csv", "csv"),
                        (".parquet", "parquet")):
        if name.endswith(suffix) or name.endswith(suffix + "*"):
            return fmt
    return None
