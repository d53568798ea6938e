"""The job configuration: ``featureline.yaml``, validated by pydantic before Spark starts.

Feature ops name their input columns by role (``user_id``, ``item_id``, ``event_type``,
``ts``, ``value``) or by context column; the selectors ``@categorical`` and ``@continuous``
stand for every declared context column of that kind, so the ``--categorical`` and
``--continuous`` flags retarget the default pipeline at another log without editing YAML.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from api.settings import ApiConfig
from etl.errors import ConfigError, LabelRuleError

# The configuration file for processes that take no --config: Feast's CLI, API workers.
CONFIG_ENV = "FEATURELINE_CONFIG"
ROLES = ("user_id", "item_id", "event_type", "ts", "value")
REQUIRED_ROLES = ("user_id", "item_id", "event_type", "ts")
CATEGORICAL_SELECTOR = "@categorical"
CONTINUOUS_SELECTOR = "@continuous"
SHORT_NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,2}$")
_INNER_KEY = re.compile(r"^([A-Za-z_][\w\[\].]*): (.*)$", re.DOTALL)
_DURATION = re.compile(r"^(\d+)([smhd])$")
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def duration_seconds(text: str) -> int:
    """``"90s"``, ``"15m"``, ``"24h"``, ``"7d"`` → seconds."""
    match = _DURATION.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration like 30m, 1h, 24h or 7d")
    return int(match.group(1)) * _DURATION_SECONDS[match.group(2)]


class RoleColumns(_Model):
    """The source's own column names for each role of the canonical raw-log schema."""

    user_id: str = "user_id"
    item_id: str = "item_id"
    event_type: str = "event_type"
    ts: str = "ts"
    value: str | None = "value"


class SourceConfig(_Model):
    path: str = "data/raw/events.jsonl"
    format: Literal["jsonl", "csv", "parquet"] = "jsonl"
    columns: RoleColumns = RoleColumns()
    # Context columns; the defaults are those of `featureline datagen`.
    categorical: list[str] = Field(default_factory=lambda: ["category", "device"])
    continuous: list[str] = Field(default_factory=lambda: ["price"])
    csv_delimiter: str = ","

    @model_validator(mode="after")
    def _context_columns_distinct(self) -> SourceConfig:
        both = set(self.categorical) & set(self.continuous)
        if both:
            raise ValueError(f"columns declared both categorical and continuous: {sorted(both)}")
        clash = (set(self.categorical) | set(self.continuous)) & set(ROLES)
        if clash:
            raise ValueError(f"context columns may not reuse role names: {sorted(clash)}")
        return self


class ValidationConfig(_Model):
    event_types: list[str] = Field(
        default_factory=lambda: ["view", "click", "add_to_cart", "purchase"], min_length=1
    )
    ts_min: datetime = datetime(2000, 1, 1, tzinfo=timezone.utc)
    ts_max: datetime = datetime(2100, 1, 1, tzinfo=timezone.utc)
    # How numeric timestamps are read; "auto" takes values above 1e11 as milliseconds.
    ts_unit: Literal["auto", "s", "ms"] = "auto"

    @field_validator("ts_min", "ts_max")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)

    @model_validator(mode="after")
    def _window_ordered(self) -> ValidationConfig:
        if self.ts_min >= self.ts_max:
            raise ValueError("ts_min must be before ts_max")
        return self


_COMPARISON = re.compile(r"^\s*(\w+)\s*(>=|<=|==|!=|>|<)\s*([^<>=!\s].*?)\s*$")
_MEMBERSHIP = re.compile(r"^\s*(\w+)\s+in\s*[(\[](.*)[)\]]\s*$", re.IGNORECASE)


def _literal(text: str) -> str | float:
    text = text.strip().strip("'\"")
    try:
        return float(text)
    except ValueError:
        return text


