"""The `generate` pipeline end to end on the embedded broker (issue 25 items 2-3):
`tidebatch generate` as a process, requests in, token chunks and one final record per
request out, bad requests to the DLQ with one line each; and a worker SIGKILLed
mid-generation whose successor generates the unfinished requests again, every request
answered, repeated output marked by its attempt id (pipeline/generation/records.py,
docs/GENERATION.md "Delivery")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from models.decoder import tokenizer
from pipeline.generation.budget import KvBudget
from pipeline.generation.policies import make_generation_policy
from pipeline.generation.runner import DecoderRunner, gen_request, open_decoder
from pipeline.generation.scheduler import GenerationScheduler
from pipeline.generation.stream import Generation
from tests.integration.opsutil import ConsumerThread
from tests.integration.pipeline_helpers import REPO, produce_values, read_topic

pytestmark = pytest.mark.parametrize("broker", ["embedded"], indirect=True)

PROMPTS = ["Kafka ", "The scheduler ", "A worker ", "## Delivery\n\n", "Offsets ", "The model "]


def _requests(n: int, lengths: list[int], prefix: str) -> list[dict]:
    return [{"request_id": f"{prefix}-{i}", "prompt": PROMPTS[i % len(PROMPTS)],
             "max_new_tokens": lengths[i % len(lengths)]} for i in range(n)]


def _greedy(reqs: list[dict]) -> dict[str, str]:
    """Each request's text decoded alone, straight on the runner: what the pipeline
    must stream, batched with others or not."""
    session, shape = open_decoder("cpu")
    out = {}
    for r in reqs:
        gen = Generation(r["request_id"], tokenizer.encode(r["prompt"]), r["max_new_tokens"])
        sched = GenerationScheduler(make_generation_policy("none"), KvBudget(1, shape.context))
        runner = DecoderRunner(session, shape, 1)
        sched.submit(gen_request(gen, 0.0, 1e9))
        while sched.has_work:
            plan = sched.plan(0.0)
            sched.complete(plan, 0.0, runner.run(plan).stopped)
        out[r["request_id"]] = gen.text
    return out


class _Reader(ConsumerThread):
    """Every record of the output topic, decoded, as it arrives."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from consumers.profiles import consumer_config

        self.docs: list[dict] = []
        c = Consumer(consumer_config("embedded", bootstrap, f"reader-{time.monotonic_ns()}"))
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        super().__init__(c, "generate-reader")

    def _add(self, m: Any) -> None:
        self.docs.append(orjson.loads(m.value()))

    def finals(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = defaultdict(list)
        for d in list(self.docs):
            if d["final"]:
                out[d["request_id"]].append(d)
        return out

    def chunks(self) -> dict[tuple[str, str], list[dict]]:
        out: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for d in list(self.docs):
            if not d["final"]:
                out[(d["request_id"], d["attempt"])].append(d)
        return out


def _start(broker: Any, topics: dict[str, str], group: str, log: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipeline.cli", "generate", "--bootstrap-servers", broker.bootstrap_servers,
           "--broker-profile", broker.profile, "--group-id", group, "--input-topic", topics["input"],
           "--output-topic", topics["output"], "--no-create-topics", "--metrics-port", "0", *args]
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=f,
                                stderr=subprocess.STDOUT)


def _wait(pred: Any, timeout: float, what: str, proc: subprocess.Popen, log: Path) -> None:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if pred():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise AssertionError(f"{what} (worker rc {proc.poll()}):\n{tail}")


