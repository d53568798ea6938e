"""Pushed events → the event log: each validated by the ETL's checks (``core.events``), the
accepted ones appended, keyed by user, with the time they were accepted."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from featureline.core.events import EventContract, Rejection, validate_event
from featureline.stream.log import EventLog


def payload(event: dict[str, Any], accepted_at: float) -> bytes:
    """A typed event as the log holds it: JSON, ``ts`` in ISO-8601 to the microsecond."""
    return json.dumps({**event, "ts": event["ts"].isoformat(),
                       "accepted_at": accepted_at}).encode()


class Pusher:
    def __init__(self, contract: EventContract, log: EventLog) -> None:
        self.contract = contract
        self.log = log

    def push(self, events: Sequence[Any]) -> tuple[int, list[tuple[int, Rejection]]]:
        """How many events were appended, and each rejected one's index and reason. Nothing
        is appended unless every accepted event is (else the log's error)."""
        now = datetime.now(timezone.utc)
        accepted_at = time.time()
        accepted, rejected = [], []
        for index, record in enumerate(events):
            event, rejection = validate_event(record, self.contract, now)
            if rejection is not None:
                rejected.append((index, rejection))
            else:
                assert event is not None
                accepted.append((event["user_id"], payload(event, accepted_at)))
        if accepted:
            self.log.append(accepted)
        return len(accepted), rejected
