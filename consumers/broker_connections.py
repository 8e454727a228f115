"""Connections to each broker, counted from librdkafka's statistics (issue 49: counters
for broker connections up and down, so a dashboard shows an outage as connections lost
and regained, not as silence).

librdkafka sends a JSON document every `statistics.interval.ms` (STATS_INTERVAL_MS,
through the `stats_cb` of the worker's consumer, served by its poll): per broker its
`state` ("UP", "DOWN", "CONNECT", ...) and its cumulative `connects` and
`disconnects` since the client started. This turns successive documents into the
increments since the last one and the number of brokers up now. Brokers of `source`
"internal" (librdkafka's own placeholder) are left out.

Pure: no client, no clock; the caller feeds each document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STATS_INTERVAL_MS = 5000


@dataclass(frozen=True)
class ConnectionDelta:
    connects: int  # connections made since the previous document
    disconnects: int  # connections lost since the previous document
    up: int  # brokers whose connection is up now
    known: int  # brokers librdkafka knows


@dataclass
class BrokerConnections:
    _last: dict[str, tuple[int, int]] = field(default_factory=dict)

    def update(self, stats: Mapping[str, Any]) -> ConnectionDelta:
        connects = disconnects = up = known = 0
        seen: dict[str, tuple[int, int]] = {}
        for name, broker in (stats.get("brokers") or {}).items():
            if broker.get("source") == "internal":
                continue
            known += 1
            up += broker.get("state") == "UP"
            now = (int(broker.get("connects", 0)), int(broker.get("disconnects", 0)))
            before = self._last.get(name, (0, 0))
            # A broker forgotten and learned again restarts its counts: no negative step.
            connects += max(now[0] - before[0], 0)
            disconnects += max(now[1] - before[1], 0)
            seen[name] = now
        self._last = seen
        return ConnectionDelta(connects, disconnects, up, known)
