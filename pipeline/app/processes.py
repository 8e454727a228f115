"""The pure decisions of `tidebatch run --processes N` (docs/OPERATIONS.md, "Many
processes on one host"); pipeline/app/children.py acts on them:

- `auto_processes`: how many workers `runtime.processes: auto` runs, and why;
- `child_config`: what one child's configuration differs in from the host's (its
  group.instance.id and transactional.id, its loopback ops port);
- `RestartPolicy`: whether a child that died is restarted, with the clock passed in;
- `host_exit_code`: the host's exit status from its children's.
"""

from __future__ import annotations

import dataclasses
import signal
from collections import deque
from collections.abc import Sequence

from pipeline.config import WorkerConfig
from pipeline.config.tenants import TenantsConfig
from pipeline.ops.http_config import HttpAuthConfig, HttpTlsConfig, MetricsConfig

# Environment a child is started with (pipeline/config/env.py leaves TIDEBATCH_CHILD_*
# alone): its index, where it writes its ops port, the host's id for its
# transactional.id, the token its loopback ops port asks of the parent.
CHILD_INDEX_ENV = "TIDEBATCH_CHILD_INDEX"
CHILD_COUNT_ENV = "TIDEBATCH_CHILD_COUNT"  # how many children the host runs
CHILD_PORT_FILE_ENV = "TIDEBATCH_CHILD_PORT_FILE"
CHILD_HOST_ID_ENV = "TIDEBATCH_CHILD_HOST_ID"
CHILD_TOKEN_ENV = "TIDEBATCH_CHILD_OPS_TOKEN"
MODEL_HOST_ENV = "TIDEBATCH_MODEL_HOST"

# auto: below this many usable cores one process. A worker keeps about two cores busy
# through a backlog (its source thread and its publisher or executor: docs/PEERS.md's
# per-thread figures), and the broker and the producers share the box: on the 2-core
# machine the suite runs on a second process only takes cores from them.
AUTO_MIN_CORES = 4
# auto: at most this many. On the 16-core GPU host (issue 46) N independent workers
# gained 464-468k rows/s at 4, 541-680k at 8 and 653k at 12: past 8 a process adds
# little and costs a CUDA context and a group member. The lead re-decides with
# measurements; the rule is here only.
AUTO_MAX = 8
GPU_PROVIDERS = ("cuda", "tensorrt", "rocm", "migraphx", "dml")

EXIT_CONFIG = 2  # a child that exits 2 at start: a configuration or connection error


