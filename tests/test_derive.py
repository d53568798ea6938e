"""Derived features' expressions (core/derive.py): one parser, and two evaluators that agree —
NumPy over the candidates, Spark columns over the examples — with a brute force in plain
Python, missing values included."""

from __future__ import annotations

import math

import numpy as np
import pytest

from featureline.core.derive import (
    Binary,
    Call,
    DeriveError,
    Num,
    NumpyBackend,
    Ref,
    SparkBackend,
    evaluate,
    parse,
    references,
)

EXPRESSIONS = [
    "user_activity:count_7d - user_activity:count_1d * 2",
    "-(a + b) / c",
    "log1p(a)",
    "clip(b, -1, 2.5)",
    "coalesce(c, a, 0)",
    "ratio(a, b, prior=0.1, weight=20)",
    "bucketize(a, [-1, 0, 2.5, 10])",
    "seconds_since(t) / 3600",
    "ratio(log1p(a), clip(b, 0, 1e3), prior=c, weight=2) + bucketize(c, [0])",
]


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def _brute(text: str, row: dict[str, float | None], now: float) -> float | None:
    """Each expression by hand, on one row: None where any input is missing, a division by
    zero or log1p at or below −1."""
    a, b, c, t = row["a"], row["b"], row["c"], row["t"]
    n7, n1 = row["user_activity:count_7d"], row["user_activity:count_1d"]

    def some(*values: float | None) -> bool:
        return any(_missing(v) for v in values)

    def div(x: float | None, y: float | None) -> float | None:
        return None if some(x, y) or y == 0 else x / y  # type: ignore[operator]

    def log1p(x: float | None) -> float | None:
        return None if some(x) or x <= -1 else math.log1p(x)  # type: ignore[operator]

    def clip(x: float | None, low: float, high: float) -> float | None:
        return None if some(x) else min(max(x, low), high)  # type: ignore[type-var]

    def bucket(x: float | None, edges: list[float]) -> float | None:
        return None if some(x) else float(sum(edge <= x for edge in edges))  # type: ignore

    def ratio(x: float | None, y: float | None, prior: float | None, weight: float
              ) -> float | None:
        if some(x, y, prior):
            return None
        return div(x + prior * weight, y + weight)  # type: ignore[operator]

    found = {
        EXPRESSIONS[0]: None if some(n7, n1) else n7 - n1 * 2,  # type: ignore[operator]
        EXPRESSIONS[1]: None if some(a, b) else div(-(a + b), c),  # type: ignore[operator]
        EXPRESSIONS[2]: log1p(a),
        EXPRESSIONS[3]: clip(b, -1, 2.5),
        EXPRESSIONS[4]: next((v for v in (c, a, 0.0) if not _missing(v)), None),
        EXPRESSIONS[5]: ratio(a, b, 0.1, 20),
        EXPRESSIONS[6]: bucket(a, [-1, 0, 2.5, 10]),
        EXPRESSIONS[7]: None if some(t) else (now - t) / 1e6 / 3600,  # type: ignore[operator]
    }
    if text in found:
        return found[text]
    left, right = ratio(log1p(a), clip(b, 0, 1e3), c, 2), bucket(c, [0])
    return None if some(left, right) else left + right  # type: ignore[operator]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, float | None]]:
    """400 rows: values around the edges, zeros (divisions), −1 (log1p) and missing ones."""
    rng = np.random.default_rng(3)
    picks = [-2.0, -1.0, 0.0, 2.5, 10.0, None]
    found = []
    for _ in range(400):
        row = {}
        for name in ("a", "b", "c", "user_activity:count_7d", "user_activity:count_1d"):
            row[name] = (picks[rng.integers(len(picks))] if rng.random() < 0.3
                         else float(rng.normal(2, 5)))
        # µs since the epoch, whole, as a latest output holds it
        row["t"] = None if rng.random() < 0.1 else 1.7e15 + float(rng.integers(0, 10**11))
        found.append(row)
    return found


NOW = 1.7e15 + 2e11  # µs


def _numpy(text: str, rows: list[dict[str, float | None]]) -> list[float | None]:
    values = {name: np.array([np.nan if r[name] is None else r[name] for r in rows])
              for name in rows[0]}
    result = np.broadcast_to(evaluate(parse(text), NumpyBackend(values, NOW)), (len(rows),))
    return [None if math.isnan(v) else float(v) for v in result]


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_numpy_equals_the_brute_force(text, rows):
    expected = [_brute(text, row, NOW) for row in rows]
    assert sum(v is None for v in expected) < len(rows)  # some values, some missing
    for got, want in zip(_numpy(text, rows), expected, strict=True):
        assert (got is None and want is None) or got == pytest.approx(want, rel=1e-12), text


