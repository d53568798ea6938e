"""Pushed events → the event log: each validated by the ETL's checks (``core.events``), the
accepted ones appended, keyed by user, with the time they were accepted."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from featureline.core.events import EventContract, EventValidator, Rejection, event_line
from featureline.stream.log import EventLog


class Pusher:
    def __init__(self, contract: EventContract, log: EventLog) -> None:
        self.contract = contract
        self.log = log

    def push(self, events: Sequence[Any]) -> tuple[int, list[tuple[int, Rejection]]]:
        """How many events were appended, and each rejected one's index and reason. Nothing
        is appended unless every accepted event is (else the log's error)."""
        validate = EventValidator(self.contract, datetime.now(timezone.utc))
        accepted_at = time.time()
        accepted, rejected = [], []
        for index, record in enumerate(events):
            event, rejection = validate(record)
            if rejection is not None:
                rejected.append((index, rejection))
            else:
                assert event is not None
                accepted.append((event["user_id"], event_line(event)))
        if accepted:
            self.log.append(accepted, accepted_at)
        return len(accepted), rejected
