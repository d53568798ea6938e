"""The validation gate's checks on hand-made profiles: each check fires past its threshold
and not before it, names its column, and the thresholds come from featureline.yaml."""

from __future__ import annotations

import copy
import math

import pytest
from scipy.stats import chi2, chi2_contingency

from featureline.config import parse_config
from featureline.core.drift import (
    NOT_CHECKED,
    ChecksConfig,
    bin_edges,
    check,
    homogeneity_p,
    js_divergence,
    linf_distance,
    measure,
    prometheus,
    quantiles,
)
from featureline.core.drift_report import render
from featureline.core.errors import ConfigError
from tests.metric_samples import samples


def _profile() -> dict:
    return {
        "day": "2026-01-10", "day_events": 1000, "label_rate": 0.2,
        "events_per_day": {"2026-01-09": 980, "2026-01-10": 1000},
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


def test_every_check_is_measured_breached_or_not():
    day = _profile()
    day["day_events"] = 600
    measured = {(m.check, m.column): m for m in measure(day, _profile(), ChecksConfig())}
    assert set(measured) == {("volume", ""), ("missing", "price"), ("js", "price"),
                             ("missing", "category"), ("linf", "category"),
                             ("unseen", "category"), ("label_rate", "label"),
                             ("quarantine_rate", "")}
    assert measured[("volume", "")].value == pytest.approx(0.4)
    assert not any(m.breached for m in measured.values())
    assert measured[("quarantine_rate", "")].threshold == pytest.approx(10 / 1010 * 3, abs=1e-6)


def test_the_metrics_hold_each_check_and_the_verdict():
    day = _profile()
    day["day_events"] = 100
    found = samples(prometheus(measure(day, _profile(), ChecksConfig()), day,
                                  compared=True, run_at=1_700_000_000.0))
    volume = (("check", "volume"), ("column", ""))
    assert found[("featureline_check_value", volume)] == pytest.approx(0.9)
    assert found[("featureline_check_threshold", volume)] == 0.5
    assert found[("featureline_check_breached", volume)] == 1
    assert found[("featureline_check_breached", (("check", "js"), ("column", "price")))] == 0
    assert found[("featureline_check_breaches", (("check", "volume"),))] == 1
    assert found[("featureline_check_breaches", (("check", "schema"),))] == 0
    assert found[("featureline_checks_passed", ())] == 0
    assert found[("featureline_checks_day_events", ())] == 100
    assert found[("featureline_checks_run_timestamp_seconds", ())] == 1_700_000_000


def test_the_report_puts_breached_columns_first_and_escapes_values():
    day = _profile()
    day["columns"]["category"]["top"] = [["<b>c0</b>", 200], ["c1", 700], ["c2", 100]]
    measured = measure(day, _profile(), ChecksConfig())
    page = render(day, _profile(), measured, ChecksConfig(), output="out", reference_name="ref")
    assert page.index('id="column-category"') < page.index('id="column-price"')
    assert 'href="#column-category"' in page and "<b>c0</b>" not in page
    assert "&lt;b&gt;c0&lt;/b&gt;" in page
    assert "http://" not in page and "https://" not in page  # nothing fetched
    clean = render(_profile(), _profile(), measure(_profile(), _profile(), ChecksConfig()),
                   ChecksConfig(), output="out", reference_name="ref")
    assert 'id="verdict">PASSED' in clean and 'id="breaches"' not in clean


def _small_day(users: int, histogram: dict[str, int]) -> dict:
    day = _profile()
    rows = sum(histogram.values())
    day["day_events"] = rows
    day["columns"]["price"].update(histogram=histogram, rows=rows)
    day["columns"]["category"].update(rows=rows, top=[["c0", rows]], distinct=1)
    day["columns"]["user_id"] = {"kind": "categorical", "source": "raw", "rows": rows,
                                 "missing": 0.0, "distinct": users, "key": True,
                                 "top": [[f"u{i}", 1] for i in range(users)]}
    return day


def test_a_small_day_is_judged_by_its_independent_values():
    """At most one value per user counts: 100 prices of 5 users are not checked; prices ×100
    (20 bins up) of 30 users breach with a tiny p-value; 12 prices of 12 users that differ
    from the reference's shape by more than the threshold, but within chance, do not."""
    config = ChecksConfig(js=0.1, volume_change=None, label_rate_change=None,
                          quarantine_rate_factor=None)
    reference = _profile()
    reference["columns"]["user_id"] = {**_small_day(400, {"5": 1})["columns"]["user_id"],
                                       "rows": 1000}
    few = {(m.check, m.column): m for m in
           measure(_small_day(5, {"25": 30, "30": 40, "35": 30}), reference, config)}
    assert few[("js", "price")].value == NOT_CHECKED and not few[("js", "price")].breached
    assert few[("linf", "category")].value == NOT_CHECKED
    assert few[("js", "price")].threshold == "8 values"
    assert ("linf", "user_id") not in few  # ids are never compared by distribution

    moved = {(m.check, m.column): m for m in
             measure(_small_day(30, {"25": 30, "30": 40, "35": 30}), reference, config)}
    assert moved[("js", "price")].breached and moved[("js", "price")].value == 1.0
    assert moved[("js", "price")].p_value < 1e-10

    chance = _small_day(12, {"5": 1, "10": 2, "15": 5, "20": 4})
    measured = {(m.check, m.column): m for m in measure(chance, reference, config)}
    js = measured[("js", "price")]
    assert js.value > config.js and not js.breached
    assert config.p_value < js.p_value < 0.5


def test_homogeneity_p_is_the_g_test_of_the_merged_table():
    """Against SciPy's log-likelihood test of the same 2 × k table: equal where every cell
    expects a value of ours; sparse cells are merged with their neighbours first."""
    ours, theirs = {"1": 12, "2": 30, "3": 9}, {"1": 300, "2": 400, "3": 200}
    expected = chi2_contingency([[12, 30, 9], [300, 400, 200]], correction=False,
                                lambda_="log-likelihood").pvalue
    assert homogeneity_p(ours, theirs, ["1", "2", "3"], 51) == pytest.approx(expected)
    # Bin 4 expects 0.5 of our 51 values: merged into bin 3.
    sparse = homogeneity_p({**ours, "4": 3}, {**theirs, "4": 10}, ["1", "2", "3", "4"], 54)
    merged = chi2_contingency([[12, 30, 12], [300, 400, 210]], correction=False,
                              lambda_="log-likelihood").pvalue
    assert sparse == pytest.approx(merged)
    # Half the values independent: half the statistic.
    halved = homogeneity_p(ours, theirs, ["1", "2", "3"], 25.5)
    statistic = chi2_contingency([[12, 30, 9], [300, 400, 200]], correction=False,
                                 lambda_="log-likelihood").statistic
    assert halved == pytest.approx(chi2.sf(statistic / 2, 2))


def test_ids_are_never_a_closed_domain():
    day, reference = _profile(), _profile()
    for profile in (day, reference):
        profile["columns"]["category"]["key"] = True
    day["columns"]["category"]["top"] = [["c0", 540], ["c1", 300], ["c2", 100], ["c9", 60]]
    assert check(day, reference, ChecksConfig()) == []


def test_a_null_threshold_turns_its_check_off():
    day = _profile()
    day["day_events"] = 100
    assert check(day, _profile(), ChecksConfig(volume_change=None)) == []
    config = parse_config({"checks": {"volume_change": None, "label_rate_change": None}})
    assert config.checks.volume_change is None and config.checks.js == 0.3


def test_quantiles_are_read_off_the_histogram():
    # 100 values: 50 in bin 10 ([9, 11.6)), 50 in bin 20 ([99, 125)), min 9.5, max 120.
    column = {"histogram": {"20": 50, "10": 50}, "min": 9.5, "max": 120.0}
    found = quantiles(column)
    assert list(found) == ["p1", "p25", "p50", "p75", "p99"]
    low, high = bin_edges(10)
    assert (low, high) == pytest.approx((10 ** 1 - 1, 10 ** 1.1 - 1))
    assert found["p1"] == pytest.approx(9.5)  # clamped to the minimum
    assert found["p25"] == pytest.approx(low + 0.5 * (high - low))
    assert found["p50"] == pytest.approx(high)
    assert bin_edges(20)[0] <= found["p75"] <= bin_edges(20)[1]
    assert found["p99"] == pytest.approx(120.0)  # clamped to the maximum
    assert bin_edges(-3) == pytest.approx((-(10 ** 0.4 - 1), -(10 ** 0.3 - 1)))
    assert bin_edges(0)[0] < 0 < bin_edges(0)[1]
    assert quantiles({"histogram": {}, "min": None, "max": None})["p50"] is None
