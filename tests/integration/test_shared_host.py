"""The shared model host (pipeline/runtime/shared_host.py, model_host.py --listen): real
host processes serving ProcessSessions (model_process.py with an address) with the
shipped CTR model, checked against ONNX Runtime in this process; sessions shared and
closed per model file; a killed host; a refused batch; the host's parent killed.
The planner and the runner alone: tests/unit/test_coalesce.py, test_host_runner.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from models.registry import load_spec
from pipeline.runtime import coalesce
from pipeline.runtime.model_process import ModelError, ModelProcessError, ProcessSession
from pipeline.runtime.session import InferenceSession
from pipeline.runtime.shared_host import SharedModelHost
from tests.integration.opsutil import wait_for
from tests.integration.test_model_process import child_ends_with_its_parent, feeds, gone

MODEL = load_spec("ctr").onnx_path
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def direct() -> InferenceSession:
    return InferenceSession(MODEL, "cpu", 1)


@pytest.fixture
def host(tmp_path: Path):
    with SharedModelHost(str(tmp_path / "host.sock"), "cpu", 1, 4096).start() as running:
        yield running


def close_to(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal but for the last bits a row gets from its place in a bigger batch."""
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=ROW_RTOL, atol=ROW_ATOL))


# A row's score in a joined call against its own batch's (1 intra-op thread, measured
# over 200 random joins of 2-5 batches of 1-199 rows, 73,908 rows): 3.0 % of rows
# differ, by at most 1.2e-7 absolute, 5.4e-6 relative (a tiny probability's last bits);
# joins of 64-row batches were bit-identical (25,600 rows). The same happens inside one
# worker whose batches vary in size: a row's last bits depend on its batch (docs/MODELS.md).
ROW_RTOL, ROW_ATOL = 2e-5, 3e-7


def test_joined_ctr_batches_score_as_separate_calls_but_for_the_last_bits(direct) -> None:
    parts = [feeds(rows, 70 + rows) for rows in (1, 7, 64, 64, 200, 512)]
    joined = direct.run(coalesce.join(parts))
    split = coalesce.split(joined, [len(p["dense"]) for p in parts])
    assert not isinstance(split, str)
    for part, got in zip(parts, split, strict=True):
        want = direct.run(part)["prob"]
        assert close_to(got["prob"], want)
        assert len(want) == 1 or not close_to(got["prob"], want[::-1])  # the check tells rows apart


