"""CTR scoring inside a Faust app, with tidebatch's adaptive batches -- or any other
pipeline's, your own model's included: TIDEBATCH_FAUST_CONFIG names a worker config, whose
`pipeline` (a shipped one or an entry of its `pipelines:`) the app serves with that
entry's model and codec, as `tidebatch run -c` would (README.md, "Your own model").

    TIDEBATCH_FAUST_BROKER=kafka://127.0.0.1:9092 faust -A examples.faust_ctr.app worker -l info

Run from the repository root (Faust imports the app module from the working directory).
Every setting is an environment variable (TIDEBATCH_FAUST_<NAME>, defaults below);
examples/faust_ctr/README.md explains them; the Kafka client settings (SASL/TLS)
are the worker's `kafka:` block (TIDEBATCH_FAUST_CONFIG, TIDEBATCH_KAFKA__*). Faust's
own worker flags still apply (``--web-port``, ``--datadir``, ``-l``). ``TIDEBATCH_FAUST_DELIVERY`` takes tidebatch's
``delivery`` values; only at_least_once runs (README.md, "Exactly-once").
"""

from __future__ import annotations

import logging
import os
from functools import cache

from mode import CrashingSupervisor, OneForOneSupervisor

from pipeline.errors import UserError
from pipeline.faust.app import add_metrics_page, make_app, processing_guarantee, serve_metrics
from pipeline.faust.batching import BatchMetrics, adaptive_batches
from pipeline.faust.inference import BatchScorer, served_config
from pipeline.faust.kafka_settings import load_kafka_block
from pipeline.registry.pipelines import pipeline_for

log = logging.getLogger(__name__)


def _env(name: str, default: str) -> str:
    return os.environ.get(f"TIDEBATCH_FAUST_{name}", default)


# A worker config file: its `pipeline` and `pipelines:` (the pipeline served, its model
# and codec, its topics), its `kafka:` block (SASL/TLS, client.id, ...), with
# TIDEBATCH_KAFKA__<BLOCK>__<KEY> on top as `tidebatch run` reads them, and its
# `tenants:` section (tenant classes: shares, ceilings, SLAs; docs/BATCHING.md).
CONFIG = _env("CONFIG", "")
# The pipeline served: a shipped one or an entry of CONFIG's `pipelines:` (default: the
# config's `pipeline`, else ctr).
PIPELINE = _env("PIPELINE", "")
try:
    SERVED = served_config(CONFIG or None, PIPELINE or None)
    SPEC = pipeline_for(SERVED)  # as the worker resolves it (pipeline/app/compose.py)
except UserError as exc:  # one line naming the setting (never a secret's value)
    raise SystemExit(str(exc)) from None

BROKER = _env("BROKER", "kafka://127.0.0.1:9092")
BROKER_PROFILE = _env("BROKER_PROFILE", "kafka")  # "embedded" for `tidebatch broker` (Tansu)
APP_ID = _env("APP_ID", f"tidebatch-faust-{SPEC.name}")  # also the consumer group id
# Topics: the config's, else the pipeline's (ctr.requests -> ctr.scores), as the worker's.
INPUT_TOPIC = _env("INPUT", SERVED.input_topic or SPEC.input_topic)
OUTPUT_TOPIC = _env("OUTPUT", SERVED.output_topic or SPEC.output_topic)
DLQ_TOPIC = _env("DLQ", SERVED.dlq_topic or f"{INPUT_TOPIC}.dlq")
LATE_TOPIC = _env("LATE", SERVED.late_topic or f"{INPUT_TOPIC}.late")  # records shed over a tenant class's ceiling
POLICY = _env("POLICY", "adaptive")
SLO_MS = float(_env("SLO_MS", "100"))
# Default: the config's batching.max_batch_rows, else the pipeline's (512 for ctr), as the worker's.
MAX_BATCH_ROWS = int(_env("MAX_BATCH_ROWS", str(SERVED.batching.max_batch_rows or SPEC.max_batch_rows)))
MAX_QUEUE_DELAY_MS = float(_env("MAX_QUEUE_DELAY_MS", "10"))  # the static policy's linger
PROVIDERS = _env("PROVIDERS", "auto")
# Python's GIL switch interval; empty keeps the interpreter's 5 ms (faster here than
# the worker's 0.5 ms: see BatchScorer).
GIL_SWITCH_INTERVAL_MS = _env("GIL_SWITCH_INTERVAL_MS", "")
CONCURRENCY = int(_env("CONCURRENCY", "1"))  # agent instances: one batcher + one stream each
METRICS_PORT = _env("METRICS_PORT", "")  # empty: only on the Faust web server
# What a batch body that raises does: "crash" stops the worker (exit code != 0) so the
# process supervisor restarts it and Kafka replays the unacked batch at once -- the
# worker's rule for a result it cannot deliver; "restart" lets Faust restart the agent
# and go on, with the commits held at the failed batch until the next restart or
# rebalance replays it.
ON_ERROR = _env("ON_ERROR", "crash")
# Fault injection for the at-least-once test: the first batch body raises once.
FAIL_FIRST_BATCH = _env("FAIL_FIRST_BATCH", "") not in ("", "0", "false")
# tidebatch's `delivery` key (at_least_once | exactly_once) -> Faust's processing_guarantee.
DELIVERY = _env("DELIVERY", "at_least_once")
try:
    PROCESSING_GUARANTEE = processing_guarantee(DELIVERY, BROKER_PROFILE)
