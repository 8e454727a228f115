"""Checking a loaded configuration: every rule that spans keys, with errors that name the key."""

from __future__ import annotations

from collections.abc import Callable

from consumers.kafka_python_settings import kafka_python_settings
from consumers.profiles import PROFILES
from pipeline.config.kafka_keys import validate_delivery, validate_group
from pipeline.config.sections import UNDELIVERABLE_ACTIONS, RuntimeConfig, WorkerConfig
from pipeline.config.tenants import validate_tenants  # shares, SLAs per tenant class
from pipeline.errors import config_key_error
from pipeline.observe.logs import FORMATS, LEVELS
from pipeline.observe.tracing import validate_tracing
from pipeline.ops.http_config import validate_metrics  # host, port, auth
from pipeline.redisio.config import validate_redis
from pipeline.sinks.config import validate_sinks


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
    validate_device(cfg.runtime, bad)
    validate_processes(cfg.runtime, bad)
    if cfg.client not in ("confluent", "kafka-python"):
        raise bad("client", f"{cfg.client!r} is not one of confluent, kafka-python")
    if cfg.client == "kafka-python":  # refuse what it cannot honour before connecting anywhere
        for role in ("consumer", "producer"):
            kafka_python_settings({**cfg.kafka.common, **getattr(cfg.kafka, role)})
    if cfg.broker_profile not in PROFILES:
        raise bad("broker_profile", f"{cfg.broker_profile!r} is not one of {', '.join(PROFILES)}")
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
    from pipeline.registry.keys import validate_pipelines
    from pipeline.registry.pipelines import shipped_names

    validate_pipelines(cfg, bad, shipped_names())
    from pipeline.registry.pipelines import shipped_entries
    from pipeline.registry.schema_settings import validate_schema_registry

    entry = next(e for e in (*shipped_entries(), *cfg.pipelines) if e["name"] == cfg.pipeline)
    validate_schema_registry(cfg.schema_registry, entry.get("codec", "tensor-json"), cfg.pipeline, bad)


def check_auto_or_bool(value: bool | str, key: str, bad: Callable[[str, str], Exception]) -> None:
    """A `bool | str` key: true, false or "auto" (the config loader keeps any other string)."""
    if isinstance(value, str) and value != "auto":
        raise bad(key, f"{value!r} is not one of auto, true, false")


def validate_device(rt: RuntimeConfig, bad: Callable[[str, str], Exception]) -> None:
    """The runtime section's GPU keys (pipeline/runtime/device.py)."""
    if rt.device_id < 0:
        raise bad("runtime.device_id", "must be >= 0")
    if rt.gpu_mem_limit_mb is not None and rt.gpu_mem_limit_mb < 1:
        raise bad("runtime.gpu_mem_limit_mb", "must be >= 1 (or unset: ONNX Runtime's default)")
    check_auto_or_bool(rt.io_binding, "runtime.io_binding", bad)
    if rt.cuda_graphs and rt.io_binding is False:
        raise bad("runtime.cuda_graphs", "needs runtime.io_binding (auto or true): a graph reads and writes fixed buffers")
    if rt.cuda_graphs and str(rt.providers).lower() == "cpu":
        raise bad("runtime.cuda_graphs", "needs a GPU provider (runtime.providers is cpu)")


def validate_processes(rt: RuntimeConfig, bad: Callable[[str, str], Exception]) -> None:
    """runtime.processes and the child restart policy (pipeline/app/processes.py)."""
    p = rt.processes
    if isinstance(p, bool) or not (p == "auto" or isinstance(p, int) and p >= 1):
        raise bad("runtime.processes", f"{p!r} is neither an integer >= 1 nor auto")
    check_auto_or_bool(rt.shared_model_host, "runtime.shared_model_host", bad)
    if rt.shared_model_host_max_rows < 1:
        raise bad("runtime.shared_model_host_max_rows", "must be >= 1")
    if rt.child_restarts < 0:
        raise bad("runtime.child_restarts", "must be >= 0 (0: a dead child stops the host)")
    if rt.child_restart_window_s <= 0:
        raise bad("runtime.child_restart_window_s", "must be > 0")
