"""The feature ops, one file each; this registry is the one place that lists them.

Adding an op: a new file holding its settings model (``op: Literal["<name>"]``, its
parameters, ``build``) and its :class:`~etl.features.base.FeatureOp`, and one line below.
"""

from __future__ import annotations

from etl.features.categorify import CategorifySettings
from etl.features.count_encode import CountEncodeSettings
from etl.features.cyclic_time import CyclicTimeSettings
from etl.features.hashed_cross import HashedCrossSettings
from etl.features.history import HistorySettings
from etl.features.lag_features import LagFeaturesSettings
from etl.features.normalize import NormalizeSettings
from etl.features.target_encode import TargetEncodeSettings

OP_SETTINGS = (
    CategorifySettings,
    CountEncodeSettings,
    TargetEncodeSettings,
    LagFeaturesSettings,
    CyclicTimeSettings,
    HashedCrossSettings,
    NormalizeSettings,
    HistorySettings,
)