def test_two_workers_share_one_session_and_get_their_own_scores(host, direct, tmp_path) -> None:
    """Two sessions in this process (two threads each) and one in another process,
    batches back to back: every batch gets in-process ONNX Runtime's scores for its own
    rows (to the last bits, see ROW_RTOL)."""
    a = ProcessSession(MODEL, "cpu", 1, address=host.address)
    b = ProcessSession(MODEL, "cpu", 1, address=host.address)
    try:
        assert a.pid == b.pid == host.pid and a.restarts == 0
        assert (a.provider, a.input_names, a.output_names) == ("cpu", ["dense", "cat"], ["prob"])
        other = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import numpy as np
            from pipeline.runtime.model_process import ProcessSession
            from pipeline.runtime.session import InferenceSession
            from tests.integration.test_model_process import feeds
            s, d = ProcessSession({str(MODEL)!r}, "cpu", 1, address={host.address!r}), InferenceSession({str(MODEL)!r}, "cpu", 1)
            for i in range(40):
                f = feeds(64, 5000 + i)
                assert np.allclose(s.run(f)["prob"], d.run(f)["prob"], rtol={ROW_RTOL}, atol={ROW_ATOL}), i
            print("ok", flush=True)
        """)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        errors: list[str] = []

        def caller(session: ProcessSession, k: int) -> None:
            for i in range(40):
                f = feeds(1 + (37 * i + k) % 128, 1000 * k + i)
                if not close_to(session.run(f)["prob"], direct.run(f)["prob"]):
                    errors.append(f"thread {k} batch {i} got other scores")

        threads = [threading.Thread(target=caller, args=(s, k)) for k, s in enumerate((a, b, a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        out, _ = other.communicate(timeout=120)
        assert not errors, errors
        assert other.returncode == 0 and out.strip() == "ok"
        stats = host.stats()
        assert stats["requests"] == stats["calls"] + stats["joined_requests"] - stats["joined_calls"] == 200
        assert stats["sessions_opened"] == 1 and stats["one_by_one_reruns"] == 0
    finally:
        a.close()
        b.close()


def test_sessions_are_shared_per_model_file_and_closed_with_their_last_user(host, tmp_path) -> None:
    second = tmp_path / "second.onnx"
    shutil.copy(MODEL, second)
    a = ProcessSession(MODEL, "cpu", 1, address=host.address)
    b = ProcessSession(MODEL, "cpu", 1, address=host.address)
    c = ProcessSession(second, "cpu", 1, address=host.address)
    handles = {s: s._channel.hello["handle"] for s in (a, b, c)}
    assert handles[a] == handles[b] != handles[c]
    users = {m["model"]: m["users"] for m in host.stats()["models"].values()}
    assert users == {str(Path(MODEL).resolve()): 2, str(second.resolve()): 1}
    f = feeds(16, 3)
    np.testing.assert_array_equal(c.run(f)["prob"], a.run(f)["prob"])
    c.close()
    wait_for(lambda: len(host.stats()["models"]) == 1, 30, "the second model's session to close")
    # a new version of a file (pipeline/versions/ writes new files; here its mtime moves)
    # is a new session; the old one stays while a worker still uses it
    os.utime(second, ns=(1, 1))
    d = ProcessSession(second, "cpu", 1, address=host.address)
    assert d._channel.hello["handle"] not in handles.values()
    a.close()
    b.close()
    d.close()
    wait_for(lambda: host.stats()["models"] == {}, 30, "every session to close")
    assert host.stats()["sessions_opened"] == 3


def test_a_refused_batch_fails_only_that_request(host, direct) -> None:
    """Out-of-range category ids join the good batches queued with them (same shapes);
    the joined call fails, its requests run again alone, and only the bad one fails."""
    good = ProcessSession(MODEL, "cpu", 1, address=host.address)
    bad = ProcessSession(MODEL, "cpu", 1, address=host.address)
    errors: list[str] = []
    refused: list[str] = []

    def send_good(k: int) -> None:
        for i in range(30):
            f = feeds(32, 100 * k + i)
            if not close_to(good.run(f)["prob"], direct.run(f)["prob"]):
                errors.append(f"{k}/{i}")

    def send_bad() -> None:
        for i in range(10):
            f = feeds(32, 900 + i)
            f["cat"][5, 3] = 10**9
            try:
                bad.run(f)
            except ModelError as exc:
                refused.append(str(exc))

    threads = [threading.Thread(target=send_good, args=(k,)) for k in range(2)] + [threading.Thread(target=send_bad)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and len(refused) == 10
        assert all("out of data bounds" in r and "\n" not in r for r in refused)
        stats = host.stats()["models"]["1"]
        assert stats["joins"] is True  # a bad batch does not stop the model joining
        f = feeds(8, 1)
        np.testing.assert_array_equal(bad.run(f)["prob"], direct.run(f)["prob"])
    finally:
        good.close()
        bad.close()


def test_a_killed_host_fails_the_batch_and_the_next_call_connects_again(host, direct) -> None:
    s = ProcessSession(MODEL, "cpu", 1, address=host.address, on_restart=lambda: restarts.append(1))
    restarts: list[int] = []
    try:
        s.run(feeds(4, 1))
        first = host.pid
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: not host.alive(), 30, "the host to die")
        with pytest.raises(ModelProcessError, match="model"):
            s.run(feeds(5, 2))
        host.restart()  # as the supervisor does; the next call waits for it up to ~30 s
        f = feeds(64, 3)
        np.testing.assert_array_equal(s.run(f)["prob"], direct.run(f)["prob"])
        assert s.restarts == 1 and restarts == [1] and s.pid == host.pid != first
    finally:
        s.close()


def test_the_next_call_waits_for_a_host_that_is_restarting(host, direct) -> None:
    s = ProcessSession(MODEL, "cpu", 1, address=host.address)
    try:
        host.stop()
        with pytest.raises(ModelProcessError):
            s.run(feeds(3, 4))
        later = threading.Thread(target=host.start)
        later.start()  # the call below retries connecting until the host listens
        f = feeds(9, 5)
        np.testing.assert_array_equal(s.run(f)["prob"], direct.run(f)["prob"])
        later.join(60)
        # the thread that started it has ended: the host lives on (no PDEATHSIG then)
        np.testing.assert_array_equal(s.run(f)["prob"], direct.run(f)["prob"])
        assert host.alive() and s.restarts == 1
    finally:
        s.close()


def test_stop_ends_the_host_and_removes_its_socket(tmp_path) -> None:
    running = SharedModelHost(str(tmp_path / "h.sock"), "cpu", 1).start()
    pid = running.pid
    assert running.alive() and running.stats()["connections"] == 1
    running.stop()
    assert gone(pid) and not running.alive() and not (tmp_path / "h.sock").exists()


def test_the_host_dies_with_its_supervisor(tmp_path) -> None:
    script = textwrap.dedent(f"""
        import time
        from pipeline.runtime.shared_host import SharedModelHost
        h = SharedModelHost({str(tmp_path / "h.sock")!r}, "cpu", 1).start()
        print(h.pid, flush=True)
        time.sleep(120)
    """)
    child_ends_with_its_parent(script, "the host to exit after its supervisor was killed")


def test_a_model_that_does_not_load_is_a_one_line_user_error(host, tmp_path) -> None:
    from pipeline.errors import UserError

    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    with pytest.raises(UserError) as info:
        ProcessSession(broken, "cpu", 1, address=host.address)
    assert "broken.onnx" in str(info.value) and "\n" not in str(info.value)
    assert host.stats()["models"] == {}


def test_workers_on_a_shared_model_host_swap_to_the_new_version_there(tmp_path):
    """Hot swap (pipeline/versions/): each worker (here two harnesses, as
    tests/unit/test_model_versions.py builds them) opens the new version's file on the shared host
    (pipeline/runtime/model_host.py --listen): the host shares it, and closes the old
    version's session once neither uses it."""
    from tests.unit.test_model_versions import Harness, _prob, _version

    repo = tmp_path / "repo"
    v1 = _version(repo, "1", seed=7)
    with SharedModelHost(str(tmp_path / "host.sock"), "cpu", 1).start() as host:
        workers = [Harness(repo, host_address=host.address) for _ in range(2)]
        try:
            assert all(isinstance(w.slot.current.session, ProcessSession) for w in workers)  # model_process is off
            assert [m["users"] for m in host.stats()["models"].values()] == [2]
            v2 = _version(repo, "2", seed=8)
            for w in workers:
                w.versions.poll()
                assert w.versions.poll().loaded == "2"
                assert w.score() == ("2", pytest.approx(_prob(v2), rel=1e-6))
            wait_for(lambda: len(host.stats()["models"]) == 1, 30, "the first version's session to close")
            (model,) = host.stats()["models"].values()
            assert (model["model"], model["users"]) == (str(v2.resolve()), 2) != (str(v1.resolve()), 2)
        finally:
            for w in workers:
                w.close()


