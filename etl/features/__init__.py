"""The feature ops, one file each; this registry is the one place that lists them.

Adding an op: a new file holding its settings model (``op: Literal["<name>"]``, its
parameters, ``build``) and its :class:`~featureline.etl.features.base.FeatureOp`, and one
line below.
"""

from __future__ import annotations

from featureline.etl.features.categorify import CategorifySettings
from featureline.etl.features.count_encode import CountEncodeSettings
from featureline.etl.features.cyclic_time import CyclicTimeSettings
from featureline.etl.features.hashed_cross import HashedCrossSettings
from featureline.etl.features.history import HistorySettings
from featureline.etl.features.lag_features import LagFeaturesSettings
from featureline.etl.features.normalize import NormalizeSettings
from featureline.etl.features.target_encode import TargetEncodeSettings

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