class LabelRule(_Model):
    """How the binary label is derived from an event: ``value >= 4`` or ``event_type in (...)``."""

    column: str
    op: Literal[">=", ">", "<=", "<", "==", "!=", "in"]
    value: float | str | list[str | float]

    @classmethod
    def parse(cls, expression: str) -> LabelRule:
        """Parse the CLI / YAML form of a label rule."""
        membership = _MEMBERSHIP.match(expression)
        if membership:
            items = [_literal(part) for part in membership.group(2).split(",") if part.strip()]
            if not items:
                raise LabelRuleError("label", f"{expression!r}: 'in' needs at least one value")
            return cls(column=membership.group(1), op="in", value=items)
        comparison = _COMPARISON.match(expression)
        if comparison:
            return cls(
                column=comparison.group(1),
                op=comparison.group(2),  # type: ignore[arg-type]
                value=_literal(comparison.group(3)),
            )
        raise LabelRuleError(
            "label",
            f"cannot parse {expression!r}; expected e.g. 'value >= 4' "
            "or 'event_type in (click, purchase)'",
        )

    def __str__(self) -> str:
        if isinstance(self.value, list):
            return f"{self.column} in ({', '.join(str(v) for v in self.value)})"
        return f"{self.column} {self.op} {self.value}"


class _FeatureOp(_Model):
    short_names: dict[str, str] = Field(default_factory=dict)


class CategorifyOp(_FeatureOp):
    op: Literal["categorify"]
    columns: list[str] = Field(min_length=1)
    # Values seen fewer times than this in the training split map to the OOV id 1.
    freq_threshold: int = Field(default=1, ge=1)


class CountEncodeOp(_FeatureOp):
    op: Literal["count_encode"]
    columns: list[str] = Field(min_length=1)


class TargetEncodeOp(_FeatureOp):
    op: Literal["target_encode"]
    columns: list[str] = Field(min_length=1)
    folds: int = Field(default=5, ge=2)
    smoothing: float = Field(default=20.0, ge=0)


class LagFeaturesOp(_FeatureOp):
    op: Literal["lag_features"]
    windows: list[str] = Field(default_factory=lambda: ["1h", "24h", "7d"], min_length=1)

    @field_validator("windows")
    @classmethod
    def _durations(cls, windows: list[str]) -> list[str]:
        for window in windows:
            duration_seconds(window)
        return windows


class CyclicTimeOp(_FeatureOp):
    op: Literal["cyclic_time"]


class HashedCrossOp(_FeatureOp):
    op: Literal["hashed_cross"]
    crosses: list[list[str]] = Field(min_length=1)
    buckets: int = Field(default=100_000, ge=2)


class NormalizeOp(_FeatureOp):
    op: Literal["normalize"]
    columns: list[str] = Field(min_length=1)
    fill: Literal["mean", "median", "zero"] = "mean"
    log1p: bool = True


class HistoryOp(_FeatureOp):
    op: Literal["history"]
    k: int = Field(default=10, ge=1, le=1000)


FeatureOpConfig = Annotated[
    CategorifyOp
    | CountEncodeOp
    | TargetEncodeOp
    | LagFeaturesOp
    | CyclicTimeOp
    | HashedCrossOp
    | NormalizeOp
    | HistoryOp,
    Field(discriminator="op"),
]


class SplitConfig(_Model):
    # Events of the last N calendar days (UTC) of the log form the validation split.
    valid_days: int = Field(default=1, ge=1)


class EmbeddingPlanConfig(_Model):
    max_width: int = Field(default=128, ge=4)
    min_width: int = Field(default=4, ge=1)


class EntitiesConfig(_Model):
    # Rolling window of the "recent" entity aggregates, in days.
    recent_days: int = Field(default=7, ge=1)


class OutputConfig(_Model):
    path: str = "data/output"
    # Parquet files per split of examples/; fixed so that two runs give the same files.
    examples_files: int = Field(default=4, ge=1)


class TFRecordConfig(_Model):
    enabled: bool = True
    # Rows per tf.train.Example; 1 writes plain per-example records.
    prebatch_size: int = Field(default=4096, ge=1)
    group_types: bool = True
    short_names: bool = True
    compression: Literal["none", "gzip"] = "none"


class SparkSettings(_Model):
    profile: Literal["cpu", "gpu", "k8s-cpu", "k8s-gpu"] = "cpu"
    master: str | None = None
    app_name: str = "featureline-etl"
    # Path (or Maven coordinates) of the RAPIDS Accelerator jar; RAPIDS_JAR overrides it.
    rapids_jar: str | None = None
    properties: dict[str, str] = Field(default_factory=dict)


