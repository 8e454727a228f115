"""Worker configuration: one YAML file per deployment, every key overridable by an
environment variable, validated at start with errors that name the key.

Environment overrides: TIDEBATCH_<SECTION>__<KEY>=value (double underscore between
levels), e.g. TIDEBATCH_BATCHING__POLICY=static, TIDEBATCH_BOOTSTRAP_SERVERS=kafka:9092.
Each value is read as its key's declared type (pipeline/config_env.py): strings stay
strings; a variable that names no key is a warning, not an error.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from consumers.client_settings import ROLES, is_secret, redacted, settings_for
from consumers.kafka_python_settings import kafka_python_settings
from pipeline.config_env import EnvText, env_overrides, read_env
from pipeline.errors import UserError, config_key_error
from pipeline.kafka_keys import validate_delivery, validate_group
from pipeline.logs import FORMATS, LEVELS
from pipeline.ops.http_config import MetricsConfig, validate_metrics  # host, port, auth
from pipeline.redisio.config import RedisConfig, validate_redis
from pipeline.sinks.config import SinksConfig, validate_sinks
from pipeline.tenants_config import TenantsConfig, validate_tenants  # shares, SLAs per tenant class
from pipeline.tracing import TRACE_HEADERS, TracingConfig, validate_tracing


@dataclass
class BatchingConfig:
    policy: str = "adaptive"
    # None: the pipeline's own default (CTR 512, text 32, camera 8 — pipelines.py).
    max_batch_rows: int | None = None
    max_queue_delay_ms: float = 10.0  # static only
    slo_ms: float = 100.0  # latency budget from the request's Kafka timestamp
    priority_slo_ms: dict[int, float] = field(default_factory=dict)  # per priority level
    expiry_action: str = "score_late"  # or route_late
    late_share: float = 0.05
    max_late_rows: int = 100_000
    shed_reserve: float = 0.5  # route_late: most of the SLO kept for after decode (batching/shed.py)
    queue_high_rows: int = 20_000  # hold intake above (batching/backpressure.py)
    queue_low_rows: int = 10_000  # full polls again at or below
    allowed_batch_sizes: list[int] = field(default_factory=list)
    hold_for_efficiency: bool = False


@dataclass
class RuntimeConfig:
    providers: str = "auto"
    intra_op_threads: int = 1
    # ONNX Runtime in a process of its own (pipeline/runtime/model_process.py): the
    # model then never waits for the GIL that decoding and publishing hold, which
    # raises a backlog drain's throughput, most with pin_executors (docs/OPERATIONS.md,
    # "Capacity of one worker"). Off by default: unpinned, its end-to-end latency at
    # half load was worse than in-process. false: ORT on the executor threads.
    model_process: bool = False
    # Executor threads, i.e. the most batches in flight at once. Default: 4 with a
    # model process, where more than one is in flight only through a backlog (the
    # next batches wait in its socket, so an executor waiting for the GIL does not
    # leave the model idle; pipeline/batching/depth.py); 1 without (each executor
    # runs the model itself).
    executors: int | None = None
    warmup: bool = True
    # How long a thread may hold the GIL while another waits (pipeline/runtime/
    # interpreter.py has the measurements). Default: 0.1 ms, and Python's 5 ms while a
    # model process works through a backlog (pipeline/batching/depth.py). A value
    # here is used throughout.
    gil_switch_interval_ms: float | None = None
    # After start-up: freeze the heap and collect generation 0 every this many
    # allocations (Python: 700), so that the collector's scans stop holding the GIL
    # for milliseconds at high request rates (interpreter.py). 0: leave the GC alone.
    gc_gen0_threshold: int = 20_000
    # Executor i on the i-th allowed core, everything else on the rest; with a model
    # process, that process on the first core and the worker on the rest (Linux, one
    # intra-op thread, more allowed cores than executors; else ignored with a
    # warning). Off by default: it speeds backlog drains up, but when other processes
    # share the cores a pinned executor cannot move away from them and tail latency
    # suffers (pipeline/runtime/affinity.py has the figures).
    pin_executors: bool = False
    # Look for a new model version this often (seconds): a changed model file, or a
    # new version folder of a model repository (pipeline/versions/repository.py); it
    # is loaded, warmed up and swapped in while consuming goes on. 0: only when told
    # to (POST /model/reload on the ops server).
    model_poll_s: float = 0.0


UNDELIVERABLE_ACTIONS = ("skip", "stop")


@dataclass
class LimitsConfig:
    """What one message may cost (docs/ARCHITECTURE.md, "Size limits")."""

    # Largest request record (key + value + headers) that is decoded; a larger one is
    # dead-lettered before decoding. None: the pipeline's default (pipelines.py). Never
    # above what the dead-letter topic takes, so any refused request can be copied
    # there whole (lowered at start, with a warning, if it is).
    max_request_bytes: int | None = None
    # Bytes of the value that a dead-letter or late copy keeps when the whole record
    # would exceed its topic's limit (the copy then says so in its headers).
    dead_letter_prefix_bytes: int = 65536
    # When not even a cut-down dead-letter record can be written for a request:
    # "skip" logs one line naming the offset, counts it (outcome="undeliverable") and
    # moves on; "stop" exits 1 without committing past it, naming the offset and how
    # to skip it. Never the default: a stop replays the same record after a restart.
    on_undeliverable: str = "skip"


@dataclass(repr=False)
class KafkaOverrides:
    """librdkafka settings: `common` for every client, then each role's own."""

    common: dict[str, Any] = field(default_factory=dict)
    consumer: dict[str, Any] = field(default_factory=dict)
    producer: dict[str, Any] = field(default_factory=dict)
    admin: dict[str, Any] = field(default_factory=dict)

    def client(self, role: str) -> dict[str, Any]:
        """What a consumer, producer or admin client gets (consumers/client_settings.py)."""
        return settings_for(self, role)

    def __repr__(self) -> str:  # a dumped config must not show a secret
        return "KafkaOverrides(" + ", ".join(f"{r}={redacted(getattr(self, r))}" for r in ("common", *ROLES)) + ")"