def auto_processes(setting: int | str, cores: int, providers: str, intra_op_threads: int = 1) -> tuple[int, str]:
    """(processes, why). `cores`: the usable ones (os.sched_getaffinity). On a GPU the
    model's work leaves the cores, so each process needs about two (source, publisher);
    on the CPU it also needs its ONNX Runtime threads."""
    if setting != "auto":
        return int(setting), f"runtime.processes {setting}"
    gpu = names_gpu(providers)
    if cores < AUTO_MIN_CORES:
        return 1, f"auto: {cores} usable cores < {AUTO_MIN_CORES}, one process"
    per = 2 if gpu else 1 + max(intra_op_threads, 1)
    n = max(1, min(cores // per, AUTO_MAX))
    device = "GPU" if gpu else f"CPU, {intra_op_threads} intra-op thread(s)"
    return n, f"auto: {cores} usable cores, {device}: {per} cores a process, at most {AUTO_MAX}"


def names_gpu(providers: str) -> bool:
    """Whether runtime.providers asks for a GPU provider ("auto" does not: the CPU rules)."""
    return any(g in providers.lower() for g in GPU_PROVIDERS)


def shares_model_host(setting: bool | str, providers: str) -> tuple[bool, str]:
    """(whether the children share one model host, why): runtime.shared_model_host,
    "auto" = on a GPU provider only (RuntimeConfig says why)."""
    if setting != "auto":
        return bool(setting), f"runtime.shared_model_host {str(setting).lower()}"
    if names_gpu(providers):
        return True, f"auto: providers {providers} (a GPU): one model host for every process"
    return False, f"auto: providers {providers} (not a GPU provider): each process its own model"


def cap_by_partitions(processes: int, why: str, partitions: int | None) -> tuple[int, str]:
    """auto: never more processes than the input topic has partitions (a child without
    one would never be ready, and the host with it)."""
    if partitions is None or processes <= partitions:
        return processes, why
    return max(partitions, 1), f"{why}; {partitions} input partitions"


def child_config(cfg: WorkerConfig, index: int, host_id: str, count: int = 1) -> WorkerConfig:
    """The host's config as child `index` of `count` runs it: one process; its ops
    endpoints on a free loopback port behind the parent's token (the parent's own port
    has the configured auth and TLS); a static member id and a transactional.id of its
    own, the same for every restart of this index (a restarted child fences its dead
    predecessor), since two members with one id would fence each other for ever; and
    its share of the tenants' rows/s (tenant_share)."""
    from pipeline.app.compose import group_id_of

    runtime = dataclasses.replace(cfg.runtime, processes=1)
    metrics = MetricsConfig(
        enabled=cfg.metrics.enabled, host="127.0.0.1", port=0, tls=HttpTlsConfig(),
        auth=HttpAuthConfig(bearer_token="${" + CHILD_TOKEN_ENV + "}", protect_metrics=True),
    )
    # The parent created the topics (pipeline/app/serve.py preflight) before it started any child.
    changes: dict = {"runtime": runtime, "metrics": metrics, "create_topics": False}
    instance = cfg.instance_id()
    if instance:
        changes.update(group_instance_id=f"{instance}-p{index}", group_instance_id_env=None)
    if cfg.delivery == "exactly_once":
        changes["transactional_id"] = child_transactional_id(cfg, group_id_of(cfg), index, host_id)
    if cfg.tenants.enabled and count > 1:
        changes["tenants"] = tenant_share(cfg.tenants, count)
    return dataclasses.replace(cfg, **changes)


def tenant_share(tenants: TenantsConfig, count: int) -> TenantsConfig:
    """One child's part of the host's tenant figures: `capacity_rows_per_s` and each
    class's `ceiling_rows_per_s` are the host's, so each of `count` children enforces
    1/count of them (else the host would admit count times a tenant's ceiling). Shares
    are fractions and stay. Exact when a tenant's requests spread over the partitions
    (keys hashed over them); a tenant whose requests all land on one child's partitions
    gets 1/count of its ceiling there (docs/OPERATIONS.md, "Many processes on one host")."""
    classes = {
        name: dataclasses.replace(c, ceiling_rows_per_s=None if c.ceiling_rows_per_s is None
                                  else c.ceiling_rows_per_s / count)
        for name, c in tenants.classes.items()
    }
    capacity = None if tenants.capacity_rows_per_s is None else tenants.capacity_rows_per_s / count
    return dataclasses.replace(tenants, capacity_rows_per_s=capacity, classes=classes)


def child_transactional_id(cfg: WorkerConfig, group_id: str, index: int, host_id: str) -> str:
    """The configured id, else the static member id's, else the host's random id; each
    with `.p<index>`."""
    base = cfg.transactional_id
    if not base:
        instance = cfg.instance_id()
        base = f"tidebatch.{group_id}.{instance or host_id}"
    return f"{base}.p{index}"


class RestartPolicy:
    """A child that died unexpectedly is restarted while fewer than `restarts` restarts
    fell within the last `window_s` seconds; then the host stops. A child that exits
    EXIT_CONFIG is never restarted: it would fail the same way again."""

    def __init__(self, restarts: int, window_s: float) -> None:
        self.restarts = restarts
        self.window_s = window_s
        self._times: deque[float] = deque()

    def decide(self, now: float, code: int) -> tuple[bool, str]:
        """(restart?, why). `code`: the exit status, or -signal (subprocess's form)."""
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        if code == EXIT_CONFIG:
            return False, "exit 2 (configuration or connection): not restarted"
        if len(self._times) >= self.restarts:
            return False, f"{len(self._times)} restarts within {self.window_s:g} s already (runtime.child_restarts)"
        self._times.append(now)
        return True, f"restart {len(self._times)} of {self.restarts} within {self.window_s:g} s"


def describe_exit(code: int) -> str:
    """subprocess's returncode in words: 'exit 1', 'signal SIGKILL'."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


def host_exit_code(codes: Sequence[int]) -> int:
    """The worst child's: 2 (configuration) over any other failure (1, a signal as 1)
    over 0."""
    if any(c == EXIT_CONFIG for c in codes):
        return EXIT_CONFIG
    return 1 if any(c != 0 for c in codes) else 0