def test_a_fixed_batch_model_is_served_one_request_at_a_time(host, tmp_path) -> None:
    """x float[1, 4] (tests/own_models.py fixed_batch): joined calls would not fit its
    batch of 1; every request still gets its own answer."""
    pytest.importorskip("onnx")
    from tests.own_models import fixed_batch

    path = fixed_batch(tmp_path / "fixed.onnx")
    sessions = [ProcessSession(path, "cpu", 1, address=host.address) for _ in range(2)]
    errors: list[str] = []

    def caller(s: ProcessSession, k: int) -> None:
        for i in range(40):
            x = np.full((1, 4), k * 100 + i, np.float32)
            if s.run({"x": x})["y"].tolist() != [[4.0 * (k * 100 + i)]]:
                errors.append(f"{k}/{i}")

    threads = [threading.Thread(target=caller, args=(s, k)) for k, s in enumerate(sessions * 2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        (model,) = host.stats()["models"].values()
        assert model["requests"] == 160
        assert model["joins"] is (model.get("one_by_one_reruns", 0) == 0)  # one failed try stops joining
        assert model.get("one_by_one_reruns", 0) <= 1
    finally:
        for s in sessions:
            s.close()


def test_a_frame_the_host_cannot_use_fails_that_request_and_nothing_else(host, direct) -> None:
    """A RUN whose arrays reach past its shared-memory slot, or name no slot the host
    has: an ERROR answer in its turn; the connection and every other one go on."""
    from pipeline.runtime import wire

    s = ProcessSession(MODEL, "cpu", 1, address=host.address)
    other = ProcessSession(MODEL, "cpu", 1, address=host.address)
    try:
        s.run(feeds(4, 1))  # slot 0 exists now (64 KiB)
        channel = s._channel
        handle = channel.hello["handle"]
        for header in ({"handle": handle, "slot": 0, "arrays": [["dense", "<f4", [100_000, 13], 0]]},
                       {"handle": handle, "slot": 9, "arrays": []},
                       {"handle": 999, "slot": None}):
            with s._send_lock:
                wire.send_frame(channel.sock, wire.RUN, header)
                ticket = channel.sent
                channel.sent += 1
            with pytest.raises(ModelError) as info:
                channel.receive(ticket)
            assert "\n" not in str(info.value)
        f = feeds(16, 2)
        np.testing.assert_array_equal(s.run(f)["prob"], direct.run(f)["prob"])
        np.testing.assert_array_equal(other.run(f)["prob"], direct.run(f)["prob"])
        assert s.restarts == other.restarts == 0
    finally:
        s.close()
        other.close()
