"""Which of a client's brokers refuse connections, from librdkafka's log lines, so one
broker down among answering ones is not reported as "no broker answered".

librdkafka says "Connect to ... failed: Connection refused" per broker, and
_ALL_BROKERS_DOWN only when every broker it knows is down. A worker whose cluster lost
one node of three logged "Kafka broker unreachable at A,B,C: no broker answered" for
that one refusal (issue 44). Here each refusal is kept per broker address: the verdict
is "none answers" only when every known broker has refused (or librdkafka said all
are down), else "this broker is down".

Pure: the caller passes the time. consumers/client_logs.py feeds it; no line is
written here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A refusal counts as the broker's state this long. librdkafka retries a refused
# broker at least every reconnect.backoff.max.ms (10 s by default), so a broker still
# down is refused again within it; one that stopped refusing came back.
STALE_S = 15.0


def addresses(bootstrap: str) -> list[str]:
    """host:port of each entry of a bootstrap.servers list (a `proto://` prefix dropped)."""
    out = []
    for entry in bootstrap.split(","):
        entry = entry.strip()
        if "://" in entry:
            entry = entry.split("://", 1)[1]
        if entry:
            out.append(entry)
    return out


@dataclass
class BrokerStates:
    """Per address: when it last refused a connection and when it last answered."""

    bootstrap: str
    stale_s: float = STALE_S
    _refused: dict[str, float] = field(default_factory=dict)
    _answered: dict[str, float] = field(default_factory=dict)
    _all_down_at: float | None = None

    @property
    def known(self) -> list[str]:
        """The bootstrap addresses, then those learned from the cluster's metadata."""
        seen = addresses(self.bootstrap)
        return seen + [a for a in [*self._refused, *self._answered] if a not in seen]

    def refused(self, address: str, now: float) -> None:
        self._refused[address] = now

    def answered(self, address: str, now: float) -> None:
        """A broker answered (metadata, or a TLS or SASL handshake: it is listening)."""
        self._answered[address] = now
        self._all_down_at = None

    def all_down(self, now: float) -> None:
        """librdkafka's _ALL_BROKERS_DOWN: the client that says it knows no broker
        that is up. Not the last word: a client that has so far tried only the dead
        broker of two says "1/1 brokers are down" while the other answers (measured,
        tests/integration/test_kafka_unreachable.py)."""
        self._all_down_at = now

    def _down(self, address: str, now: float) -> bool:
        at = self._refused.get(address)
        if at is None or now - at >= self.stale_s:
            return False
        return self._answered.get(address, float("-inf")) <= at

    def none_answers(self, now: float) -> bool:
        """True when no broker can be answering: every known broker refused within
        stale_s and none answered since, or librdkafka said all are down and no
        broker's answer is newer than its last refusal."""
        if all(self._down(a, now) for a in self.known):
            return True
        recent = self._all_down_at is not None and now - self._all_down_at < self.stale_s
        return recent and not any(self._answering(a, now) for a in self._answered)

    def _answering(self, address: str, now: float) -> bool:
        return self._answered[address] > self._refused.get(address, float("-inf")) and not self._down(address, now)

    def others_answer(self, address: str, now: float) -> bool:
        """True when another broker answered and has not refused since."""
        return any(a != address and self._answering(a, now) for a in self._answered)