@dataclass
class WorkerConfig:
    pipeline: str = "ctr"
    bootstrap_servers: str = "127.0.0.1:9092"
    broker_profile: str = "kafka"  # or "embedded" (Tansu workarounds, docs/BROKERS.md)
    client: str = "confluent"  # or "kafka-python"
    group_id: str | None = None  # default: tidebatch-<pipeline>
    # Rebalancing (docs/OPERATIONS.md, "Rebalancing"). "classic": JoinGroup/SyncGroup
    # with the client-side cooperative-sticky assignor (consumers/profiles.py);
    # "consumer": KIP-848, the broker assigns and each member moves on its own, never
    # stopping the group (Apache Kafka >= 4.0, confluent client only).
    group_protocol: str = "classic"
    # The broker-side assignor with group_protocol consumer ("uniform", "range");
    # None: the broker's default (uniform).
    group_remote_assignor: str | None = None
    # Static membership (KIP-345): a member that restarts with the same id within the
    # session timeout gets its partitions back and nobody else is rebalanced. Must be
    # unique in the group; group_instance_id_env takes it from an environment variable
    # (POD_NAME from the downward API, or HOSTNAME: a StatefulSet's pod name).
    group_instance_id: str | None = None
    group_instance_id_env: str | None = None
    # Classic protocol only (with "consumer" it is the broker's
    # group.consumer.session.timeout.ms): how long a silent member keeps its partitions.
    # None: the client's default (librdkafka 45 s; the embedded profile's 6 s).
    session_timeout_ms: int | None = None
    input_topic: str | None = None  # default: the pipeline's
    output_topic: str | None = None
    dlq_topic: str | None = None  # default: <input_topic>.dlq
    late_topic: str | None = None  # default: <input_topic>.late
    commit_interval_ms: int = 200
    # "at_least_once": offsets are committed after their outcomes are acked, so a crash
    # replays (and re-scores) what was not committed yet. "exactly_once": outcome records
    # and input offsets are committed in one Kafka transaction (docs/DELIVERY.md); Apache
    # Kafka and the confluent client only.
    delivery: str = "at_least_once"
    # exactly_once: how often the open transaction commits (results become visible to
    # read_committed readers then), its transactional.id (default: from
    # group_instance_id, else random per process: see docs/DELIVERY.md), and the
    # broker's timeout for a transaction its producer stopped finishing.
    transaction_interval_ms: int = 100
    transactional_id: str | None = None
    transaction_timeout_ms: int = 10_000
    # SIGTERM: how long the worker finishes queued and in-flight work before it
    # leaves the rest uncommitted (replayed by the partitions' next owner) and exits.
    drain_timeout_s: float = 30.0
    create_topics: bool = True  # create missing topics at start (input with `partitions`)
    # At start: how long to wait for a broker to answer before exiting 1 with one line
    # (consumers/kafka_reachable.py); an authentication or TLS failure exits at once.
    kafka_connect_timeout_s: float = 30.0
    # Writes held up this long make an outage: not ready (pipeline/worker/kafka_progress.py).
    outage_after_s: float = 10.0
    partitions: int = 4  # for topics this worker creates
    # Request headers copied onto each result (pipeline/outcomes.py): W3C trace context.
    result_headers: list[str] = field(default_factory=lambda: list(TRACE_HEADERS))
    tracing: TracingConfig = field(default_factory=TracingConfig)  # OpenTelemetry (pipeline/tracing.py)
    log_level: str = "INFO"  # --log-level wins (pipeline/logs.py)
    log_format: str = "text"  # or json: one object per line
    max_items: int = 1000
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    kafka: KafkaOverrides = field(default_factory=KafkaOverrides)
    # Keyword options of the pipeline's codec class (ctr, camera, text or a user's, over
    # its entry's codec_options: pipeline/codec_names.py), e.g. {"pad_to": "longest"} for
    # the text codec; checked against the codec when the worker starts.
    codec: dict[str, Any] = field(default_factory=dict)
    # Pipelines of the user's own models (model + codec + topics + limits), checked by
    # pipeline/pipeline_keys.py as the shipped ones in models/pipelines.yaml are.
    pipelines: list[dict[str, Any]] = field(default_factory=list)
    redis: RedisConfig = field(default_factory=RedisConfig)  # off unless a feature is enabled
    sinks: SinksConfig = field(default_factory=SinksConfig)  # offline sinks (Parquet), docs/ETL.md
    tenants: TenantsConfig = field(default_factory=TenantsConfig)  # none: one shared queue

    def instance_id(self, environ: Mapping[str, str] | None = None) -> str | None:
        """group.instance.id: group_instance_id, else the value of the environment
        variable named by group_instance_id_env, else None (dynamic membership)."""
        if self.group_instance_id:
            return self.group_instance_id
        if self.group_instance_id_env:
            value = (os.environ if environ is None else environ).get(self.group_instance_id_env, "").strip()
            if not value:
                raise UserError(
                    f"config key 'group_instance_id_env': ${self.group_instance_id_env} is not set or empty"
                )
            return value
        return None

    def slo_seconds(self, priority: int) -> float:
        ms = self.batching.priority_slo_ms.get(priority, self.batching.slo_ms)
        return ms / 1000.0


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    if isinstance(value, EnvText):
        try:
            value = read_env(value, tp, key)
        except ValueError as exc:
            raise config_key_error(key, str(exc)) from None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise UserError(f"config key '{key}': expected a mapping, got {type(value).__name__}")
        return _build(tp, value, key + ".")
    if origin is dict:
        if not isinstance(value, Mapping):
            raise UserError(f"config key '{key}': expected a mapping, got {type(value).__name__}")
        kt, vt = args
        return {_coerce(k, kt, f"{key}.{k}"): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"config key '{key}': expected a list, got {type(value).__name__}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"config key '{key}': expected true or false, got {value!r}")
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is int and isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)  # dict keys from YAML/env may arrive as strings
    if tp is str and isinstance(value, str):
        return value
    # A secret's value is never shown, not even the wrong one (an unquoted 123456).
    shown = f"a value of type {type(value).__name__}" if is_secret(key) or key.endswith("_token") else repr(value)
    raise UserError(f"config key '{key}': expected {_type_name(tp)}, got {shown}")


