"""`tidebatch run --processes N` with N > 1: the parent of N worker processes, with the
host's one ops port (pipeline/ops/host_http.py) and its signal handling; the children
are pipeline/app/children.py's, the decisions pipeline/app/processes.py's."""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence

from pipeline.app.children import ModelHost, Supervisor
from pipeline.app.processes import RestartPolicy, cap_by_partitions, shares_model_host
from pipeline.app.serve import preflight, serve
from pipeline.config import WorkerConfig

log = logging.getLogger(__name__)

# Past the children's own end (drain_timeout_s + the watchdog's EXIT_MARGIN_S): the
# parent waits this much more before it kills a child that has not exited.
PARENT_MARGIN_S = 5.0


def child_command(argv: Sequence[str]) -> list[str]:
    """A child is the same `tidebatch ...` command line, run by this interpreter."""
    return [sys.executable, "-m", "pipeline.cli", *argv]


def serve_host(
    cfg: WorkerConfig, processes: int, why: str, argv: Sequence[str], model_host: ModelHost | None = None
) -> int:
    """Checks and topics once, then the children, the ops port, and the wait for a
    signal or a child the restart policy gives up on. Exit: the worst child's status.
    `why`: how `processes` was chosen (auto is capped by the input's partitions here)."""
    from pipeline.delivery.watchdog import EXIT_MARGIN_S

    preflight(cfg)
    rt = cfg.runtime
    if rt.processes == "auto":
        processes, why = cap_by_partitions(processes, why, input_partitions(cfg))
        log.info("runtime.processes auto: %d (%s)", processes, why)
    if processes == 1:
        return serve(cfg)
    socket_dir = None
    if model_host is None:
        share, share_why = shares_model_host(rt.shared_model_host, rt.providers)
        log.info("model: %s", share_why)
        if share:
            from pipeline.runtime.shared_host import SharedModelHost

            # A private directory: the socket is the host's only door, and only this
            # user's processes may knock (mkdtemp makes it 0700).
            socket_dir = tempfile.mkdtemp(prefix="tidebatch-host-")
            model_host = SharedModelHost(
                f"{socket_dir}/model.sock", rt.providers, rt.intra_op_threads, rt.shared_model_host_max_rows
            )
    supervisor = Supervisor(
        processes, child_command(argv), RestartPolicy(rt.child_restarts, rt.child_restart_window_s),
        drain_s=cfg.drain_timeout_s + EXIT_MARGIN_S + PARENT_MARGIN_S, model_host=model_host,
    )

    def handler(signum: int, _frame: object) -> None:
        supervisor.stop(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    server = None
    try:
        if cfg.metrics.enabled:
            from pipeline.ops.host_http import HostOpsServer

            server = HostOpsServer(
                cfg.metrics, cfg.pipeline, supervisor.views, supervisor.token, supervisor.ok,
                model_host_stats=model_host.stats if model_host is not None else None,
            ).start()
            print(f"tidebatch worker metrics: {server.url}/metrics", flush=True)
            print(f"tidebatch worker dashboard: {server.url}/", flush=True)
        supervisor.start()
        code = supervisor.run()
        if supervisor.failed is not None:
            print(f"tidebatch: error: {supervisor.failed[1]}", file=sys.stderr, flush=True)
        log.info("host stopped: exit %d", code)
        return code
    finally:
        if server is not None:
            server.stop()
        supervisor.close()
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)


def input_partitions(cfg: WorkerConfig) -> int | None:
    """The input topic's partition count, None where it cannot be read (then auto is
    not capped)."""
    from consumers.admin import AdminError, existing_topics
    from pipeline.registry.pipelines import pipeline_for

    topic = cfg.input_topic or pipeline_for(cfg).input_topic
    try:
        return existing_topics(cfg.bootstrap_servers, admin_config=cfg.kafka.client("admin")).get(topic)
    except AdminError as exc:
        log.warning("runtime.processes auto: the partitions of %s unknown (%s)", topic, exc)
        return None
