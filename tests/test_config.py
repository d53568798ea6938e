from pathlib import Path

import pytest

from featureline.config import FeaturelineConfig, load_config, parse_config
from featureline.core.errors import ConfigError
from featureline.etl.config import EtlConfig, LabelRule, with_overrides
from featureline.etl.errors import LabelRuleError

REPO = Path(__file__).resolve().parent.parent


def test_repository_default_config_is_valid_and_matches_embedded_defaults():
    config = load_config(REPO / "featureline.yaml")
    # The file users edit and the embedded defaults say the same thing.
    assert config == FeaturelineConfig()
    assert config.etl.source.format == "jsonl"
    assert str(config.etl.label) == ("event_type in (click, purchase) within 30m of "
                                     "event_type in (view)")
    assert [op.op for op in config.etl.features][:2] == ["categorify", "count_encode"]


@pytest.mark.parametrize(
    ("expression", "column", "op", "value"),
    [
        ("value >= 4", "value", ">=", 4.0),
        ("rating<3.5", "rating", "<", 3.5),
        ("event_type in (click, purchase)", "event_type", "in", ["click", "purchase"]),
        ("event_type IN ['click']", "event_type", "in", ["click"]),
        ("device == 'mobile'", "device", "==", "mobile"),
    ],
)
def test_label_rules_parse(expression, column, op, value):
    rule = LabelRule.parse(expression)
    assert (rule.column, rule.op, rule.value) == (column, op, value)


@pytest.mark.parametrize("expression", ["value >>= 4", "in (a)", "value", "event_type in ()"])
def test_bad_label_rule_names_the_key(expression):
    with pytest.raises(LabelRuleError) as info:
        LabelRule.parse(expression)
    assert info.value.key == "label"


@pytest.mark.parametrize(
    ("data", "key", "fragment"),
    [
        ({"etl": {"source": {"pth": "x"}}}, "etl.source.pth", "unknown key; did you mean `path`?"),
        ({"etl": {"source": {"format": "xml"}}}, "etl.source.format", "jsonl"),
        ({"etl": {"features": [{"op": "categorify", "columns": ["genre"]}]}},
         "etl.features[0].columns", "unknown column 'genre'"),
        ({"etl": {"features": [{"op": "normalize", "columns": ["device"]}]}},
         "etl.features[0].columns", "not a valid input of normalize"),
        ({"etl": {"features": [{"op": "count_encode", "columns": ["event_type"]}]}},
         "etl.features[0].columns", "leak the label"),
        ({"etl": {"features": [{"op": "history"}]}}, "etl.features[0]",
         "needs a categorify of item_id"),
        ({"etl": {"features": [{"op": "lag_features", "windows": ["7 days"]}]}},
         "etl.features[0].windows", "not a duration"),
        ({"etl": {"features": [{"op": "lag_features", "windows": ["10m"]}]}},
         "etl.features[0].windows", "fewer than six of its hops"),
        ({"etl": {"features": [{"op": "cyclic_time", "short_names": {"hour_sin": "toolong"}}]}},
         "etl.features[0].short_names", "1-3 characters"),
        ({"etl": {"split": {"valid_days": 0}}}, "etl.split.valid_days", "greater than"),
        ({"etl": {"validation": {"ts_min": "2030-01-01", "ts_max": "2020-01-01"}}},
         "etl.validation", "ts_min must be before ts_max"),
        ({"etl": {"label": "rating > 3"}}, "etl.label", "unknown column 'rating'"),
        ({"etl": {"label": "rating >> 3"}}, "etl.label", "cannot parse"),
    ],
)
def test_config_errors_name_the_key(data, key, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.key == key, str(info.value)
    assert fragment in str(info.value)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("etl: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)


def test_selectors_follow_the_declared_columns_and_skip_the_label():
    config = EtlConfig()
    assert config.column_roles().expand(["user_id", "@categorical"]) == ["user_id", "category",
                                                                   "device"]
    # value is an outcome (etl.source.roles): no selector expands to it.
    assert config.column_roles().expand(["@continuous"]) == ["price"]
    by_value = with_overrides(config, label="value >= 4", categorical=["genre"],
                              continuous=["price", "duration"])
    assert by_value.column_roles().expand(["@continuous"]) == ["price", "duration"]
    assert by_value.column_roles().expand(["@categorical"]) == ["genre"]


def test_an_outcome_is_never_its_own_examples_feature():
    """etl.source.roles: a selector skips an outcome, naming one fails with the key, and the
    label and the aggregations may still read it; metadata.json's events carry the roles."""
    config = EtlConfig()
    assert config.source.declared_roles() == {
        "value": "outcome", "category": "item", "device": "request", "price": "item"}
    assert config.event_contract().roles == config.source.declared_roles()
    with pytest.raises(ConfigError) as info:
        parse_config({"etl": {"features": [
            {"op": "normalize", "columns": ["value"]}]}})
    assert info.value.key == "etl.features[0].columns"
    assert "'value' is an outcome" in info.value.message
    # A column declared an outcome in the file: the same, and the selector skips it.
    dwell = parse_config({"etl": {"source": {
        "continuous": ["price", "dwell"], "roles": {"dwell": "outcome"}}}}).etl
    assert dwell.column_roles().expand(["@continuous"]) == ["price"]
    # A file that declares its own columns starts from value: outcome, not the demo's roles.
    assert dwell.source.role("price") == "request"
    assert dwell.source.role("value") == "outcome"
    assert parse_config({"etl": {"source": {"categorical": ["category"]}}}).etl.source.role(
        "category") == "request"
    assert parse_config({}).etl.source.role("category") == "item"  # the demo's defaults
    assert parse_config({"etl": {"source": {"roles": {"value": "request"}}}}).etl.column_roles(
        ).expand(["@continuous"]) == ["value", "price"]
    with pytest.raises(ConfigError, match="'dwell' is an outcome"):
        parse_config({"etl": {"source": {"continuous": ["dwell"],
                                         "roles": {"dwell": "outcome"}},
                              "features": [{"op": "normalize", "columns": ["dwell"]}]}})
    # The label and an aggregation over earlier events read an outcome.
    rated = parse_config({"etl": {"label": "value >= 4"}, "aggregations": [
        {"name": "user_ratings", "keys": ["user_id"],
         "features": [{"op": "mean", "column": "value", "windows": ["30d"]}]}]})
    assert rated.etl.label.column == "value"


def test_flags_override_the_file():
    config = with_overrides(FeaturelineConfig().etl, input_path="logs/*.csv", output="out",
                            profile="gpu")
    assert (config.source.path, config.source.format) == ("logs/*.csv", "csv")
    assert (config.output.path, config.spark.profile) == ("out", "gpu")
    with pytest.raises(ConfigError) as info:
        with_overrides(config, label="genre in (a, b)")
    assert info.value.key == "etl.label"
    assert with_overrides(config, valid_days=3).split.valid_days == 3
    with pytest.raises(ConfigError) as info:
        with_overrides(config, valid_days=0)
    assert info.value.key == "etl.split.valid_days"


def test_config_hash_is_stable_and_sensitive():
    assert EtlConfig().hash() == EtlConfig().hash()
    assert EtlConfig().hash() != with_overrides(EtlConfig(), label="value >= 4").hash()