def test_spark_columns_equal_numpy(spark, rows):
    from pyspark.sql import functions as F

    names = list(rows[0])
    safe = {name: f"c{i}" for i, name in enumerate(names)}
    frame = spark.createDataFrame(
        [tuple(row[n] for n in names) for row in rows],
        schema=", ".join(f"{safe[n]} double" for n in names))
    now = F.lit(int(NOW))
    backend = SparkBackend({name: F.col(safe[name]) for name in names}, now)
    computed = frame.select(*(evaluate(parse(text), backend).alias(f"e{i}")
                              for i, text in enumerate(EXPRESSIONS))).collect()
    for i, text in enumerate(EXPRESSIONS):
        for got, want in zip((row[f"e{i}"] for row in computed), _numpy(text, rows),
                             strict=True):
            assert (got is None and want is None) or got == pytest.approx(want, rel=1e-12), \
                text


def test_the_tree_and_its_references():
    node = parse("ratio(user_activity:count_7d, b, prior=p, weight=20) - -1.5e1")
    assert node == Binary("-", Call("ratio", (Ref("user_activity:count_7d"), Ref("b")),
                                    prior=Ref("p"), weight=Num(20.0)),
                          parse("-15"))
    assert references(node) == {"user_activity:count_7d", "b", "p"}
    # * and / before + and -, left to right.
    assert parse("a - b - c * d / e") == Binary(
        "-", Binary("-", Ref("a"), Ref("b")),
        Binary("/", Binary("*", Ref("c"), Ref("d")), Ref("e")))


@pytest.mark.parametrize(("text", "why"), [
    ("a +", "the expression ends early at character 4"),
    ("lg(a)", "unknown function 'lg'"),
    ("log1p(a, b)", "log1p() takes 1 argument(s), not 2"),
    ("ratio(a, b)", "ratio() needs prior= and weight="),
    ("bucketize(a, [3, 1])", "the edges must increase"),
    ("bucketize(a)", "bucketize() needs its edges"),
    ("clip(a, lo=1, hi=2)", "clip() takes no argument 'lo'"),
    ("a $ b", "unexpected '$' at character 3"),
    ("(a + b", "expected ')'"),
    ("", "an empty expression"),
])
def test_a_bad_expression_is_one_line_naming_its_entry(text, why):
    with pytest.raises(DeriveError) as caught:
        parse(text, "derive[1] (ctr)")
    message = str(caught.value)
    assert message.startswith("derive[1] (ctr): ") and why in message, message
    assert "\n" not in message


# --- derive: in featureline.yaml -------------------------------------------------------------

GROUP = {"name": "user_category", "keys": ["user_id", "category"], "features": [
    {"op": "count", "windows": ["30d"]}, {"op": "last_k", "column": "item_id", "k": 3}]}


def _config(derive: list[dict]) -> object:
    from featureline.config import parse_config

    return parse_config({"aggregations": [GROUP], "derive": derive})


@pytest.mark.parametrize(("derive", "key", "why"), [
    ([{"name": "x", "expr": "log1p(user_category:count_3d)"}], "derive[0].expr",
     "'user_category:count_3d' is not a number it can read: did you mean "
     "user_category:count_30d"),
    ([{"name": "x", "expr": "user_category:item_id_last_k + 1"}], "derive[0].expr",
     "'user_category:item_id_last_k' is not a number"),  # ids, not a number
    ([{"name": "x", "expr": "value * 2"}], "derive[0].expr",
     "'value' is known only after the event"),  # an outcome of the default log
    ([{"name": "x", "expr": "event_type"}], "derive[0].expr", "known only after the event"),
    ([{"name": "x", "expr": "y"}, {"name": "y", "expr": "1"}], "derive[0].expr",
     "'y' is not a number"),  # read before it is listed
    ([{"name": "item_id_te", "expr": "1"}], "derive[0].name", "already a feature's"),
    ([{"name": "x", "expr": "1"}, {"name": "x", "expr": "2"}], "derive[1].name",
     "already a feature's"),
    ([{"name": "Rate", "expr": "1"}], "derive[0].name", "lower case"),
    ([{"name": "x", "expr": "ratio(price, 2)"}], "derive[0].expr", "ratio() needs prior="),
])
def test_a_bad_entry_is_one_line_naming_its_key_before_spark(derive, key, why):
    from featureline.core.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        _config(derive)
    message = str(caught.value)
    assert message.startswith(f"{key}: ") and why in message, message
    assert "\n" not in message