def _default_features() -> list[Any]:
    return [
        CategorifyOp(op="categorify", columns=["user_id", "item_id", CATEGORICAL_SELECTOR]),
        CountEncodeOp(op="count_encode", columns=["user_id", "item_id"]),
        TargetEncodeOp(op="target_encode", columns=["item_id"]),
        LagFeaturesOp(op="lag_features"),
        CyclicTimeOp(op="cyclic_time"),
        HashedCrossOp(op="hashed_cross", crosses=[[CATEGORICAL_SELECTOR]], buckets=10_000),
        NormalizeOp(op="normalize", columns=[CONTINUOUS_SELECTOR]),
        HistoryOp(op="history"),
    ]


class EtlConfig(_Model):
    source: SourceConfig = SourceConfig()
    validation: ValidationConfig = ValidationConfig()
    label: LabelRule = LabelRule(column="event_type", op="in", value=["click", "purchase"])
    split: SplitConfig = SplitConfig()
    features: list[FeatureOpConfig] = Field(default_factory=_default_features)
    embeddings: EmbeddingPlanConfig = EmbeddingPlanConfig()
    entities: EntitiesConfig = EntitiesConfig()
    output: OutputConfig = OutputConfig()
    tfrecord: TFRecordConfig = TFRecordConfig()
    spark: SparkSettings = SparkSettings()

    @field_validator("label", mode="before")
    @classmethod
    def _label_from_text(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return LabelRule.parse(value)
        except LabelRuleError as exc:
            raise ValueError(exc.message) from None

    @model_validator(mode="after")
    def _features_refer_to_known_columns(self) -> EtlConfig:
        check_features(self)
        return self

    def hash(self) -> str:
        """A stable digest of the settings that decide the output values, for metadata.json.

        Where the output goes and how Spark runs (``output``, ``spark``) do not change values,
        so they are left out: the same input and features give the same hash anywhere.
        """
        settings = self.model_dump(mode="json", exclude={"output", "spark"})
        canonical = json.dumps(settings, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()


class FeatureStoreConfig(_Model):
    """How Feast publishes the ETL's entity tables (``feature_store/``)."""

    # The Feast repository: feature_store.yaml and the definitions derived from metadata.json.
    repo: str = "feature_store"
    # How long an entity's latest snapshot stands in point-in-time joins.
    ttl: str = "30d"
    # redis | redis_cluster; REDIS_URL names the server (a cluster: any one of its nodes).
    redis_type: Literal["redis", "redis_cluster"] = "redis"
    # With REDIS_URL unset, a private redis-server keeps its data here.
    redis_dir: str = "data/redis"
    # duckdb (embedded, in-process) | spark (Feast's Spark offline store, for scale).
    offline_store: Literal["duckdb", "spark"] = "duckdb"

    @field_validator("ttl")
    @classmethod
    def _ttl_is_a_duration(cls, value: str) -> str:
        duration_seconds(value)
        return value


class FeaturelineConfig(_Model):
    """The whole ``featureline.yaml``: one section per stage."""

    etl: EtlConfig = Field(default_factory=lambda: EtlConfig())
    feature_store: FeatureStoreConfig = FeatureStoreConfig()
    api: ApiConfig = ApiConfig()


def categorical_columns(config: EtlConfig) -> list[str]:
    """Columns that hold categories: the id roles, the event type and categorical context."""
    return ["user_id", "item_id", "event_type", *config.source.categorical]


def continuous_columns(config: EtlConfig) -> list[str]:
    """Columns that hold numbers: the value role (when mapped) and continuous context."""
    value = ["value"] if config.source.columns.value else []
    return [*value, *config.source.continuous]


def expand_columns(config: EtlConfig, columns: list[str]) -> list[str]:
    """Replace the ``@categorical`` / ``@continuous`` selectors by the declared columns.

    A selector never expands to the label's own column: that would leak the label.
    """
    selected = {
        CATEGORICAL_SELECTOR: config.source.categorical,
        CONTINUOUS_SELECTOR: continuous_columns(config),
    }
    expanded: list[str] = []
    for column in columns:
        if column in selected:
            expanded.extend(c for c in selected[column] if c != config.label.column)
        else:
            expanded.append(column)
    return list(dict.fromkeys(expanded))


def check_features(config: EtlConfig) -> None:
    """Every feature input exists, has the right kind and is not the label's own column."""
    categorical = set(categorical_columns(config))
    continuous = set(continuous_columns(config))
    known = categorical | continuous | {"ts"}
    label_column = config.label.column
    if label_column not in known:
        raise ValueError(f"label: unknown column {label_column!r} (known: {sorted(known)})")
    categorified: set[str] = set()
    for index, op in enumerate(config.features):
        key = f"features[{index}]"
        for short in op.short_names.values():
            if not SHORT_NAME_PATTERN.match(short):
                raise ValueError(
                    f"{key}.short_names: {short!r} must be 1-3 characters [A-Za-z0-9_]")
        wanted_kind = {"normalize": continuous}.get(op.op, categorical)
        inputs = _op_inputs(config, op)
        for column in inputs:
            if column not in known:
                raise ValueError(
                    f"{key}.columns: unknown column {column!r} (known: {sorted(known)})")
            if column not in wanted_kind:
                raise ValueError(f"{key}.columns: {column!r} is not a valid input of {op.op}")
            if column == label_column:
                raise ValueError(
                    f"{key}.columns: {column!r} is the label's column; "
                    "using it would leak the label"
                )
        if isinstance(op, CategorifyOp):
            categorified.update(inputs)
        if isinstance(op, LagFeaturesOp | HistoryOp) and "item_id" not in categorified:
            raise ValueError(f"{key}: {op.op} needs a categorify of item_id before it")


def _op_inputs(config: EtlConfig, op: Any) -> list[str]:
    if isinstance(op, HashedCrossOp):
        return [column for cross in op.crosses for column in expand_columns(config, cross)]
    return expand_columns(config, getattr(op, "columns", []))


_OP_NAMES = {
    get_args(op.model_fields["op"].annotation)[0]
    for op in get_args(get_args(FeatureOpConfig)[0])
}


def _location(error: dict[str, Any]) -> str:
    parts: list[str] = []
    for part in error["loc"]:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif part in _OP_NAMES:
            continue  # pydantic's tag of the discriminated union, not a key in the file
        else:
            parts.append(f".{part}" if parts else str(part))
    return "".join(parts) or "(root)"


def parse_config(data: dict[str, Any], *, origin: str = "featureline.yaml") -> FeaturelineConfig:
    """Validate a mapping; a problem raises :class:`ConfigError` naming the key."""
    try:
        return FeaturelineConfig.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = _location(error)
        message = error["msg"].removeprefix("Value error, ")
        # Cross-field checks name their key at the start of the message ("features[2].columns: …").
        inner = _INNER_KEY.match(message)
        if inner:
            key, message = f"{key}.{inner.group(1)}", inner.group(2)
        raise ConfigError(key, f"{message} (in {origin})") from None


def load_config(path: str | Path | None = None) -> FeaturelineConfig:
    """Read ``featureline.yaml`` (or the embedded defaults when ``path`` is None)."""
    if path is None:
        return FeaturelineConfig()
    path = Path(path)
    if not path.is_file():
        raise ConfigError("--config", f"no such file: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("(root)", f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("(root)", f"{path} must hold a mapping of sections")
    return parse_config(data, origin=str(path))


def with_overrides(
    config: EtlConfig,
    *,
    input_path: str | None = None,
    input_format: str | None = None,
    output: str | None = None,
    profile: str | None = None,
    label: str | None = None,
    categorical: list[str] | None = None,
    continuous: list[str] | None = None,
) -> EtlConfig:
    """Apply command-line flags on top of the file, re-validating the result."""
    data = config.model_dump(mode="json")
    if input_path is not None:
        data["source"]["path"] = input_path
        data["source"]["format"] = input_format or _format_from_suffix(input_path) or data[
            "source"]["format"]
    elif input_format is not None:
        data["source"]["format"] = input_format
    if output is not None:
        data["output"]["path"] = output
    if profile is not None:
        data["spark"]["profile"] = profile
    if label is not None:
        try:
            data["label"] = LabelRule.parse(label).model_dump(mode="json")
        except LabelRuleError as exc:
            raise LabelRuleError("--label", exc.message) from None
    if categorical is not None:
        data["source"]["categorical"] = categorical
    if continuous is not None:
        data["source"]["continuous"] = continuous
    return parse_config({"etl": data}, origin="command-line flags").etl


def _format_from_suffix(path: str) -> str | None:
    name = path.rstrip("/").lower()
    for suffix, fmt in ((".jsonl", "jsonl"), (".json", "jsonl"), (".csv", "csv"),
                        (".parquet", "parquet")):
        if name.endswith(suffix) or name.endswith(suffix + "*"):
            return fmt
    return None
