"""Fits (docs/ARCHITECTURE.md, "Fits"): a run transforms with a given output's fitted
statistics, none recomputed, and records whose fit it used."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest

from featureline.core.errors import ConfigError
from featureline.core.metadata import OOV_ID, encoded_name
from featureline.etl import job
from featureline.etl.config import EtlConfig, with_overrides
from featureline.etl.datagen import DEFAULT_START, write_log
from featureline.etl.features.base import SPLIT, TRAIN
from featureline.etl.fit import load_fit, scheduled_fit
from tests.job_config import make_config

# The fitted ops' statistics in stats.json, and their tables under artifacts/.
FITTED_STATS = ("count_encode", "target_encode", "normalize", "model_ready")
FITTED_TABLES = ("count_encode/user_id", "count_encode/item_id", "target_encode/item_id",
                 "target_encode_folds/item_id")


def _table(path: Path) -> pd.DataFrame:
    """A Parquet table in key order (examples by event, artifacts by value)."""
    frame = ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pandas()
    keys = [c for c in ("user_id", "item_id", "ts", "event_type", "value", "fold", "id")
            if c in frame.columns]
    return frame.sort_values(keys).reset_index(drop=True)


def _stats(output: Path) -> dict:
    stats = json.loads((output / "artifacts" / "stats.json").read_text())
    return {op: stats.get(op) for op in FITTED_STATS}


@pytest.mark.slow
def test_a_run_with_its_own_fit_writes_the_same_examples(spark, small_log, tmp_path,
                                                         job_output):
    """Every fitted statistic read back from the output is the one fitted: the out-of-fold
    target encodings of the training rows too. The validation split's values first seen
    there, OOV for the fitting run, the run keeping the fit numbers after the fit's ids."""
    config = make_config(tmp_path, small_log, fit={"from_output": str(job_output.output)})
    again = job.run(config, spark, progress=lambda _: None)
    first, second = (_table(o / "examples") for o in (job_output.output, again.output))
    assert len(first) == len(second) == job_output.metadata["rows"]["accepted"]
    train = first[SPLIT] == TRAIN
    pd.testing.assert_frame_equal(first[train], second[train], check_exact=True)
    numbered = 0
    for column in ("user_id", "item_id"):
        largest = _table(job_output.output / "artifacts" / "categorify" / column)["id"].max()
        fitted, kept = (frame.loc[~train, encoded_name(column)] for frame in (first, second))
        known = fitted != OOV_ID
        assert (fitted[known] == kept[known]).all(), column
        assert (kept[~known] > largest).all(), column
        numbered += int((~known).sum())
    assert numbered > 0
    fit, fitted = again.metadata["fit"], job_output.metadata["fit"]
    assert fitted["from"] is None and fitted["version"] == job_output.metadata["dataset"][
        "version"]
    assert fit["version"] == fitted["version"] and fit["fitted_at"] == fitted["fitted_at"]
    assert fit["from"] == str(job_output.output.resolve()) and fit["age_days"] >= 0
    assert _stats(again.output) == _stats(job_output.output)


@pytest.mark.slow
def test_a_fit_transforms_other_events_without_refitting(spark, tmp_path, job_output):
    """Another log (other users, items and prices) with the fit: every statistic is the
    fit's — a user's count is the fit's count, 0 for one it never saw — and the vocabularies
    keep the fit's ids, new values numbered after them."""
    log = tmp_path / "other.jsonl"
    write_log(log, events=3000, users=220, items=160, days=5, seed=29, bad_fraction=0.0)
    config = make_config(tmp_path, log, fit={"from_output": str(job_output.output)})
    run = job.run(config, spark, progress=lambda _: None)
    assert _stats(run.output) == _stats(job_output.output)
    for name in FITTED_TABLES:
        pd.testing.assert_frame_equal(_table(job_output.output / "artifacts" / name),
                                      _table(run.output / "artifacts" / name))
    counts = _table(job_output.output / "artifacts" / "count_encode" / "user_id")
    fitted = dict(zip(counts["value"], counts["count"], strict=True))
    examples = _table(run.output / "examples")
    expected = examples["user_id"].map(lambda u: float(fitted.get(u, 0)))
    # The model-ready step standardises the count in place with the fit's statistics (the
    # examples hold float32).
    stats = _stats(job_output.output)["model_ready"]["user_id_count"]
    shaped = (np.log1p(expected.to_numpy()) - stats["mean"]) / stats["std"]
    np.testing.assert_allclose(examples["user_id_count"].to_numpy(), shaped, rtol=1e-6)
    assert 0 < (expected == 0).sum() < len(examples)  # new users and known ones
    old = _table(job_output.output / "artifacts" / "categorify" / "user_id")
    new = _table(run.output / "artifacts" / "categorify" / "user_id")
    kept = new.merge(old, on="value", suffixes=("", "_fit"))
    assert len(kept) > 0 and (kept["id"] == kept["id_fit"]).all()
    assert new[~new["value"].isin(old["value"])]["id"].min() > old["id"].max()
    assert run.metadata["fit"]["version"] == job_output.metadata["fit"]["version"]


