"""The one place in pipeline/ that builds Kafka clients (tests/unit/test_client_factory.py
holds every other module to it). The worker's source and producer by the config key
`client`: confluent-kafka (librdkafka, the default) or kafka-python (pure Python). For
the commands, one function per client role, confluent-kafka only:

- `load_producer`: a plain producer sending load (`produce`, the demo);
- `plain_consumer`: the profile's consumer, which commits nothing (auto commit is off):
  a metadata look-up (`dlq`), or a reader that subscribes (the demo's result reader);
- `range_reader`: assigned partitions read between fixed offsets, no group membership,
  nothing committed (`etl --topic`, `dlq inspect|replay`);
- `confluent_producer`, `confluent_source`: the clients of consumers/records.py's
  protocols, for the worker, `generate` and `dlq replay`.

Each takes the broker profile, the bootstrap servers and the role's `kafka:` settings as
`KafkaOverrides.client(role)` gives them (consumers/client_settings.py: common, then the
role's own, secrets resolved); consumers/profiles.py makes the librdkafka settings. A
client librdkafka refuses to make (an unknown setting, a bad value) is one line. Admin
clients are consumers/admin.py's and consumers/kafka_reachable.py's, given the `admin`
settings."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import Producer as ConfluentKafkaProducer

from consumers.credential_refresh import CredentialRefresh, refresh_for
from consumers.kafka_python_settings import kafka_python_settings
from consumers.profiles import (
    consumer_config,
    kafka_python_consumer_config,
    kafka_python_producer_config,
    large_message_overrides,
    producer_config,
)
from consumers.records import Producer, Source, TopicPartition
from pipeline.config import WorkerConfig
from pipeline.errors import UserError
from pipeline.extras import load
from pipeline.registry.pipelines import pipeline_for

log = logging.getLogger(__name__)

# The confluent-kafka clients the role functions return, for type hints elsewhere: only
# this module makes them.
ConsumerClient = Consumer
ProducerClient = ConfluentKafkaProducer
Settings = Mapping[str, Any] | None
Rebalance = Callable[[list[TopicPartition]], None]
_Client = TypeVar("_Client")


def _built(kind: str, bootstrap: str, make: Callable[[], _Client]) -> _Client:
    try:
        return make()
    except KafkaException as exc:
        raise UserError(f"cannot create a Kafka {kind} for {bootstrap}: {exc}") from None


def load_producer(profile: str, bootstrap: str, settings: Settings = None, max_message_bytes: int | None = None) -> ProducerClient:
    """The profile's producer (idempotent, lz4, batched), for sending load.
    max_message_bytes: values up to this size (consumers/profiles.py large_message_overrides)."""
    large = large_message_overrides(max_message_bytes).producer if max_message_bytes else {}
    conf = producer_config(profile, bootstrap, {**large, **(settings or {})})
    return _built("producer", bootstrap, lambda: ConfluentKafkaProducer(conf))


def plain_consumer(profile: str, bootstrap: str, settings: Settings, group_id: str) -> ConsumerClient:
    """The profile's consumer: it joins `group_id` only if it subscribes, and commits
    nothing unless asked (the profile turns auto commit off)."""
    conf = consumer_config(profile, bootstrap, group_id, settings)
    return _built("consumer", bootstrap, lambda: Consumer(conf))


def range_reader(
    profile: str, bootstrap: str, settings: Settings, group_id: str, *, out_of_range_is_error: bool = False
) -> ConsumerClient:
    """A consumer for assign() only, so it never joins `group_id` and commits nothing,
    with the partition-EOF event on. out_of_range_is_error: an offset the broker calls
    out of range is an error event, not the profile's silent "earliest"
    (pipeline/etl/topic.py says why)."""
    conf = consumer_config(profile, bootstrap, group_id, settings)
    conf["enable.partition.eof"] = True
    if out_of_range_is_error:
        conf["auto.offset.reset"] = "error"
    return _built("consumer", bootstrap, lambda: Consumer(conf))


def confluent_source(
    profile: str, bootstrap: str, settings: Settings, group_id: str, topics: list[str],
    on_assign: Rebalance, on_revoke: Rebalance, on_stats: Callable[[str], None] | None = None,
    credentials: CredentialRefresh | None = None,
) -> Source:
    """A group member reading `topics` (consumers/confluent_backend.py ConfluentSource);
    on_stats and credentials as for make_source."""
    from consumers.confluent_backend import ConfluentSource

    conf = consumer_config(profile, bootstrap, group_id, settings, credentials.heard if credentials else None)
    source = _built("consumer", bootstrap, lambda: ConfluentSource(conf, topics, on_assign, on_revoke, on_stats))
    if credentials is not None:
        credentials.attach("consumer", source, conf)
    return source


def confluent_producer(
    profile: str, bootstrap: str, settings: Settings, transactional: bool = False,
    credentials: CredentialRefresh | None = None,
) -> Producer:
    """The profile's producer (consumers/confluent_backend.py ConfluentProducer), or the
    transactional one: then `settings` hold its transactional.id. credentials as for
    make_producer."""
    from consumers.confluent_backend import ConfluentProducer, ConfluentTransactionalProducer

    conf = producer_config(profile, bootstrap, settings, credentials.heard if credentials else None)
    if transactional:
        log.info("transactional.id %s (delivery exactly_once)", conf["transactional.id"])
    kind = ConfluentTransactionalProducer if transactional else ConfluentProducer
    producer = _built("producer", bootstrap, lambda: kind(conf))
    if credentials is not None:
        credentials.attach("producer", producer, conf)
    return producer


def _large(cfg: WorkerConfig) -> Any:
    limit = pipeline_for(cfg).max_message_bytes
    return large_message_overrides(limit) if limit else None


# The rebalancing settings by client: librdkafka's names and kafka-python's keywords
# (kafka-python has no group_protocol or group_remote_assignor: its profile refuses
# them, naming the key).
_GROUP_KEYS: dict[str, tuple[str, str, str, str, str]] = {
    "confluent": ("group.protocol", "group.remote.assignor", "group.instance.id",
                  "session.timeout.ms", "heartbeat.interval.ms"),
    "kafka-python": ("group_protocol", "group_remote_assignor", "group_instance_id",
                     "session_timeout_ms", "heartbeat_interval_ms"),
}


def group_overrides(cfg: WorkerConfig, client: str) -> dict[str, Any]:
    """The rebalancing keys of `cfg` as client settings; only those that are set, so
    the profile's defaults stay otherwise."""
    protocol, assignor, instance, session, heartbeat = _GROUP_KEYS[client]
    wanted: dict[str, Any] = {
        protocol: cfg.group_protocol if cfg.group_protocol != "classic" else None,
        assignor: cfg.group_remote_assignor,
        instance: cfg.instance_id(),
        session: cfg.session_timeout_ms,
        # The clients' 3 s heartbeat would not fit in a short session timeout.
        heartbeat: max(cfg.session_timeout_ms // 6, 100) if cfg.session_timeout_ms else None,
    }
    return {k: v for k, v in wanted.items() if v is not None}


def make_source(
    cfg: WorkerConfig,
    group_id: str,
    topics: list[str],
    on_assign: Rebalance,
    on_revoke: Rebalance,
    on_stats: Callable[[str], None] | None = None,
    credentials: CredentialRefresh | None = None,
) -> Source:
    """on_stats: librdkafka's statistics JSON, periodically (confluent only).
    credentials: hears the consumer's refused logins and may change its password
    (consumers/credential_refresh.py, made by `credential_refresh`)."""
    if cfg.client == "confluent":
        large = _large(cfg)
        # exactly_once: never read records of an aborted or open transaction (upstream
        # producers' transactions too); librdkafka's default, made explicit.
        isolation = {"isolation.level": "read_committed"} if cfg.delivery == "exactly_once" else {}
        overrides = {
            **(large.consumer if large else {}), **group_overrides(cfg, "confluent"), **isolation, **cfg.kafka.client("consumer")
        }
        return confluent_source(cfg.broker_profile, cfg.bootstrap_servers, overrides, group_id, topics,
                                on_assign, on_revoke, on_stats, credentials)
    if cfg.client == "kafka-python":
        backend = kafka_python_backend()
        large = _large(cfg)
        overrides = {
            **(large.kafka_python_consumer if large else {}), **group_overrides(cfg, "kafka-python"),
            **kafka_python_settings(cfg.kafka.client("consumer")),
        }
        conf = kafka_python_consumer_config(cfg.broker_profile, cfg.bootstrap_servers, group_id, overrides)
        return backend.KafkaPythonSource(conf, topics, on_assign, on_revoke)
    raise UserError(f"unknown Kafka client {cfg.client!r}; use confluent or kafka-python")


def transactional_id(cfg: WorkerConfig, group_id: str) -> str:
    """delivery exactly_once: the configured id, else one from the static member id, so
    a restarted worker fences its killed predecessor and aborts its open transaction at
    once; else a random one (a killed worker's transaction then holds read_committed
    readers of its partitions back until transaction_timeout_ms)."""
    if cfg.transactional_id:
        return cfg.transactional_id
    instance = cfg.instance_id()
    if instance:
        return f"tidebatch.{group_id}.{instance}"
    return f"tidebatch.{group_id}.{uuid.uuid4().hex[:12]}"


def _exactly_once(cfg: WorkerConfig, group_id: str) -> dict[str, Any]:
    if cfg.delivery != "exactly_once":
        return {}
    return {"transactional.id": transactional_id(cfg, group_id), "transaction.timeout.ms": cfg.transaction_timeout_ms}


def credential_refresh(cfg: WorkerConfig) -> CredentialRefresh | None:
    """What lets a running worker follow a password rotated on the broker, for the
    confluent client with a PLAIN or SCRAM login (consumers/credential_refresh.py);
    None otherwise (kafka-python cannot change a live client's password)."""
    if cfg.client != "confluent":
        return None
    # exactly_once: stop, never hand over. A transactional worker given the new password
    # stood still for good in send_offsets_to_transaction (its main thread waiting in
    # librdkafka's rd_kafka_txn_op_req0), past its 30 s timeout and deaf to SIGTERM, in
    # 2 of 2 runs of tests/integration/test_kafka_rotation.py; this looks like
    # confluentinc/librdkafka#5456 (coordinator requests whose timeout is never checked).
    # Its restart fences the old producer, aborts its open transaction and reads the new
    # password.
    return refresh_for(cfg.kafka, cfg.bootstrap_servers, hand_over=cfg.delivery != "exactly_once")


def make_producer(
    cfg: WorkerConfig, group_id: str | None = None, credentials: CredentialRefresh | None = None
) -> Producer:
    """group_id: the worker's group, for the transactional.id with delivery exactly_once.
    credentials: as for make_source."""
    if cfg.client == "confluent":
        large = _large(cfg)
        txn = _exactly_once(cfg, group_id or f"tidebatch-{cfg.pipeline}")
        overrides = {**(large.producer if large else {}), **txn, **cfg.kafka.client("producer")}
        return confluent_producer(cfg.broker_profile, cfg.bootstrap_servers, overrides, bool(txn), credentials)
    if cfg.client == "kafka-python":
        backend = kafka_python_backend()
        large = _large(cfg)
        overrides = {
            **(large.kafka_python_producer if large else {}), **kafka_python_settings(cfg.kafka.client("producer"))
        }
        return backend.KafkaPythonProducer(kafka_python_producer_config(cfg.broker_profile, cfg.bootstrap_servers, overrides))
    raise UserError(f"unknown Kafka client {cfg.client!r}; use confluent or kafka-python")


def kafka_python_backend() -> ModuleType:
    """consumers/kafka_python_backend.py, or the one line naming the `kafka-python` extra
    when kafka-python is not installed (the confluent path never imports it)."""
    return load("consumers.kafka_python_backend", "kafka-python")