def test_an_entry_reads_features_columns_outputs_and_entries_before_it():
    from featureline.etl.config import derive_inputs

    config = _config([
        {"name": "rate", "expr": "ratio(user_category:count_30d, user_events_7d, prior="
                                 "user_prior_positive_rate, weight=5)"},
        {"name": "priced", "expr": "rate * log1p(price) + item_id_te"}]).etl  # type: ignore
    assert [spec.name for spec in config.derive] == ["rate", "priced"]
    readable = derive_inputs(config)
    assert readable["user_category:count_30d"] == "user_category__count_30d"
    assert readable["price"] == "price" and "price_norm" in readable
    assert "user_category:item_id_last_k" not in readable and "value" not in readable


def test_the_guides_example_loads_and_its_error_is_the_one_shown():
    import re
    from pathlib import Path

    import yaml

    from featureline.config import parse_config
    from featureline.core.errors import ConfigError

    page = (Path(__file__).parents[1] / "docs" / "features.md").read_text()
    section = page.split("## Derived features", 1)[1].split("\n## ", 1)[0]
    block = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))
    config = parse_config(block)
    assert [spec.name for spec in config.derive] == ["category_click_rate", "log_price",
                                                     "category_recency"]
    shown = re.search(r"```\n(derive\[0\]\.expr: .*)\n```", section).group(1)
    block["derive"][0]["expr"] = block["derive"][0]["expr"].replace("clicks_30d", "click_30d")
    with pytest.raises(ConfigError) as caught:
        parse_config(block)
    assert str(caught.value).split(" (in ")[0] == shown


def test_a_refused_day_names_the_outputs_that_changed(tmp_path):
    """An incremental run over an output written with another spec names the aggregation
    outputs and derived features added, changed and removed, from the fingerprints the
    state keeps, and whether the other settings are the same."""
    from datetime import datetime, timezone

    from featureline.etl.config import other_settings_hash, output_fingerprints
    from featureline.etl.errors import IncompatibleStateError
    from featureline.etl.incremental import STATE_VERSION, State, check_compatible, values_hash

    def etl(groups: list[dict], derive: list[dict], **more: object) -> object:
        from featureline.config import parse_config

        return parse_config({"aggregations": groups, "derive": derive,
                             "etl": more}).etl  # type: ignore[return-value]

    rate = {"name": "rate", "expr": "ratio(g:clicks_7d, g:count_7d, prior=0.1, weight=5)"}
    group = {"name": "g", "keys": ["user_id", "category"], "features": [
        {"op": "count", "windows": ["7d", "30d"]},
        {"op": "count", "name": "clicks", "filter": "event_type in (click)", "windows": ["7d"]}]}
    written = etl([group], [rate])
    state = State(tmp_path, STATE_VERSION, values_hash(written),
                  datetime(2026, 1, 1, tzinfo=timezone.utc), {}, {},
                  output_fingerprints(written), other_settings_hash(written))
    check_compatible(state, written, tmp_path)  # the same settings: extended
    # The clicks' filter changed (so did the rate that reads them), a window added and one
    # removed, another derived feature added.
    changed = {**group, "features": [
        {"op": "count", "windows": ["7d", "1d"]},
        {"op": "count", "name": "clicks", "filter": "event_type in (click, purchase)",
         "windows": ["7d"]}]}
    cases = [
        (etl([changed], [rate, {"name": "twice", "expr": "rate * 2"}]),
         "aggregations and derived features: added g:count_1d, twice; changed g:clicks_7d, "
         "rate; removed g:count_30d; the other settings are the same"),
        (etl([group], [rate], split={"valid_days": 2}),
         "features, label, validation or columns differ"),
        (etl([group], [], split={"valid_days": 2}),
         "removed rate; features, label, validation or columns differ too"),
    ]
    for config, why in cases:
        with pytest.raises(IncompatibleStateError) as refused:
            check_compatible(state, config, tmp_path)
        assert why in str(refused.value), str(refused.value)
        assert "\n" not in str(refused.value)
    # A state written before the fingerprints: the general reason.
    old = State(tmp_path, STATE_VERSION, "0" * 64, state.latest, {}, {})
    with pytest.raises(IncompatibleStateError, match="features, label, validation or columns"):
        check_compatible(old, written, tmp_path)
