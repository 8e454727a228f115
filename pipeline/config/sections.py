"""The worker configuration's sections: one dataclass each, defaults included (loaded by
pipeline/config/load.py, checked by pipeline/config/checks.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from consumers.client_settings import ROLES, redacted, settings_for
from pipeline.config.tenants import TenantsConfig  # shares, SLAs per tenant class
from pipeline.errors import UserError
from pipeline.observe.tracing import TRACE_HEADERS, TracingConfig
from pipeline.ops.http_config import MetricsConfig  # host, port, auth
from pipeline.redisio.config import RedisConfig
from pipeline.registry.schema_settings import SchemaRegistryConfig
from pipeline.sinks.config import SinksConfig


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
    # new version folder of a model repository (pipeline/registry/version_folders.py); it
    # is loaded, warmed up and swapped in while consuming goes on. 0: only when told
    # to (POST /model/reload on the ops server).
    model_poll_s: float = 0.0
    # The GPU (docs/MODELS.md, "On a GPU host"; pipeline/runtime/device.py). Ignored on CPU.
    device_id: int = 0
    # TF32 matrix products on the CUDA provider (its use_tf32 option). Off: CUDA scores
    # then match the CPU's within float rounding (CTR within 1e-5, against 4.5e-4 with
    # TF32), and the shipped models are launch-bound on a GPU (99 % of a CTR call is
    # fixed cost), so TF32 buys them little (docs/MODELS.md has both measured).
    tf32: bool = False
    gpu_mem_limit_mb: int | None = None  # the CUDA arena's limit; None: ONNX Runtime's (no limit)
    # A CUDA graph per allowed batch size (batching.allowed_batch_sizes, else powers of
    # two up to max_items), captured at start and for each new model version; batches
    # are padded to the next size and the pad rows never leave the session
    # (pipeline/runtime/io_binding.py). A model that cannot be captured runs plain.
    cuda_graphs: bool = False
    # Inputs and outputs through ONNX Runtime's IO binding, in preallocated (pinned on
    # CUDA) buffers per batch size. "auto": on a GPU provider, off on CPU.
    io_binding: bool | str = "auto"
    # Worker processes on this host (`tidebatch run --processes`, docs/OPERATIONS.md,
    # "Many processes on one host"): N children in one group behind one ops port
    # (pipeline/app/children.py). "auto": pipeline/app/processes.py's rule from the
    # usable cores and the model's device, logged at start; 1: one process, no supervisor.
    processes: int | str = "auto"
    # A child that died unexpectedly is restarted up to child_restarts times within
    # child_restart_window_s; one more death in the window stops the host (exit 1).
    # One model process per host that every child sends its batches to and that joins
    # the batches waiting when the model frees into one call (pipeline/runtime/
    # shared_host.py). "auto": on when runtime.providers names a GPU (one CUDA context
    # and few large calls instead of N contexts with small ones); on the CPU each child
    # keeps its own model, as configured: one host runs one call at a time, and on 2
    # cores it gave 0.73-0.97x the rows/s of a model process per worker (docs/OPERATIONS.md).
    shared_model_host: bool | str = "auto"
    # Rows of one joined call at most (the host's --max-rows).
    shared_model_host_max_rows: int = 4096
    child_restarts: int = 3
    child_restart_window_s: float = 600.0


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
    # Writes held up this long make an outage: not ready (pipeline/delivery/kafka_progress.py).
    # Above what one SIGKILLed broker holds writes (its fence, 9 s by Kafka's default,
    # and the failover): 15 s where that must never read as an outage (docs/BROKERS.md,
    # "One broker SIGKILLed: near the threshold"); exactly_once's aborted and resent
    # records go on waiting, so it may exceed transaction_timeout_ms.
    outage_after_s: float = 10.0
    partitions: int = 4  # for topics this worker creates
    # Request headers copied onto each result (pipeline/delivery/outcomes.py): W3C trace context.
    result_headers: list[str] = field(default_factory=lambda: list(TRACE_HEADERS))
    tracing: TracingConfig = field(default_factory=TracingConfig)  # OpenTelemetry (pipeline/observe/tracing.py)
    log_level: str = "INFO"  # --log-level wins (pipeline/observe/logs.py)
    log_format: str = "text"  # or json: one object per line
    max_items: int = 1000
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    kafka: KafkaOverrides = field(default_factory=KafkaOverrides)
    # Keyword options of the pipeline's codec class (ctr, camera, text or a user's, over
    # its entry's codec_options: pipeline/registry/codecs.py), e.g. {"pad_to": "longest"} for
    # the text codec; checked against the codec when the worker starts.
    codec: dict[str, Any] = field(default_factory=dict)
    # Pipelines of the user's own models (model + codec + topics + limits), checked by
    # pipeline/registry/keys.py as the shipped ones in models/pipelines.yaml are.
    pipelines: list[dict[str, Any]] = field(default_factory=list)
    redis: RedisConfig = field(default_factory=RedisConfig)  # off unless a feature is enabled
    # Requests and results as Avro, Protobuf or JSON Schema records (pipeline/registry/schema_settings.py)
    schema_registry: SchemaRegistryConfig = field(default_factory=SchemaRegistryConfig)
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
