import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from featureline.etl.datagen import (
    BAD_KINDS_PARQUET,
    BAD_KINDS_TEXT,
    FUNNEL,
    generate_events,
    write_log,
)


def test_deterministic_for_a_seed():
    a = generate_events(3000, 100, 80, 5, seed=3)
    b = generate_events(3000, 100, 80, 5, seed=3)
    c = generate_events(3000, 100, 80, 5, seed=4)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_realistic_shape():
    events = generate_events(40_000, 2000, 1000, 14, seed=1)
    assert len(events) == 40_000
    assert events["ts"].is_monotonic_increasing
    # Zipf popularity: the top 1% of items draw far more than 1% of the views.
    views = events[events.event_type == "view"]
    top = views["item_id"].value_counts()
    assert top.iloc[:10].sum() / len(views) > 0.15
    # The funnel narrows at every step.
    counts = events["event_type"].value_counts()
    assert [counts[t] for t in FUNNEL] == sorted((counts[t] for t in FUNNEL), reverse=True)
    # Every purchase follows a view of the same item by the same user.
    first = events.groupby(["user_id", "item_id", "event_type"])["ts"].min().unstack()
    bought = first.dropna(subset=["purchase"])
    assert (bought["view"] <= bought["purchase"]).all()
    # An item has one price and one category.
    assert events.groupby("item_id")[["price", "category"]].nunique().max().max() == 1
    # Evenings are busier than the small hours.
    hours = pd.to_datetime(events["ts"]).dt.hour.value_counts()
    assert hours.loc[19:21].sum() > 3 * hours.loc[1:3].sum()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_bad_rows_of_every_kind(tmp_path, fmt):
    path = tmp_path / f"events.{fmt}"
    log = write_log(path, events=2000, users=50, items=40, days=3, seed=2, bad_fraction=0.05,
                    fmt=fmt)
    kinds = BAD_KINDS_PARQUET if fmt == "parquet" else BAD_KINDS_TEXT
    assert set(log.bad_rows) == set(kinds)
    assert sum(log.bad_rows.values()) == 100
    if fmt == "parquet":
        assert pq.read_table(path).num_rows == 2000
    else:
        lines = path.read_text().splitlines()
        assert len(lines) == 2000 + (fmt == "csv")
    if fmt == "jsonl":
        unparseable = 0
        for line in path.read_text().splitlines():
            try:
                json.loads(line)
            except json.JSONDecodeError:
                unparseable += 1
        assert unparseable == log.bad_rows["malformed_record"]


def test_a_million_events_is_quick(tmp_path):
    # The issue asks for >= 1M events in under 30 s; the generator itself is vectorised.
    events = generate_events(1_000_000, 50_000, 20_000, 14, seed=0)
    assert len(events) == 1_000_000
    assert np.isfinite(events["price"]).all()
