"""``featureline.yaml``'s ``trainer`` section: the quality gate between training and serving
(``featureline promote``, ``trainer.quality``)."""

from __future__ import annotations

from pydantic import Field

from featureline.core.settings import Settings


class GateConfig(Settings):
    """``trainer.gate``: how much worse than the served model a candidate may be."""

    # The candidate's AUC on the validation day may be this much lower than the served model's.
    max_auc_drop: float = Field(default=0.005, ge=0, le=1)
    # Its log-loss may be this much higher.
    max_log_loss_rise: float = Field(default=0.01, ge=0)


class TrainerConfig(Settings):
    """``trainer``: the quality gate between training and serving."""

    gate: GateConfig = GateConfig()
