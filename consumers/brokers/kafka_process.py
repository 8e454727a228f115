"""The JVMs of a local Apache Kafka (consumers/brokers/kafka.py): the java command line,
formatting the nodes' storage, starting a node's server and stopping nodes (SIGKILLing
the last ones once the quorum is gone).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

from consumers.brokers.embedded import _pdeathsig_preexec, _terminate
from consumers.brokers.kafka_fetch import KafkaBrokerError
from consumers.brokers.kafka_node import KafkaNode, telling_line

# Small heap (tests hold little data) and JIT/GC settings that favour start-up over
# peak throughput; measured in docs/BROKERS.md.
JVM_FLAGS: tuple[str, ...] = (
    "-Xms64m", "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-Djava.awt.headless=true",
)
# slf4j-simple (see the pom): warnings and errors only, with times, to stderr → the log file.
_LOG_FLAGS: tuple[str, ...] = (
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
)
_POLL_S = 0.05


class PortTaken(KafkaBrokerError):
    """A node could not bind a port: retried with other ports when we picked them."""


def java_cmd(java: str, libs: Path, main: str, *args: str) -> list[str]:
    return [java, *JVM_FLAGS, *_LOG_FLAGS, "-cp", str(libs / "*"), main, *args]


def format_storage(java: str, libs: Path, cluster_id: str, nodes: Sequence[KafkaNode]) -> None:
    """StorageTool format on every node, in parallel (each is a ~1.5 s JVM)."""
    procs = []
    for node in nodes:
        cmd = java_cmd(
            java, libs, "kafka.tools.StorageTool", "format",
            "--cluster-id", cluster_id, "--config", str(node.dir / "server.properties"),
        )
        procs.append(subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            preexec_fn=_pdeathsig_preexec(),
        ))
    failures = []
    for node, proc in zip(nodes, procs, strict=True):
        out, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"node {node.node_id}: {telling_line(out.decode(errors='replace'))}")
    if failures:
        raise KafkaBrokerError(f"formatting Kafka storage failed: {failures[0]}")


def spawn(java: str, libs: Path, node: KafkaNode, owner: object, stop_timeout: float) -> None:
    """Start the node's server JVM, its output appended to its log. The JVM is stopped
    when `owner` (the broker) is collected or at exit, if nothing stopped it before."""
    cmd = java_cmd(java, libs, "kafka.Kafka", str(node.dir / "server.properties"))
    if node.netns is not None:
        # `ip netns exec` execs the command in place: the pid is the JVM's.
        cmd = ["ip", "netns", "exec", node.netns, *cmd]
    with open(node.log_path, "ab") as log_file:
        try:
            node.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                # Own session: Ctrl-C reaches only us, and we stop the nodes in order.
                start_new_session=True,
                preexec_fn=_pdeathsig_preexec(),  # no orphan JVM if Python dies
            )
        except OSError as exc:
            raise KafkaBrokerError(f"cannot run {java}: {exc.strerror}") from None
    # atexit + GC safety net: the JVM is stopped even if stop() is never called.
    node.finalizer = weakref.finalize(owner, _terminate, node.proc, stop_timeout)


def terminate(nodes: Sequence[KafkaNode]) -> None:
    """SIGTERM every running node of `nodes`, and return at once."""
    for node in nodes:
        if node.running:
            assert node.proc is not None
            with contextlib.suppress(ProcessLookupError):
                node.proc.terminate()


def stop_nodes(nodes: Sequence[KafkaNode]) -> list[int]:
    """Exit codes of the nodes stopped now; nodes stopped before are skipped."""
    terminate(nodes)
    codes = []
    for node in nodes:
        if node.finalizer is not None:
            codes.append(node.finalizer())  # waits, SIGKILLs after stop_timeout, reaps
            node.finalizer = None
    return codes


def kill_quorumless(nodes: Sequence[KafkaNode], deadline: float, grace_s: float) -> None:
    """Wait until `deadline` for the nodes to end; once fewer than a majority of them are
    left, SIGKILL the rest after `grace_s`. A node still in its controlled shutdown then
    waits for a controller that is gone: a node restarted by `tidebatch broker node
    start` held KafkaBroker.stop() for the whole 20 s stop timeout that way."""
    majority = len(nodes) // 2 + 1
    lost_at: float | None = None
    while time.monotonic() < deadline:
        alive = [node for node in nodes if node.running]
        if not alive:
            return
        if len(alive) < majority:
            lost_at = lost_at if lost_at is not None else time.monotonic()
            if time.monotonic() - lost_at >= grace_s:
                for node in alive:
                    assert node.proc is not None
                    with contextlib.suppress(ProcessLookupError):
                        node.proc.kill()
                return
        time.sleep(_POLL_S)
