"""SASL credentials that change under a running worker: a password rotated on the broker.

A broker with `connections.max.reauth.ms` makes every connection log in again before
its session ends (KIP-368; librdkafka >= 2.2 does it on the same connection). Once an
operator has changed the user's SCRAM password there, the next login of every live
client fails, and librdkafka retries it for ever with the old password: the worker
sat alive, warning, its requests waiting. So the worker's consumer and producer report
their failures here (consumers/client_logs.py `wired(on_failure=...)`), and the source
loop calls `check()` on every turn:

- after an authentication failure, each role's settings are resolved again from the
  `kafka:` block (consumers/client_settings.py `settings_for`): its `@file:/path` and
  `${ENV}` references stay in the block (pipeline/config/sections.py KafkaOverrides), so a
  rewritten file gives the new password;
- a changed sasl.username/sasl.password goes to that role's live clients
  (`set_sasl_credentials`, librdkafka's rd_kafka_sasl_set_credentials: the next login
  uses it, no connection is dropped, no request is lost);
- an unchanged one, or a new one refused too, stops the worker with one line
  (KafkaRefused: pipeline/worker/core.py commits only what is done and exits 1).

Only PLAIN and SCRAM logins take a username and password that librdkafka can replace;
anything else (TLS only, GSSAPI, OAUTHBEARER) gets no refresh (`refresh_for` says None).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from consumers.client_settings import KafkaBlock, is_reference, settings_for
from consumers.kafka_failures import AUTHENTICATION, KafkaFailure
from consumers.records import KafkaRefused
from pipeline.errors import UserError

log = logging.getLogger(__name__)

CREDENTIAL_KEYS: tuple[str, str] = ("sasl.username", "sasl.password")
_REPLACEABLE_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# After new credentials were handed over, logins that had begun with the old ones may
# still report their failure: librdkafka serves error events in a later poll. A failure
# within this long of the hand-over is one of those; a later one means the new
# credentials were refused too (librdkafka retries a refused login at least every
# reconnect.backoff.max.ms, 10 s by default, so one comes).
SETTLE_S = 5.0
# A refusal this long after a hand-over is a later rotation the file did not follow,
# not the handed-over credentials refused (those are retried within seconds).
REFUSED_TOO_S = 60.0

Credentials = tuple[object, object]


class SaslClient(Protocol):
    """A live client whose login can change (consumers/confluent_backend.py)."""

    def set_sasl_credentials(self, username: str, password: str) -> None: ...


def replaceable(settings: Mapping[str, object]) -> bool:
    """True when `settings` log in with a username and password librdkafka can replace."""
    protocol = str(settings.get("security.protocol", "PLAINTEXT")).upper()
    mechanism = str(settings.get("sasl.mechanism", settings.get("sasl.mechanisms", "GSSAPI"))).upper()
    return protocol.startswith("SASL") and mechanism in _REPLACEABLE_MECHANISMS


class CredentialRefresh:
    """The worker's live clients by role and the credentials each was given; see the
    module doc. `heard` is the clients' failure callback (any thread); `check` runs
    in the source thread. `clock` is monotonic seconds (a fake one in tests)."""

    def __init__(
        self,
        kafka: KafkaBlock,
        bootstrap: str,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        settle_s: float = SETTLE_S,
        hand_over: bool = True,
    ) -> None:
        self._kafka = kafka
        self._hand_over = hand_over
        self._bootstrap = bootstrap
        self._environ = environ
        self._clock = clock
        self._settle_s = settle_s
        self._clients: dict[str, list[SaslClient]] = {}
        self._given: dict[str, Credentials] = {}
        self._refused = threading.Event()
        self._handed_over_at: float | None = None

    def heard(self, failure: KafkaFailure) -> None:
        """A client's failure (consumers/client_logs.py): only logins matter here."""
        if failure.kind == AUTHENTICATION:
            self._refused.set()

    def attach(self, role: str, client: SaslClient, settings: Mapping[str, object]) -> None:
        """`client` (of `role`: consumer, producer or admin) was made with `settings`
        (the resolved ones it logs in with)."""
        self._given.setdefault(role, (settings.get(CREDENTIAL_KEYS[0]), settings.get(CREDENTIAL_KEYS[1])))
        self._clients.setdefault(role, []).append(client)

    def check(self) -> None:
        """After a refused login: hand changed credentials to the live clients, or raise
        KafkaRefused with the one line when nothing changed (module doc)."""
        if not self._refused.is_set():
            return
        self._refused.clear()
        now = self._clock()
        changed = []
        for role, clients in self._clients.items():
            creds = self._credentials(role)
            if creds == self._given[role]:
                continue
            if not self._hand_over:
                raise KafkaRefused(
                    f"{self._prefix()}: the new ones are there ({self._sources()} re-read), but a "
                    "delivery exactly_once worker does not change them while running; its restart reads them"
                )
            username, password = (str(v) if v is not None else "" for v in creds)
            for client in clients:
                client.set_sasl_credentials(username, password)
            self._given[role] = creds
            changed.append(role)
        if changed:
            self._handed_over_at = now
            log.warning(
                "Kafka refused a login at %s and the credentials changed (%s re-read): the %s now log in "
                "with the new ones", self._bootstrap, self._sources(), " and ".join(sorted(changed)),
            )
            return
        since = None if self._handed_over_at is None else now - self._handed_over_at
        if since is not None and since < self._settle_s:
            return  # a login begun with the old credentials (SETTLE_S)
        raise KafkaRefused(self._line(refused_too=since is not None and since < REFUSED_TOO_S))

    def _credentials(self, role: str) -> Credentials:
        try:
            settings = settings_for(self._kafka, role, self._environ)
        except UserError as exc:  # the file went away: its one line, never a value
            raise KafkaRefused(f"{self._prefix()}: {exc}") from None
        return settings.get(CREDENTIAL_KEYS[0]), settings.get(CREDENTIAL_KEYS[1])

    def _prefix(self) -> str:
        return f"Kafka authentication failed at {self._bootstrap} after the credentials changed on the broker"

    def _line(self, refused_too: bool) -> str:
        again = "the new ones were refused too" if refused_too else "they have not changed here"
        return (
            f"{self._prefix()}: {again} ({self._sources()} re-read); "
            "write the new password where the kafka: block reads it, or restart with it"
        )

    def _sources(self) -> str:
        """Where the credentials come from, for the line: references only, never a value."""
        merged: dict[str, object] = {}
        for role in self._clients:
            merged.update({k: v for k, v in {**self._kafka.common, **getattr(self._kafka, role)}.items()
                           if k in CREDENTIAL_KEYS})
        refs = [f"{k} from {v}" for k, v in merged.items() if is_reference(v)]
        return ", ".join(refs) if refs else "sasl.username and sasl.password, given as values"


def refresh_for(
    kafka: KafkaBlock, bootstrap: str, roles: tuple[str, ...] = ("consumer", "producer"), *, hand_over: bool = True
) -> CredentialRefresh | None:
    """A CredentialRefresh for clients of `roles` configured by `kafka`, or None when
    none of them logs in with a replaceable username and password. `hand_over` False:
    changed credentials stop the worker too (see kafka_backend.credential_refresh)."""
    if not any(replaceable(settings_for(kafka, role)) for role in roles):
        return None
    return CredentialRefresh(kafka, bootstrap, hand_over=hand_over)