def _build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
            raise UserError(f"config key '{prefix}{key}' is not known{hint}")
        kwargs[key] = _coerce(value, hints[key], prefix + key)
    return cls(**kwargs)


def _merge(base: dict, extra: Mapping) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> WorkerConfig:
    """File < environment < explicit overrides (CLI flags). Validated."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"config file {p} is not valid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise UserError(f"config file {p}: the top level must be a mapping")
        data = loaded
    data = _merge(data, env_overrides(os.environ if environ is None else environ, WorkerConfig))
    data = _merge(data, overrides or {})
    cfg = _build(WorkerConfig, data)
    validate(cfg)
    return cfg


def validate(cfg: WorkerConfig) -> None:
    from pipeline.batching.batcher import EXPIRY_ACTIONS
    from pipeline.batching.registry import POLICY_NAMES

    b = cfg.batching

    bad = config_key_error

    if b.policy not in POLICY_NAMES:
        raise bad("batching.policy", f"{b.policy!r} is not one of {', '.join(POLICY_NAMES)}")
    if b.max_batch_rows is not None and b.max_batch_rows < 1:
        raise bad("batching.max_batch_rows", "must be >= 1")
    if b.max_queue_delay_ms < 0:
        raise bad("batching.max_queue_delay_ms", "must be >= 0")
    if b.slo_ms <= 0:
        raise bad("batching.slo_ms", "must be > 0")
    if any(v <= 0 for v in b.priority_slo_ms.values()):
        raise bad("batching.priority_slo_ms", "every budget must be > 0")
    if b.expiry_action not in EXPIRY_ACTIONS:
        raise bad("batching.expiry_action", f"{b.expiry_action!r} is not one of {', '.join(EXPIRY_ACTIONS)}")
    if not 0 <= b.late_share <= 1:
        raise bad("batching.late_share", "must be within [0, 1]")
    if not 0 <= b.shed_reserve < 1:
        raise bad("batching.shed_reserve", "must be within [0, 1)")
    if not 0 <= b.queue_low_rows < b.queue_high_rows:
        raise bad("batching.queue_low_rows", "must be >= 0 and below batching.queue_high_rows")
    if any(s < 1 for s in b.allowed_batch_sizes):
        raise bad("batching.allowed_batch_sizes", "sizes must be >= 1")
    if b.allowed_batch_sizes and cfg.max_items > max(b.allowed_batch_sizes):
        raise bad("max_items", f"{cfg.max_items} exceeds the largest allowed batch size {max(b.allowed_batch_sizes)}")
    if cfg.max_items > b.queue_high_rows:
        raise bad("max_items", "must not exceed batching.queue_high_rows")
    if cfg.runtime.executors is not None and cfg.runtime.executors < 1:
        raise bad("runtime.executors", "must be >= 1")
    if cfg.runtime.gil_switch_interval_ms is not None and not 0 < cfg.runtime.gil_switch_interval_ms <= 100:
        raise bad("runtime.gil_switch_interval_ms", "must be in (0, 100]")
    if cfg.runtime.gc_gen0_threshold < 0:
        raise bad("runtime.gc_gen0_threshold", "must be >= 0 (0 leaves the garbage collector alone)")
    if cfg.runtime.intra_op_threads < 1:
        raise bad("runtime.intra_op_threads", "must be >= 1")
    if cfg.runtime.model_poll_s < 0:
        raise bad("runtime.model_poll_s", "must be >= 0 (0: only POST /model/reload loads a new version)")
    if cfg.client not in ("confluent", "kafka-python"):
        raise bad("client", f"{cfg.client!r} is not one of confluent, kafka-python")
    if cfg.client == "kafka-python":  # refuse what it cannot honour before connecting anywhere
        for role in ("consumer", "producer"):
            kafka_python_settings({**cfg.kafka.common, **getattr(cfg.kafka, role)})
    if cfg.broker_profile not in ("kafka", "embedded"):
        raise bad("broker_profile", f"{cfg.broker_profile!r} is not one of kafka, embedded")
    validate_group(cfg, bad)
    if cfg.partitions < 1:
        raise bad("partitions", "must be >= 1")
    if cfg.commit_interval_ms < 1:
        raise bad("commit_interval_ms", "must be >= 1")
    for key in ("drain_timeout_s", "outage_after_s", "kafka_connect_timeout_s"):
        if getattr(cfg, key) <= 0:
            raise bad(key, "must be > 0")
    validate_tracing(cfg.tracing, bad)
    for key, value, known in (("log_level", cfg.log_level.upper(), LEVELS), ("log_format", cfg.log_format, FORMATS)):
        if value not in known:
            raise bad(key, f"{value!r} is not one of {', '.join(known)}")
    validate_delivery(cfg, bad)
    lim = cfg.limits
    if lim.max_request_bytes is not None and lim.max_request_bytes < 1024:
        raise bad("limits.max_request_bytes", "must be >= 1024")
    if lim.dead_letter_prefix_bytes < 0:
        raise bad("limits.dead_letter_prefix_bytes", "must be >= 0")
    if lim.on_undeliverable not in UNDELIVERABLE_ACTIONS:
        raise bad("limits.on_undeliverable", f"{lim.on_undeliverable!r} is not one of {', '.join(UNDELIVERABLE_ACTIONS)}")
    validate_metrics(cfg.metrics, bad)
    validate_tenants(cfg.tenants, bad)
    validate_redis(cfg.redis, bad)
    validate_sinks(cfg.sinks, bad)
    from pipeline.pipeline_keys import validate_pipelines
    from pipeline.pipelines import shipped_names

    validate_pipelines(cfg, bad, shipped_names())
