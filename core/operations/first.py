"""``first``: the value of the earliest event in the window (equal times: the smaller value)."""

from __future__ import annotations

from featureline.core.operations.last import OnePair


class First(OnePair):
    """The earliest event's value. The backfill's oldest-pair plan computes it: the RAPIDS
    Accelerator runs no minimum of a struct over a frame."""

    name = "first"
    plan = "oldest"
    newest = False
