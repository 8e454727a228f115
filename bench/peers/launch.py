"""The rows of bench/peers.py and how each is started: every peer is a process of its
own reading one input topic and writing one result per request to one output topic,
so the bench measures them all alike (its CPU from /proc, its results from Kafka).

tidebatch's rows are `tidebatch run` processes (bench/harness.py, worker_process);
tidebatch's Faust path is examples/faust_ctr/app.py (what the Faust-against-worker
script ran before it was folded in here, commit b2255fa); the peers are the scripts
beside this file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import OUT, REPO, profile_of, stop_process, worker_process
from consumers.brokers.embedded import free_port

HERE = Path(__file__).resolve().parent
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"
# A drain's backlog is older than any SLO: lifted for tidebatch's drains, or adaptive
# would rightly route the whole backlog late instead of scoring it (bench/policies.py).
NO_SLO = {"TIDEBATCH_BATCHING__SLO_MS": "3600000"}


@dataclass(frozen=True)
class Peer:
    name: str
    label: str
    kind: str  # "script" (a peer beside this file), "faust" (a Faust app module), "tidebatch"
    target: str  # the script, the app module, or the policy
    mode: str = ""
    peers_venv: bool = False  # runs in .venv-peers (bench/peers/setup.sh)
    encodings: tuple[str, ...] = ("json",)
    env: dict[str, str] = field(default_factory=dict)

    def available(self) -> bool:
        return not self.peers_venv or PEERS_PYTHON.exists()


PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("loop-poll", "plain loop, poll() 1 request, 1 ORT call each", "script", "plain_loop.py", "poll"),
    Peer("loop-64", "plain loop, consume(64, 10 ms), 1 ORT call per list", "script", "plain_loop.py", "consume64",
         encodings=("json", "binary")),
    Peer("loop-512", "plain loop, consume(512, 10 ms), 1 ORT call per list", "script", "plain_loop.py", "consume512",
         encodings=("json", "binary")),
    Peer("quix-message", "quixstreams 3.28, sdf.apply per message", "script", "quix_app.py", "message",
         peers_venv=True),
    Peer("quix-window", "quixstreams 3.28, group_by + tumbling_window(10 ms).collect()", "script", "quix_app.py",
         "window", peers_venv=True),
    Peer("bytewax", "Bytewax 0.21, collect(512, 10 ms)", "script", "bytewax_flow.py", "collect512",
         peers_venv=True, encodings=("json", "binary")),
    Peer("faust-take", "Faust, stream.take(512, within=10 ms)", "faust", "bench.peers.faust_take"),
    Peer("tidebatch-faust", "tidebatch's Faust path (adaptive_batches)", "faust", "examples.faust_ctr.app"),
    Peer("tidebatch-static", "tidebatch run --policy static (defaults)", "tidebatch", "static",
         encodings=("json", "binary")),
    Peer("tidebatch-adaptive", "tidebatch run --policy adaptive", "tidebatch", "adaptive",
         encodings=("json", "binary")),
    Peer("tidebatch-adaptive-route", "tidebatch run --policy adaptive, batching.expiry_action route_late",
         "tidebatch", "adaptive", env={"TIDEBATCH_BATCHING__EXPIRY_ACTION": "route_late"}),
    Peer("tidebatch-p2", "tidebatch run --policy adaptive --processes 2", "tidebatch", "adaptive",
         encodings=("json", "binary"), env={"TIDEBATCH_RUNTIME__PROCESSES": "2"}),
    Peer("tidebatch-static-p2", "tidebatch run --policy static --processes 2", "tidebatch", "static",
         encodings=("json", "binary"), env={"TIDEBATCH_RUNTIME__PROCESSES": "2"}),
    Peer("tidebatch-kafka-python", "tidebatch run --policy adaptive, client kafka-python", "tidebatch", "adaptive",
         env={"TIDEBATCH_CLIENT": "kafka-python"}),
)}
# Rows run by default; tidebatch's other paths (Faust, kafka-python) are rows on
# request (--only), as the Faust-against-worker script compared them before it was folded in,
# and so is adaptive shedding what it cannot answer in time (bench/policies.py runs
# adaptive so): every other row scores every request, the job of bench/peers.py.
# The -p2 rows are `run --processes 2` (issue 46, docs/OPERATIONS.md "Many processes on
# one host"); every other tidebatch row is one process.
DEFAULT = [n for n in PEERS if n not in ("tidebatch-faust", "tidebatch-kafka-python", "tidebatch-adaptive-route")]


@contextmanager
def peer_process(peer: Peer, bootstrap: str, inp: str, out: str, *, drain: bool, log_name: str,
                 threads: int = 1, on_spawn: Callable[[subprocess.Popen], None] | None = None,
                 ) -> Iterator[subprocess.Popen]:
    """The peer consuming `inp` into `out`, stopped (SIGTERM, then SIGKILL) on exit.
    drain=True: tidebatch's SLO is lifted (NO_SLO). on_spawn: called with the process as
    soon as it exists (tidebatch's rows are yielded only once they have partitions)."""
    if peer.kind == "tidebatch":
        env = {**(NO_SLO if drain else {}), "TIDEBATCH_RUNTIME__INTRA_OP_THREADS": str(threads),
               "TIDEBATCH_RUNTIME__PROCESSES": "1", **peer.env}  # not auto: each row is what it says
        with worker_process(bootstrap, inp, out, peer.target, extra_env=env, log_name=log_name,
                            on_spawn=on_spawn) as proc:
            yield proc
        return
    group = f"peer-{peer.name}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    datadir = None
    if peer.kind == "faust":
        datadir = tempfile.mkdtemp(prefix="faust-data-")  # Faust's per-app state; nothing kept
        env.update(_faust_env(peer, bootstrap, inp, out, group, threads))
        cmd = [sys.executable, "-m", "faust", "--datadir", datadir, "-A", peer.target, "worker", "-l", "warn",
               "--web-port", str(free_port()), "--web-host", "127.0.0.1"]
    else:
        python = str(PEERS_PYTHON) if peer.peers_venv else sys.executable
        cmd = [python, str(HERE / peer.target), "--mode", peer.mode, "--bootstrap", bootstrap,
               "--profile", profile_of(bootstrap), "--input", inp, "--output", out, "--group", group,
               "--threads", str(threads)]
    with open(OUT / f"{log_name}.log", "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    proc.log_path = OUT / f"{log_name}.log"  # type: ignore[attr-defined]
    try:
        if on_spawn is not None:
            on_spawn(proc)
        yield proc
    finally:
        stop_process(proc, 20.0)
        if datadir:
            shutil.rmtree(datadir, ignore_errors=True)


def _faust_env(peer: Peer, bootstrap: str, inp: str, out: str, group: str, threads: int) -> dict[str, str]:
    """The environment of a Faust app: the peer's (faust_take.py) or tidebatch's example."""
    profile = profile_of(bootstrap)
    if peer.target == "examples.faust_ctr.app":
        return {"TIDEBATCH_FAUST_BROKER": f"kafka://{bootstrap}", "TIDEBATCH_FAUST_BROKER_PROFILE": profile,
                "TIDEBATCH_FAUST_APP_ID": group, "TIDEBATCH_FAUST_INPUT": inp, "TIDEBATCH_FAUST_OUTPUT": out,
                "TIDEBATCH_FAUST_PROVIDERS": "cpu"}
    return {"PEER_BROKER": f"kafka://{bootstrap}", "PEER_PROFILE": profile, "PEER_APP_ID": group,
            "PEER_INPUT": inp, "PEER_OUTPUT": out, "PEER_THREADS": str(threads)}