def test_a_fit_of_other_settings_or_a_conflicting_flag_is_refused(spark, tmp_path, job_output):
    source = str(job_output.output)
    other = make_config(tmp_path, tmp_path / "events.jsonl", fit={"from_output": source})
    data = other.model_dump(mode="json")
    for op in data["features"]:
        if op["op"] == "target_encode":
            op["smoothing"] = 5.0
    changed = EtlConfig.model_validate(data)
    with pytest.raises(ConfigError, match="fitted for other settings") as refused:
        load_fit(spark, changed)
    assert refused.value.key == "--fit-from"
    with pytest.raises(ConfigError, match=r"no metadata\.json"):
        load_fit(spark, make_config(tmp_path, tmp_path / "e.jsonl",
                                    fit={"from_output": str(tmp_path)}))
    base = make_config(tmp_path, tmp_path / "events.jsonl")
    for flags, says in (({"refit_vocabularies": True}, "extended, not refitted"),
                        ({"vocabulary_from": str(tmp_path)}, "come with the fit"),
                        ({"incremental": True, "input_path": "x.jsonl"}, "incremental run")):
        with pytest.raises(ConfigError, match=says):
            with_overrides(base, fit_from=source, **flags)


@pytest.mark.slow
def test_a_kept_fit_is_refitted_once_it_is_refit_every_old(spark, tmp_path, job_output):
    """etl.fit.refit_every: a full run keeps the fit of the output it replaces while that fit
    is younger, in the events' time (from the end of its training split to the end of the
    run's), and fits anew once it is not."""
    shutil.copytree(job_output.output, tmp_path / "out")
    later = tmp_path / "later.jsonl"
    write_log(later, events=3000, users=150, items=120, days=6, seed=31,
              start=DEFAULT_START + timedelta(days=3))
    fitted = job_output.metadata["fit"]

    kept = job.run(make_config(tmp_path, later, fit={"refit_every": "7d"}), spark,
                   progress=lambda _: None)
    assert kept.output == tmp_path / "out"
    fit = kept.metadata["fit"]
    assert (fit["version"], fit["trained_until"]) == (fitted["version"], fitted["trained_until"])
    assert fit["from"] == str((tmp_path / "out").resolve()) and fit["age_days"] == 3.0
    assert _stats(kept.output) == _stats(job_output.output)

    refitted = job.run(make_config(tmp_path, later, fit={"refit_every": "2d"}), spark,
                       progress=lambda _: None)
    fit = refitted.metadata["fit"]
    assert fit["version"] == refitted.metadata["dataset"]["version"] != fitted["version"]
    assert fit["from"] is None and fit["age_days"] == 0.0
    assert fit["trained_until"] == refitted.metadata["split"]["valid_from"]
    assert _stats(refitted.output) != _stats(job_output.output)
    # Now young: kept by the schedule, unless the run is told to refit.
    young = with_overrides(make_config(tmp_path, later, fit={"refit_every": "2d"}))
    assert scheduled_fit(spark, young, tmp_path / "out") is not None
    told = with_overrides(young, refit=True)
    assert scheduled_fit(spark, told, tmp_path / "out") is None
    with pytest.raises(ConfigError, match="not both"):
        with_overrides(told, fit_from=str(tmp_path / "out"))


def test_daily_runs_keep_the_fit_a_week_by_default_and_full_runs_fit_anew():
    from featureline.etl.config import INCREMENTAL_REFIT_EVERY, FitConfig

    assert INCREMENTAL_REFIT_EVERY == "7d"
    assert (FitConfig().kept_for("incremental"), FitConfig().kept_for("full")) == ("7d", None)
    told = FitConfig(refit_every="2d")
    assert (told.kept_for("incremental"), told.kept_for("full")) == ("2d", "2d")
