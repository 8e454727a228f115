"""Size limits where a message enters and where it leaves (pure).

A record Kafka refuses is a request without an outcome, and a worker that stops on one
stops again on the same record after every restart. So the worker knows, at start, the
largest record each of its outgoing topics takes -- the lower of its producer's
`message.max.bytes` and the topic's `max.message.bytes` where the broker describes it
(consumers/admin.py) -- and checks every record against it before sending: a request
over the entry limit is dead-lettered before decoding, a result over the output
topic's limit becomes that request's dead letter, and a dead-letter copy over the
dead-letter topic's limit is cut down (consumers/dead_letter.py). The entry limit
stays below the dead-letter topic's, so every request that is decoded can be
dead-lettered whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Room in a dead-letter record for our own headers: a reason of at most 1000 bytes
# twice (tidebatch.error and Connect's exception.message), the stage, the source topic,
# partition, offset and timestamp twice, group, member, classes and a stack trace of
# at most 2000 bytes (consumers/dead_letter.py; ~6 KB at worst, a unit test adds it up).
DEAD_LETTER_HEADROOM_BYTES = 8192


@dataclass(frozen=True)
class Limits:
    request_bytes: int  # the largest request record (key + value + headers) decoded
    topic_bytes: Mapping[str, int]  # outgoing topic -> the largest record it takes
    producer_bytes: int  # the producer's own limit, for topics not in topic_bytes
    prefix_bytes: int  # value bytes kept by a cut-down dead-letter or late copy

    def for_topic(self, topic: str) -> int:
        return self.topic_bytes.get(topic, self.producer_bytes)


def resolve_limits(
    *,
    requested_request_bytes: int,
    producer_bytes: int,
    described: Mapping[str, int],
    outgoing: tuple[str, ...],
    dead_letter_topic: str,
    prefix_bytes: int,
) -> tuple[Limits, list[str]]:
    """The worker's limits, and a warning for each configured value that had to be
    lowered to fit. `described` holds the topics' max.message.bytes as the broker
    reports them (absent: unknown, e.g. on a broker without such a limit)."""
    topic_bytes = {t: min(producer_bytes, described[t]) if t in described else producer_bytes for t in outgoing}
    warnings: list[str] = []
    ceiling = topic_bytes.get(dead_letter_topic, producer_bytes) - DEAD_LETTER_HEADROOM_BYTES
    request_bytes = requested_request_bytes
    if request_bytes > ceiling:
        warnings.append(
            f"limits.max_request_bytes {requested_request_bytes} is above what dead-letter topic "
            f"{dead_letter_topic} takes ({ceiling + DEAD_LETTER_HEADROOM_BYTES} bytes a record): "
            f"using {ceiling}"
        )
        request_bytes = max(ceiling, 0)
    return Limits(request_bytes, topic_bytes, producer_bytes, prefix_bytes), warnings