except ValueError as exc:
    raise SystemExit(str(exc)) from None

# web_metrics_enabled: Faust's own /performance/ page (its sensors: events, lag, ...).
try:
    app = make_app(
        APP_ID, BROKER, profile=BROKER_PROFILE, kafka=load_kafka_block(CONFIG or None),
        web_metrics_enabled=True, processing_guarantee=PROCESSING_GUARANTEE,
    )
    TENANTS = SERVED.tenants if CONFIG else None
except UserError as exc:  # one line naming the setting (never a secret's value)
    raise SystemExit(str(exc)) from None
_raw = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
requests_topic = app.topic(INPUT_TOPIC, **_raw)
results_topic = app.topic(OUTPUT_TOPIC, **_raw)
dlq_topic = app.topic(DLQ_TOPIC, **_raw)
late_topic = app.topic(LATE_TOPIC, **_raw)

metrics = BatchMetrics(SPEC.name, POLICY)
add_metrics_page(app, metrics.registry)  # http://<web host>:<web port>/tidebatch/metrics/
_failed_once = False


@cache
def scorer() -> BatchScorer:
    # Loaded on first use, in the worker: `faust ... --help` stays instant.
    return BatchScorer(
        config=SERVED,  # the served pipeline's model and codec, with the config's `codec:`
        providers=PROVIDERS,
        gil_switch_interval_ms=float(GIL_SWITCH_INTERVAL_MS) if GIL_SWITCH_INTERVAL_MS else None,
        group_id=APP_ID,  # dead letters name it (Kafka Connect's connector.name)
        carry_headers=SERVED.result_headers,  # the request headers results carry, as the worker's
    )


@app.task
async def start_metrics_server() -> None:
    if METRICS_PORT:
        serve_metrics(metrics.registry, int(METRICS_PORT))


if ON_ERROR not in ("crash", "restart"):
    raise SystemExit(f"TIDEBATCH_FAUST_ON_ERROR must be crash or restart, not {ON_ERROR!r}")
_supervisor = CrashingSupervisor if ON_ERROR == "crash" else OneForOneSupervisor


@app.agent(requests_topic, concurrency=CONCURRENCY, supervisor_strategy=_supervisor)
async def score_ctr(stream):  # a faust Stream of the raw request events
    global _failed_once
    s = scorer()
    batches = adaptive_batches(
        stream,
        policy=POLICY,
        slo_ms=SLO_MS,
        max_batch_rows=MAX_BATCH_ROWS,
        max_queue_delay_ms=MAX_QUEUE_DELAY_MS,
        prepare=s.decode,  # rows, priority and deadline_ms come from the decoded request
        cost_model=s.cost_model(),
        metrics=metrics,
        tenants=TENANTS,  # tenant ids from the decoded request's `tenant`
    )
    async for batch in batches:
        if FAIL_FIRST_BATCH and not _failed_once and batch.items:
            _failed_once = True
            ids = ",".join(d.request_id for d in batch.prepared)
            log.error("injected failure: batch of %d events not processed: %s", len(batch), ids)
            raise RuntimeError("injected failure (TIDEBATCH_FAUST_FAIL_FIRST_BATCH)")
        await s.score_and_send(batch, results_topic, dlq_topic=dlq_topic, late_topic=late_topic)
