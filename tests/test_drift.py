"""The validation gate's checks on hand-made profiles: each check fires past its threshold
and not before it, names its column, and the thresholds come from featureline.yaml."""

from __future__ import annotations

import copy
import math

import pytest

from featureline.config import parse_config
from featureline.core.drift import ChecksConfig, check, js_divergence, linf_distance
from featureline.core.errors import ConfigError


def _profile() -> dict:
    return {
        "day": "2026-01-10", "day_events": 1000, "label_rate": 0.2,
        "rows": {"read": 1010, "quarantined": {"bad_timestamp": 10}},
        "columns": {
            "price": {"kind": "numeric", "source": "raw", "rows": 1000, "missing": 0.0,
                      "min": 1.0, "max": 300.0, "mean": 40.0, "std": 20.0,
                      "histogram": {"5": 300, "10": 400, "15": 200, "20": 100}},
            "category": {"kind": "categorical", "source": "raw", "rows": 1000,
                         "missing": 0.0, "distinct": 3,
                         "top": [["c0", 600], ["c1", 300], ["c2", 100]]},
        },
    }


def test_the_same_day_has_no_breach():
    assert check(_profile(), _profile(), ChecksConfig()) == []


def test_js_divergence_is_bounded_and_symmetric():
    a, b = {"1": 10, "2": 30}, {"2": 5, "3": 5}
    assert js_divergence(a, a) == 0.0
    assert js_divergence(a, b) == pytest.approx(js_divergence(b, a))
    assert js_divergence({"1": 1}, {"9": 1}) == pytest.approx(1.0)  # disjoint: the maximum
    # Half the mass moved to a new bin: JS = 1 - 3/4·log2(4/3)·... computed by hand.
    half = js_divergence({"1": 2}, {"1": 1, "2": 1})
    expected = 0.5 * math.log2(1 / 0.75) + 0.5 * (0.5 * math.log2(0.5 / 0.75)
                                                  + 0.5 * math.log2(0.5 / 0.25))
    assert half == pytest.approx(expected)


def test_linf_is_the_largest_change_of_one_share():
    ours = _profile()["columns"]["category"]
    theirs = {**ours, "top": [["c0", 450], ["c1", 450], ["c2", 100]]}
    assert linf_distance(ours, theirs) == pytest.approx(0.15)


@pytest.mark.parametrize(("fault", "check_name", "column"), [
    (lambda p: p["columns"]["price"].update(histogram={"25": 300, "30": 400, "35": 300}),
     "js", "price"),
    (lambda p: p["columns"]["category"].update(top=[["c0", 540], ["c1", 300], ["c2", 100],
                                                    ["c9", 60]], distinct=4),
     "unseen", "category"),
    (lambda p: p["columns"]["category"].update(top=[["c0", 200], ["c1", 700],
                                                    ["c2", 100]]), "linf", "category"),
    (lambda p: p["columns"]["category"].update(
        missing=0.5, top=[["c0", 300], ["c1", 150], ["c2", 50]]), "missing", "category"),
    (lambda p: p.update(day_events=100), "volume", ""),
    (lambda p: p.update(label_rate=0.05), "label_rate", "label"),
    (lambda p: p["rows"]["quarantined"].update(bad_timestamp=300), "quarantine_rate", ""),
    (lambda p: p["columns"].pop("category"), "schema", "category"),
    (lambda p: p["columns"]["price"].update(kind="categorical", top=[], distinct=0),
     "schema", "price"),
])
def test_each_fault_is_one_breach_naming_its_column(fault, check_name, column):
    day = _profile()
    fault(day)
    breaches = check(day, _profile(), ChecksConfig())
    assert [(b.check, b.column) for b in breaches] == [(check_name, column)]


def test_thresholds_decide():
    day = _profile()
    day["day_events"] = 600  # 1 - 600/1000 = 0.4
    assert check(day, _profile(), ChecksConfig(volume_change=0.45)) == []
    [breach] = check(day, _profile(), ChecksConfig(volume_change=0.35))
    assert breach.value == pytest.approx(0.4) and breach.threshold == 0.35


def test_declared_ranges_hold_without_a_reference():
    config = parse_config({"checks": {"ranges": {"price": {"min": 0, "max": 200}}}}).checks
    [breach] = check(_profile(), None, config)
    assert (breach.check, breach.column, breach.value) == ("range", "price", 300.0)
    assert str(breach) == "range price: 300 (threshold <= 200)"


def test_a_clean_reference_allows_a_few_quarantined_rows():
    reference = _profile()
    reference["rows"]["quarantined"] = {"bad_timestamp": 0}
    day = copy.deepcopy(reference)
    day["rows"]["quarantined"] = {"bad_timestamp": 15}  # 1.5 %: under the 2 % floor
    assert check(day, reference, ChecksConfig()) == []


def test_bad_thresholds_name_their_key():
    with pytest.raises(ConfigError) as error:
        parse_config({"checks": {"js": 2}})
    assert error.value.key == "checks.js"
    with pytest.raises(ConfigError) as error:
        parse_config({"etl": {"checks": {"js": 0.1}}})
    assert error.value.key == "etl.checks"
