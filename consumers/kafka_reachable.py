"""Before a command starts its Kafka clients: does a broker answer, and does it let
us in? One line and a bounded wait instead of a retry storm.

librdkafka retries an unreachable broker, a wrong password or an untrusted certificate
for ever. A worker doing that sits alive and unready, and `tidebatch produce` waited
25 s and gave no reason. So `tidebatch run`, `produce` and `etl --topic` first ask for
cluster metadata here: they go on once a broker answers, stop at once on an
authentication or TLS failure (retrying cannot fix either, and every retry is one more
failed login on the broker), and stop after `timeout_s` when no broker answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from consumers.broker_states import addresses
from consumers.client_logs import shared_log
from consumers.kafka_failures import (
    TLS,
    TLS_HOSTNAME,
    UNREACHABLE,
    KafkaFailure,
    broker_of,
    failure_line,
)
from consumers.profiles import admin_config
from consumers.tls_check import hostname_mismatch
from pipeline.errors import UserError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
# One metadata request at a time, so a broker coming up is noticed within this.
_ATTEMPT_S = 1.0


class KafkaUnavailable(UserError):
    """No broker answered in time, or one refused us: its message is the one line."""


def require_kafka(
    bootstrap_servers: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    config: Mapping[str, Any] | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    make_admin: Callable[[dict[str, Any]], Any] = AdminClient,
    check_hostname: Callable[[str, Mapping[str, Any]], str | None] = hostname_mismatch,
) -> None:
    """Return once a broker at `bootstrap_servers` answers a metadata request; raise
    KafkaUnavailable with the one line otherwise (see the module doc). `config`:
    client settings (security) as the command's own clients get them.
    `check_hostname`: tells a hostname mismatch from an untrusted CA (consumers/tls_check.py)."""
    failures: list[KafkaFailure] = []
    settings = connection_settings(config)
    try:
        admin = make_admin(admin_config(bootstrap_servers, settings, failures.append))
    except KafkaException as exc:  # a setting librdkafka refuses: its one line, no traceback
        err = exc.args[0] if exc.args else exc
        raise KafkaUnavailable(f"Kafka client settings refused: {err.str() if hasattr(err, 'str') else err}") from None
    deadline = clock() + timeout_s
    last = "no answer"
    waiting_said = False
    while True:
        try:
            # No topic argument: naming one would create it on the embedded broker.
            metadata = admin.list_topics(timeout=max(min(_ATTEMPT_S, deadline - clock()), 0.1))
            _note_answer(bootstrap_servers, metadata)
            return
        except KafkaException as exc:
            err = exc.args[0] if exc.args else exc
            last = err.str() if hasattr(err, "str") else str(err)
        # Serves the error events (and logs) that say why: auth, TLS, refused. Those
        # are ours to say (the client logs them at DEBUG): once, as the error.
        admin.poll(0.2)
        refused = next((f for f in failures if f.fatal_at_start), None)
        if refused is not None:
            raise KafkaUnavailable(_tls_named(refused, bootstrap_servers, settings, check_hostname))
        if clock() >= deadline:
            raise KafkaUnavailable(_give_up_line(bootstrap_servers, timeout_s, failures, last))
        if not waiting_said and any(f.kind == UNREACHABLE for f in failures):
            # Why the command sits still; the reason comes in the error if it gives up.
            log.warning("no Kafka broker at %s answers yet; retrying for up to %g s", bootstrap_servers, timeout_s)
            waiting_said = True


def _tls_named(
    failure: KafkaFailure, bootstrap: str, settings: Mapping[str, Any],
    check_hostname: Callable[[str, Mapping[str, Any]], str | None],
) -> str:
    """The line of a refusal; a failed certificate verification is looked at once more:
    librdkafka words a hostname mismatch like an untrusted CA (consumers/tls_check.py)."""
    if failure.kind != TLS or "certificate verify failed" not in failure.line:
        return failure.line
    broker = failure.broker or addresses(bootstrap)[0]
    words = check_hostname(broker, settings)
    if words is None:
        return failure.line
    return failure_line(TLS_HOSTNAME, bootstrap, f"{broker}/bootstrap: {words}")


def _note_answer(bootstrap: str, metadata: Any) -> None:
    """Tell the process's Kafka log which brokers answer: the one that answered and
    those its metadata lists as registered. A later refusal by one of them then reads
    "that broker is down, the others answer" (consumers/broker_states.py)."""
    name = getattr(metadata, "orig_broker_name", None)
    answered = [broker_of(f"{name}: ")] if isinstance(name, str) else []
    answered += [f"{b.host}:{b.port}" for b in (getattr(metadata, "brokers", None) or {}).values()]
    if not any(answered) and len(addresses(bootstrap)) == 1:
        answered = addresses(bootstrap)
    for broker in {b for b in answered if b}:
        shared_log().answered(bootstrap, broker)


# What decides whether a client gets in: address family, DNS, TLS and SASL. Taken
# from a consumer's or producer's settings, the rest of which an admin client would
# only warn about. enable.sasl.* and enable.ssl.* switch the OAUTHBEARER unsecured
# token and certificate checks on or off (tests/integration/test_kafka_mtls_oauth.py).
_CONNECTION_PREFIXES = (
    "security.", "sasl.", "ssl.", "ssl_", "oauth_cb", "socket.", "broker.address.", "client.dns.",
    "enable.sasl.", "enable.ssl.",
)


def connection_settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings of `config` that decide how a client connects and logs in."""
    return {k: v for k, v in (config or {}).items() if k.startswith(_CONNECTION_PREFIXES)}


def _give_up_line(bootstrap: str, timeout_s: float, failures: list[KafkaFailure], last: str) -> str:
    """The last thing librdkafka said about the broker, else the metadata error."""
    unreachable = [f for f in failures if f.kind == UNREACHABLE]
    # "Connect to ... failed: Connection refused" says more than "1/1 brokers are down".
    seen = next((f for f in reversed(unreachable) if "brokers are down" not in f.line), None)
    seen = seen or (unreachable[-1] if unreachable else None)
    line = seen.line if seen is not None else failure_line(UNREACHABLE, bootstrap, last)
    return f"{line}; gave up after {timeout_s:g} s"
