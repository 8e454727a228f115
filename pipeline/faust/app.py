"""Setting up a Faust app for tidebatch batching: broker profile (Faust settings and the
embedded broker's fetch wait) and where tidebatch's own metrics appear.

faust-streaming is an optional dependency (the ``[faust]`` extra): it is imported only
inside these functions, make_app() first (pipeline/extras.py: one line naming the extra
when it is missing).
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from consumers.client_settings import KafkaBlock
from consumers.profiles import EMBEDDED, FAUST_FETCH_MAX_WAIT_MS, faust_app_settings
from consumers.secret_values import scrub_log_records
from pipeline.config.kafka_keys import DELIVERY_MODES
from pipeline.extras import load
from pipeline.faust.kafka_settings import describe, faust_kafka_settings
from pipeline.faust.sasl_logs import hide_sasl_tokens

log = logging.getLogger(__name__)

METRICS_PATH = "/tidebatch/metrics/"


def make_app(
    app_id: str, broker: str, *, profile: str = "kafka", kafka: KafkaBlock | None = None, **settings: Any
) -> Any:
    """``faust.App`` with the broker profile's settings (consumers/profiles.py), then the
    `kafka:` block's (pipeline/faust/kafka_settings.py: SASL/TLS credentials, client id,
    tunables; UserError for what Faust cannot honour), then explicit ``settings``; and,
    for the embedded broker, its fetch-wait transport."""
    faust = load("faust", "faust")
    # `faust worker` logs through its own handlers, not pipeline/observe/logs.py's: mask the
    # secrets resolved below in every record's message there too.
    scrub_log_records()
    from_block = faust_kafka_settings(kafka) if kafka is not None else {}
    app = faust.App(app_id, broker=broker, **faust_app_settings(profile, {**from_block, **settings}))
    use_broker_profile(app, profile)
    if "broker_credentials" in from_block:
        hide_sasl_tokens()  # aiokafka's debug lines would show the login (sasl_logs.py)
    if from_block:
        line = describe(from_block)  # no secret: credentials by kind and mechanism only

        async def log_kafka_settings() -> None:
            # A task, not at import: `faust worker` sets logging up after importing the app.
            log.info("faust kafka settings: %s", line)

        app.task(log_kafka_settings)
    return app


# tidebatch's `delivery` key (pipeline/config/kafka_keys.py) -> Faust's processing_guarantee. Faust
# accepts both values; only at_least_once is given to it (processing_guarantee()).
PROCESSING_GUARANTEE = {"at_least_once": "at_least_once", "exactly_once": "exactly_once"}

EMBEDDED_NO_EXACTLY_ONCE = (
    "TIDEBATCH_FAUST_DELIVERY=exactly_once needs Apache Kafka: the embedded broker (Tansu) "
    "shows aborted transactions to read_committed readers (docs/BROKERS.md)"
)
FAUST_NO_EXACTLY_ONCE = (
    "TIDEBATCH_FAUST_DELIVERY=exactly_once is refused: faust-streaming 0.15.3 sends this app's "
    "results outside its transactions, so a crash still duplicates them "
    "(examples/faust_ctr/README.md, 'Exactly-once'); use `tidebatch run --delivery exactly_once`"
)


def processing_guarantee(delivery: str, profile: str) -> str:
    """Faust's ``processing_guarantee`` for tidebatch's ``delivery`` value. Raises
    ValueError (one line) for an unknown value and for exactly_once: on the embedded
    broker because Tansu's read_committed readers see aborted transactions, on Apache
    Kafka because Faust's transactions do not cover what a tidebatch agent sends
    (examples/faust_ctr/README.md, "Exactly-once")."""
    if delivery not in DELIVERY_MODES:
        raise ValueError(
            f"TIDEBATCH_FAUST_DELIVERY={delivery!r} is not one of {', '.join(DELIVERY_MODES)}"
        )
    if delivery == "exactly_once":
        raise ValueError(EMBEDDED_NO_EXACTLY_ONCE if profile == EMBEDDED else FAUST_NO_EXACTLY_ONCE)
    return PROCESSING_GUARANTEE[delivery]


def use_broker_profile(app: Any, profile: str) -> None:
    """Install what Faust settings cannot express. Must run before the app first
    touches its transport (i.e. right after creating it, before declaring agents'
    topics is fine: Faust builds the transport lazily)."""
    wait_ms = FAUST_FETCH_MAX_WAIT_MS[profile]
    if wait_ms is None:
        return
    transport_cls = _fetch_wait_transport(wait_ms)
    app.transport = transport_cls(app.conf.broker_consumer, app)
    log.info("faust consumer fetch_max_wait_ms=%d (broker profile %s)", wait_ms, profile)


@cache
def _fetch_wait_transport(fetch_max_wait_ms: int) -> type:
    """Faust's aiokafka transport with the consumer's fetch_max_wait_ms replaced (Faust
    passes a hard-coded 1500 ms; aiokafka reads the attribute when it starts)."""
    from faust.transport.drivers import aiokafka as driver

    class ConsumerThread(driver.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

    class Consumer(driver.Consumer):
        def _new_consumer_thread(self) -> Any:
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class Transport(driver.Transport):
        pass

    Transport.Consumer = Consumer
    return Transport


def add_metrics_page(app: Any, registry: CollectorRegistry, path: str = METRICS_PATH) -> None:
    """Serve ``registry`` in the Prometheus text format on the app's own web server
    (next to Faust's pages: /, /stats/, /graph/ ...). Not /metrics: Faust's
    PrometheusMonitor takes that path when an app enables it."""

    @app.page(path)
    async def tidebatch_metrics(web: Any, request: Any) -> Any:
        # aiohttp refuses a charset inside content_type=, so pass the header whole.
        return web.bytes(generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> None:
    """Serve ``registry`` on its own port (/metrics), as `tidebatch run` does."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=host, registry=registry)
    log.info("tidebatch metrics on http://%s:%d/metrics", host, port)
