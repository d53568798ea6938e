"""``featureline consistency`` as the commands run it (the command, the demo): the feature
log's entity features and aggregations (``feature_store.consistency``) and the model inputs
(``api.inputs_consistency``) against the ETL output, in one report."""

from __future__ import annotations

import functools
from pathlib import Path

from featureline.api.inputs_consistency import compare_inputs
from featureline.feature_store.consistency import (
    ConsistencyReport,
    StreamExpectation,
    check_consistency,
)
from featureline.feature_store.settings import FeatureStoreConfig


def check_served(log: str | Path, output: str | Path, settings: FeatureStoreConfig, *,
                 expected: StreamExpectation | None = None, max_mismatch: float = 0.0,
                 top: int = 5) -> ConsistencyReport:
    """What the API served (its feature log ``log``) against ``output``, point in time."""
    return check_consistency(log, output, settings, max_mismatch=max_mismatch, top=top,
                             expected=expected,
                             more=functools.partial(compare_inputs, output=output,
                                                    expected=expected, top=top))
