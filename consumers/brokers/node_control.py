"""How `tidebatch broker node stop|kill|start N` and `... node status` talk to a running
`tidebatch broker --engine kafka`: files in a `control/` folder of the broker's work
directory, which the running command looks at every half second
(consumers/brokers/node_supervisor.py). Files, not a socket: nothing to serve from a
thread (a JVM must be spawned from the main thread for its parent-death signal,
consumers/brokers/embedded.py _pdeathsig_preexec), no path-length limit, and a client can
read the status even while the command is busy.

    control/nodes.json          the command's pid and each node's state; rewritten
                                (atomically) every tick, removed when the command ends
    control/requests/<id>.json  {"action": "stop", "node": 2}, written by the client
    control/replies/<id>.json   {"ok": true, "message": "..."}, the command's answer

docs/BROKERS.md ("Faulting a local cluster") describes the commands.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from consumers.brokers.embedded import BrokerError
from consumers.brokers.node_states import ACTIONS

CONTROL = "control"
STATUS = "nodes.json"
REQUESTS = "requests"
REPLIES = "replies"


class ControlError(BrokerError):
    """A node command that cannot be sent or was refused (one line, exit 2)."""


# ----------------------------------------------------------------------------- protocol
def render_request(action: str, node: int) -> str:
    return json.dumps({"action": action, "node": node})


def parse_request(text: str) -> tuple[str, int]:
    """(action, node) of a request file; ControlError with the reason for anything else."""
    try:
        obj = json.loads(text)
    except ValueError:
        raise ControlError("request is not JSON") from None
    if not isinstance(obj, dict):
        raise ControlError("request is not a JSON object")
    action, node = obj.get("action"), obj.get("node")
    if action not in ACTIONS:
        raise ControlError(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")
    if isinstance(node, bool) or not isinstance(node, int):
        raise ControlError(f"node must be a number, got {node!r}")
    return action, node


def render_reply(ok: bool, message: str) -> str:
    return json.dumps({"ok": ok, "message": message})


def parse_reply(text: str) -> tuple[bool, str]:
    try:
        obj = json.loads(text)
        return bool(obj["ok"]), str(obj["message"])
    except (ValueError, KeyError, TypeError):
        raise ControlError(f"unreadable reply from the broker command: {text[:80]!r}") from None


def _write_atomically(path: Path, text: str) -> None:
    """Readers never see half a file: write aside, then rename over."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- the command's side
class ControlFiles:
    """The running command's end: takes requests, writes replies and the status."""

    def __init__(self, workdir: Path) -> None:
        self.dir = Path(workdir) / CONTROL

    def open(self) -> None:
        """Create the folders; requests left by an earlier command are dropped unanswered
        (their clients gave up or were refused when that command ended)."""
        for sub in (REQUESTS, REPLIES):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
            for old in (self.dir / sub).glob("*.json"):
                old.unlink(missing_ok=True)

    def take_requests(self) -> Iterator[tuple[str, str]]:
        """(request id, text) of each waiting request, oldest first; each file is removed."""
        paths = sorted((self.dir / REQUESTS).glob("*.json"), key=_mtime)
        for path in paths:
            try:
                text = path.read_text()
            except OSError:
                continue  # the client removed it (it gave up)
            path.unlink(missing_ok=True)
            yield path.stem, text

    def reply(self, request_id: str, ok: bool, message: str) -> None:
        _write_atomically(self.dir / REPLIES / f"{request_id}.json", render_reply(ok, message))

    def write_status(self, status: Mapping[str, Any]) -> None:
        _write_atomically(self.dir / STATUS, json.dumps({"pid": os.getpid(), **status}))

    def close(self) -> None:
        """The command ends: clients find no status, so they say no command runs."""
        (self.dir / STATUS).unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# ----------------------------------------------------------------------------- the client's side
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


def read_status(workdir: Path) -> dict[str, Any]:
    """The running command's status; ControlError when none runs for `workdir`."""
    path = Path(workdir) / CONTROL / STATUS
    try:
        status = json.loads(path.read_text())
    except FileNotFoundError:
        raise ControlError(f"no broker command is running for {workdir} (no {path})") from None
    except (OSError, ValueError) as exc:
        raise ControlError(f"cannot read {path}: {exc}") from None
    if not _alive(int(status.get("pid", 0))):
        raise ControlError(f"the broker command for {workdir} (pid {status.get('pid')}) is gone")
    return status


def send(
    workdir: Path,
    action: str,
    node: int,
    *,
    timeout: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Ask the running command to `action` node `node`; its reply's message, or
    ControlError with the refusal. The command answers within a tick (0.5 s): starting,
    stopping and killing are only begun by then (wait_for_state waits for their end)."""
    read_status(workdir)  # fails fast when no command runs
    control = Path(workdir) / CONTROL
    request_id = f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"
    request = control / REQUESTS / f"{request_id}.json"
    reply = control / REPLIES / f"{request_id}.json"
    _write_atomically(request, render_request(action, node))
    deadline = clock() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            text = reply.read_text()
            reply.unlink(missing_ok=True)
            ok, message = parse_reply(text)
            if not ok:
                raise ControlError(message)
            return message
        if clock() >= deadline:
            request.unlink(missing_ok=True)
            read_status(workdir)  # says so if the command died meanwhile
            raise ControlError(f"the broker command did not answer within {timeout:g} s")
        sleep(0.05)


# What each action waits for: the states that end it well, and those that end it badly.
_TARGETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "start": (("running",), ("dead", "stopped")),
    "stop": (("stopped", "dead"), ()),
    "kill": (("stopped", "dead"), ()),
}


def node_entry(status: Mapping[str, Any], node: int) -> dict[str, Any]:
    for entry in status.get("nodes", []):
        if entry.get("node") == node:
            return dict(entry)
    raise ControlError(f"no node {node} in the broker command's status")


def wait_for_state(
    workdir: Path,
    action: str,
    node: int,
    *,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Wait until `node` is where `action` takes it (start: running; stop, kill: stopped
    or dead); its status entry. ControlError if it ends elsewhere or takes too long."""
    good, bad = _TARGETS[action]
    deadline = clock() + timeout
    while True:
        entry = node_entry(read_status(workdir), node)
        if entry["state"] in good:
            return entry
        if entry["state"] in bad:
            ended = f" ({entry['ended']})" if entry.get("ended") else ""
            raise ControlError(f"node {node} is {entry['state']}{ended}, not running; see {entry['log']}")
        if clock() >= deadline:
            raise ControlError(f"node {node} still {entry['state']} after {timeout:g} s; see {entry['log']}")
        sleep(0.2)
