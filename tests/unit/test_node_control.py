"""The files through which `tidebatch broker node ...` talks to a running
`tidebatch broker --engine kafka` (consumers/brokers/node_control.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from consumers.brokers.node_control import (
    CONTROL,
    STATUS,
    ControlError,
    ControlFiles,
    parse_reply,
    parse_request,
    read_status,
    render_reply,
    render_request,
    send,
    wait_for_state,
)


class FakeTime:
    """clock and sleep for the client's waits: sleeping moves the clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def entry(node: int, state: str, **extra: object) -> dict[str, object]:
    return {"node": node, "state": state, "pid": 10 + node, "port": 9000 + node, "for_s": 1.0,
            "ended": None, "log": f"/w/node-{node}/server.log", **extra}


def test_requests_and_replies_round_trip() -> None:
    assert parse_request(render_request("kill", 2)) == ("kill", 2)
    assert parse_reply(render_reply(False, "node 2 is stopped already")) == (False, "node 2 is stopped already")


@pytest.mark.parametrize(("text", "error"), [
    ("kill 2", "request is not JSON"),
    ("[1]", "request is not a JSON object"),
    ('{"action": "reboot", "node": 2}', "unknown action 'reboot' (one of stop, kill, start)"),
    ('{"action": "stop", "node": "2"}', "node must be a number, got '2'"),
    ('{"action": "stop", "node": true}', "node must be a number, got True"),
    ('{"action": "stop"}', "node must be a number, got None"),
])
def test_bad_requests_are_refused_with_the_reason(text: str, error: str) -> None:
    with pytest.raises(ControlError) as exc:
        parse_request(text)
    assert str(exc.value) == error


def test_an_unreadable_reply_is_one_line() -> None:
    with pytest.raises(ControlError, match="unreadable reply from the broker command"):
        parse_reply("{half")


def test_no_running_command_is_said_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match=f"no broker command is running for {tmp_path}"):
        send(tmp_path, "stop", 1)


def test_a_status_left_by_a_dead_command_is_not_believed(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(gone.stdout)
    (tmp_path / CONTROL).mkdir()
    (tmp_path / CONTROL / STATUS).write_text(json.dumps({"pid": pid, "nodes": []}))
    with pytest.raises(ControlError, match=rf"the broker command for .* \(pid {pid}\) is gone"):
        read_status(tmp_path)


def test_a_request_is_answered_by_the_command_side(tmp_path: Path) -> None:
    """The command's side (ControlFiles, here on a thread) takes the request and replies;
    the client gets the message, or the refusal as ControlError."""
    files = ControlFiles(tmp_path)
    files.open()
    files.write_status({"nodes": [entry(1, "running")]})
    seen: list[tuple[str, int]] = []
    answers = iter([(True, "killed node 1 (SIGKILL)"), (False, "node 1 is stopped already")])
    done = threading.Event()

    def command_side() -> None:
        while not done.is_set():
            for rid, text in files.take_requests():
                seen.append(parse_request(text))
                files.reply(rid, *next(answers))
            done.wait(0.01)

    thread = threading.Thread(target=command_side)
    thread.start()
    try:
        assert send(tmp_path, "kill", 1) == "killed node 1 (SIGKILL)"
        with pytest.raises(ControlError, match="node 1 is stopped already"):
            send(tmp_path, "kill", 1)
    finally:
        done.set()
        thread.join()
    assert seen == [("kill", 1), ("kill", 1)]
    assert list((tmp_path / CONTROL / "replies").iterdir()) == []  # the client took its replies
    files.close()
    with pytest.raises(ControlError, match="no broker command is running"):
        read_status(tmp_path)


def test_a_command_that_does_not_answer_times_out_and_the_request_is_withdrawn(tmp_path: Path) -> None:
    files = ControlFiles(tmp_path)
    files.open()
    files.write_status({"nodes": [entry(1, "running")]})
    t = FakeTime()
    with pytest.raises(ControlError, match="did not answer within 10 s"):
        send(tmp_path, "stop", 1, clock=t.clock, sleep=t.sleep)
    assert list(files.take_requests()) == []


def test_open_drops_requests_left_by_an_earlier_command(tmp_path: Path) -> None:
    old = tmp_path / CONTROL / "requests"
    old.mkdir(parents=True)
    (old / "1-old.json").write_text(render_request("kill", 1))
    ControlFiles(tmp_path).open()
    assert list(old.iterdir()) == []


def test_waiting_for_a_state(tmp_path: Path) -> None:
    files = ControlFiles(tmp_path)
    files.open()
    t = FakeTime()
    files.write_status({"nodes": [entry(2, "running")]})
    assert wait_for_state(tmp_path, "start", 2, timeout=5, clock=t.clock, sleep=t.sleep)["state"] == "running"
    files.write_status({"nodes": [entry(2, "dead", ended="exit code 1")]})
    with pytest.raises(ControlError, match=r"node 2 is dead \(exit code 1\), not running; see /w/node-2/server.log"):
        wait_for_state(tmp_path, "start", 2, timeout=5, clock=t.clock, sleep=t.sleep)
    assert wait_for_state(tmp_path, "kill", 2, timeout=5, clock=t.clock, sleep=t.sleep)["state"] == "dead"
    files.write_status({"nodes": [entry(2, "stopping")]})
    with pytest.raises(ControlError, match="node 2 still stopping after 5 s"):
        wait_for_state(tmp_path, "stop", 2, timeout=5, clock=t.clock, sleep=t.sleep)
    with pytest.raises(ControlError, match="no node 3"):
        wait_for_state(tmp_path, "stop", 3, timeout=5, clock=t.clock, sleep=t.sleep)


def test_the_status_names_the_command(tmp_path: Path) -> None:
    files = ControlFiles(tmp_path)
    files.open()
    files.write_status({"bootstrap_servers": "127.0.0.1:1", "nodes": []})
    assert read_status(tmp_path) == {"pid": os.getpid(), "bootstrap_servers": "127.0.0.1:1", "nodes": []}
