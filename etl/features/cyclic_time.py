"""cyclic_time: hour of day (UTC) and day of week (Monday = 0) as points on a circle."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from featureline.core.model_inputs import PERIODS, Period, Served, Source
from featureline.core.transforms import NONE
from featureline.etl.features.base import ColumnRoles, FeatureOp, FeatureSpec, OpSettings

# Each period's position of a time (core.model_inputs.PERIODS: how many make a circle).
POSITIONS: dict[Period, Callable[[Column], Column]] = {"hour": F.hour, "dow": F.weekday}


class CyclicTimeSettings(OpSettings):
    """Hour of day and day of week (UTC) as sine and cosine: hour_sin, hour_cos, dow_sin,
    dow_cos."""

    op: Literal["cyclic_time"]

    def build(self, roles: ColumnRoles) -> CyclicTime:
        return CyclicTime()


# Features every event of a UTC day shares: a day's profile of them says which day it is, not
# how the data behaves (the validation gate leaves them out).
SAME_ALL_DAY = ("dow_sin", "dow_cos")


class CyclicTime(FeatureOp):
    name = "cyclic_time"

    def transform(self, events: DataFrame) -> DataFrame:
        columns = {}
        for name, position in POSITIONS.items():
            angle = position(F.col("ts")) * (2 * math.pi / PERIODS[name])
            columns[f"{name}_sin"] = F.sin(angle)
            columns[f"{name}_cos"] = F.cos(angle)
        return events.withColumns(columns)

    def served(self) -> Served:
        return Served({f"{name}_{fn}": Source(kind="cyclic", period=name, fn=fn)
                       for name in PERIODS for fn in ("sin", "cos")})

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(f"{name}_{fn}", "continuous", "float32", transform_hint=NONE)
                for name in PERIODS for fn in ("sin", "cos")]