def _ops_url(log: Path) -> str | None:
    """The ops server's base URL, from the line the worker prints when it listens."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("tidebatch generate metrics: "):
            return line.split(": ", 1)[1].removesuffix("/metrics")
    return None


def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _topics(topic_factory: Any) -> dict[str, str]:
    inp = topic_factory("gen-in")
    return {"input": inp, "output": topic_factory("gen-out"), "dlq": topic_factory(f"{inp}.dlq", exact=True)}


def _check_attempt(chunks: list[dict], final_text: str) -> None:
    """One attempt's chunks: in order, contiguous, each a piece of the final text."""
    assert [c["seq"] for c in chunks] == list(range(len(chunks)))
    data = final_text.encode()
    offset = 0
    for c in chunks:
        assert c["offset"] == offset
        piece = c["text"].encode()
        assert data[offset:offset + len(piece)] == piece
        offset += len(piece)


def _stop(proc: subprocess.Popen, log: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(30) == 0, log.read_text(errors="replace")[-3000:]
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


def test_every_request_gets_its_chunks_in_order_and_one_final_record(broker, topic_factory, unique_group_id,
                                                                     tmp_path) -> None:
    topics = _topics(topic_factory)
    reqs = _requests(20, [3, 40, 9, 120, 17, 64, 1, 90], "ok")
    bad = [b"", b"{not json", orjson.dumps({"prompt": "", "max_new_tokens": 5}),
           orjson.dumps({"prompt": "x", "max_new_tokens": 0}),
           orjson.dumps({"prompt": "x", "max_new_tokens": 100000}),
           orjson.dumps({"prompt": "y" * 300, "max_new_tokens": 5})]
    expected = _greedy(reqs)
    reader = _Reader(broker.bootstrap_servers, topics["output"])
    log = tmp_path / "worker.log"
    proc = _start(broker, topics, unique_group_id, log, "--policy", "continuous", "--max-slots", "6",
                  "--chunk-tokens", "8", "--flush-ms", "20")
    try:
        values = [(r["request_id"].encode(), orjson.dumps(r)) for r in reqs[:10]]
        values += [(None, b) for b in bad] + [(r["request_id"].encode(), orjson.dumps(r)) for r in reqs[10:]]
        produce_values(broker.bootstrap_servers, topics["input"], values)
        _wait(lambda: len(reader.finals()) >= len(reqs), 50, "every request's final record", proc, log)
        # The ops endpoints of the generate worker (pipeline/generation/ops.py).
        url = _ops_url(log)
        assert url is not None, log.read_text(errors="replace")[-2000:]
        _wait(lambda: _get(url + "/readyz")[0] == 200, 20, "/readyz answering 200", proc, log)
        assert _get(url + "/healthz")[0] == 200
        code, metrics = _get(url + "/metrics")
        assert code == 200
        assert 'tidebatch_ready{pipeline="generate"} 1.0' in metrics
        assert 'tidebatch_slo_seconds{pipeline="generate"} 30.0' in metrics  # the admission deadline
        generated = [ln for ln in metrics.splitlines() if ln.startswith("tidebatch_records_total{")
                     and 'outcome="generated"' in ln]
        assert generated and float(generated[0].rsplit(" ", 1)[1]) == len(reqs), generated
        code, model = _get(url + "/model")
        assert code == 200 and orjson.loads(model)["model"] == "decoder_tiny"
        code, stats = _get(url + "/api/stats")
        assert code == 200 and orjson.loads(stats)["worker"]["pipeline"] == "generate"
        _stop(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.close()
    finals, chunks = reader.finals(), reader.chunks()
    assert set(finals) == set(expected)
    for rid, text in expected.items():
        (final,) = finals[rid]
        assert final["text"] == text, rid
        assert final["finish_reason"] in ("length", "stop")
        assert final["ttft_ms"] is not None and final["ttft_ms"] >= 0
        mine = chunks.get((rid, final["attempt"]), [])
        assert len(mine) == final["chunks"]
        _check_attempt(mine, text)
        assert "".join(c["text"] for c in mine) == text
    letters = read_topic(broker.bootstrap_servers, topics["dlq"], len(bad), timeout=20)
    assert len(letters) == len(bad)
    reasons = [dict(m.headers())["tidebatch.error"].decode() for m in letters]
    assert all(r and "\n" not in r for r in reasons)
    joined = " | ".join(reasons)
    for why in ("empty record", "not JSON", "empty prompt", "max_new_tokens must be in 1..", "context"):
        assert why in joined, joined


@pytest.mark.parametrize("round_", range(int(os.environ.get("TIDEBATCH_GENERATE_KILL_ROUNDS", "1"))))
def test_a_worker_killed_mid_generation_loses_no_request(broker, topic_factory, unique_group_id, tmp_path,
                                                         round_) -> None:
    topics = _topics(topic_factory)
    reqs = _requests(20, [150, 60, 200, 90, 120], f"k{round_}")
    expected = _greedy(reqs)
    reader = _Reader(broker.bootstrap_servers, topics["output"])
    log = tmp_path / "worker.log"
    # One sequence at a time: slow enough that the kill lands mid-stream.
    args = ("--policy", "none", "--max-slots", "1", "--chunk-tokens", "16", "--flush-ms", "20")
    first = _start(broker, topics, unique_group_id, log, *args)
    second = None
    try:
        produce_values(broker.bootstrap_servers, topics["input"],
                       [(r["request_id"].encode(), orjson.dumps(r)) for r in reqs])
        _wait(lambda: len(reader.finals()) >= 4, 40, "four final records before the kill", first, log)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = _start(broker, topics, unique_group_id, log, *args)
        _wait(lambda: len(reader.finals()) >= len(reqs), 50, "every request's final after the restart", second, log)
        _stop(second, log)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
        reader.close()
    finals, chunks = reader.finals(), reader.chunks()
    assert set(finals) == set(expected)  # no request lost
    repeated, cut = 0, 0
    for rid, text in expected.items():
        assert all(f["text"] == text for f in finals[rid]), rid
        finished = {f["attempt"] for f in finals[rid]}
        attempts = {a for (r, a) in chunks if r == rid} | finished
        repeated += len(attempts) > 1
        cut += len(attempts - finished)  # streamed, then the worker died: no final for it
        for attempt in attempts:  # every attempt streams from seq 0, offset 0, the same text
            _check_attempt(chunks.get((rid, attempt), []), text)
    assert repeated >= 1, "nothing was generated twice: the kill did not land mid-generation"
    print(f"GENERATE-KILL round {round_}: {repeated} requests generated again under a new attempt, "
          f"{cut} attempts cut short, {sum(len(f) - 1 for f in finals.values())} repeated finals, "
          f"{len(reader.docs)} records")


def test_produce_generate_feeds_a_worker_that_answers_every_request(broker, topic_factory, unique_group_id,
                                                                    tmp_path) -> None:
    """`tidebatch produce generate` (pipeline/loadgen/generate.py) against a real
    worker: every request it sends is one the worker takes, and each gets one final."""
    topics = _topics(topic_factory)
    reader = _Reader(broker.bootstrap_servers, topics["output"])
    log = tmp_path / "worker.log"
    proc = _start(broker, topics, unique_group_id, log, "--policy", "continuous", "--max-slots", "8")
    try:
        sent = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "produce", "generate", "--bootstrap-servers",
             broker.bootstrap_servers, "--broker-profile", broker.profile, "--topic", topics["input"],
             "--partitions", "1", "--count", "24", "--rate", "200", "--seed", "4", "--output-tokens", "loguniform:4:40", "--quiet"],
            cwd=REPO, capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        assert f"sent 24 generate requests to {topics['input']}" in sent.stdout
        _wait(lambda: len(reader.finals()) >= 24, 50, "every produced request's final record", proc, log)
        _stop(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.close()
    finals = reader.finals()
    assert set(finals) == {f"gen-4-{i}" for i in range(24)}
    assert all(len(f) == 1 and f[0]["finish_reason"] in ("length", "stop") for f in finals.values())
    assert all(1 <= f[0]["generated_tokens"] <= 40 for f in finals.values())
    assert read_topic(broker.bootstrap_servers, topics["dlq"], 1, timeout=2) == []
