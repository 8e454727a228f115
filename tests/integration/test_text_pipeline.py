"""Issue "Text requests": the text pipeline's guarantees, on the real embedded broker
with a real Worker (text.requests -> MiniLM -> text.embeddings)."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import numpy as np
import onnxruntime as ort
import orjson
import pytest

from consumers.dead_letter import H_ERROR, H_OFFSET, H_STAGE, H_TOPIC
from models.text.model import EMBEDDING_DIM, ensure_text_model
from pipeline.codecs.text import TextCodec
from pipeline.loadgen.text import TextRequestFactory
from tests.integration.pipeline_helpers import (
    REPO,
    produce_values,
    read_topic,
    result_docs,
    running_worker,
    wait_for,
    worker_config,
)

SLO_MS = 120_000  # far above any queueing here: these tests are about results
STANDARD_FIELDS = {
    "request_id", "key", "model", "model_version", "batch_rows", "queue_wait_ms", "inference_ms",
    "kafka_ts_ms", "scored_at_ms", "priority", "late", "source",
}


@pytest.fixture(scope="module")
def reference_session() -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(ensure_text_model()), opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec()


def single_request_embedding(session: ort.InferenceSession, codec: TextCodec, value: bytes) -> np.ndarray:
    """The same model on this one request alone: decode -> collate([one]) -> ORT."""
    decoded = codec.decode(value, {})
    return session.run(["embedding"], codec.collate([decoded.payload]))[0][0]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def text_config(broker, inp: str, out: str, group: str, policy: str = "adaptive", **extra):
    return worker_config(
        broker.bootstrap_servers, inp, out, group, pipeline="text", dlq_topic=f"{inp}.dlq",
        late_topic=f"{inp}.late", batching={"slo_ms": SLO_MS, "policy": policy}, **extra,
    )


def fresh_topics(topic_factory, prefix: str) -> tuple[str, str]:
    inp = topic_factory(prefix, partitions=1)
    out = topic_factory(f"{prefix}-emb", partitions=1)
    topic_factory(f"{inp}.dlq", exact=True)
    topic_factory(f"{inp}.late", exact=True)
    return inp, out


def test_embeddings_equal_single_request_runs_whatever_bucket_and_padding(
    broker, topic_factory, unique_group_id, reference_session, codec
) -> None:
    inp, out = fresh_topics(topic_factory, "text-eq")
    factory = TextRequestFactory(seed=31)
    requests = [factory.make(i) for i in range(48)]  # the generator's mixed lengths
    buckets = {codec.decode(v, {}).bucket for _, v in requests}
    assert len(buckets) >= 4, buckets  # short chat lines to truncated reviews
    # greedy: whatever is queued in a bucket shares a batch. (adaptive, the default, runs
    # MiniLM one request at a time on this CPU, where batching buys no throughput.)
    cfg = text_config(broker, inp, out, unique_group_id, policy="greedy")
    with running_worker(cfg) as worker:
        produce_values(broker.bootstrap_servers, inp, requests)  # one burst: batches form
        docs = result_docs(read_topic(broker.bootstrap_servers, out, len(requests), timeout=90))
        assert worker.stats.dlq == 0
    assert len(docs) == len(requests)
    by_id = {d["request_id"]: d for d in docs}
    batched_buckets = set()
    worst = 1.0
    for key, value in requests:
        doc = by_id[orjson.loads(value)["request_id"]]
        assert STANDARD_FIELDS | {"embedding", "tokens", "truncated", "tenant"} <= set(doc)
        assert doc["key"] == key.decode()
        got = np.asarray(doc["embedding"], dtype=np.float32)
        assert got.shape == (EMBEDDING_DIM,)
        worst = min(worst, cosine(got, single_request_embedding(reference_session, codec, value)))
        if doc["batch_rows"] > 1:
            batched_buckets.add(codec.bucket_for(doc["tokens"]))
    assert worst >= 0.9999, f"batched embedding differs from the single run: cosine {worst}"
    # Batches of several requests really formed, in more than one length bucket.
    assert len(batched_buckets) >= 2, batched_buckets


def test_padding_to_the_longest_request_gives_the_same_embeddings(
    broker, topic_factory, unique_group_id, reference_session, codec
) -> None:
    """The unbucketed baseline (codec option pad_to=longest, bench/camera_text.py):
    mixed lengths share batches, padded with masks; embeddings are unchanged."""
    inp, out = fresh_topics(topic_factory, "text-longest")
    factory = TextRequestFactory(seed=32)
    requests = [factory.make(i) for i in range(10)]
    cfg = text_config(
        broker, inp, out, unique_group_id, policy="greedy", codec={"pad_to": "longest"},
        runtime={"warmup": False},  # profiling mixed lengths padded to the longest is slow
    )
    with running_worker(cfg):
        produce_values(broker.bootstrap_servers, inp, requests)
        docs = result_docs(read_topic(broker.bootstrap_servers, out, len(requests), timeout=90))
    assert len(docs) == len(requests)
    by_id = {d["request_id"]: d for d in docs}
    for _, value in requests:
        doc = by_id[orjson.loads(value)["request_id"]]
        expected = single_request_embedding(reference_session, codec, value)
        assert cosine(np.asarray(doc["embedding"]), expected) >= 0.9999
    assert max(d["batch_rows"] for d in docs) > 1


def test_bad_and_extreme_texts_get_a_clear_outcome_and_the_worker_keeps_going(
    broker, topic_factory, unique_group_id, reference_session, codec
) -> None:
    inp, out = fresh_topics(topic_factory, "text-bad")
    dlq = f"{inp}.dlq"
    factory = TextRequestFactory(seed=33)
    long_text = " ".join(["the battery lasts for weeks and the screen is sharp"] * 200)  # ~2,000 tokens
    long_value = orjson.dumps({"request_id": "very-long", "text": long_text})
    # kind -> (value, reason in the DLQ)
    bad = {
        "empty_text": (factory.make_invalid("empty_text")[1], "text: empty string"),
        "over_max_chars": (factory.make_invalid("overlong")[1], "text: 100001 characters exceeds max_chars=100000"),
        "non_utf8": (factory.make_invalid("non_utf8")[1], "value: invalid UTF-8 at byte"),
        "missing_text": (factory.make_invalid("missing_text")[1], "text: missing"),
        "missing_request_id": (orjson.dumps({"text": "hello"}), "request_id: missing"),
        "tombstone": (None, "value: missing (tombstone)"),
        "whitespace_only": (orjson.dumps({"request_id": "ws", "text": " \t\n "}), "text: no tokens"),
    }
    items: list[tuple[bytes | None, bytes | None]] = [factory.make(0), (b"long", long_value)]
    items += [(kind.encode(), value) for kind, (value, _) in bad.items()]
    items.append(factory.make(1))  # a valid request after all of them
    cfg = text_config(broker, inp, out, unique_group_id)
    with running_worker(cfg) as worker:
        produce_values(broker.bootstrap_servers, inp, items)
        dead = read_topic(broker.bootstrap_servers, dlq, len(bad), timeout=60)
        docs = result_docs(read_topic(broker.bootstrap_servers, out, 3, timeout=60))
        wait_for(lambda: worker.tracker.pending() == 0, 30, "offsets left pending")
    assert sorted(d["request_id"] for d in docs) == sorted(["text-33-0", "very-long", "text-33-1"])
    # Far over the model's 256 tokens: a defined truncation (the first 254 word pieces
    # plus [SEP]), flagged, and the same embedding as a single run of the same request.
    long_doc = next(d for d in docs if d["request_id"] == "very-long")
    assert long_doc["truncated"] is True and long_doc["tokens"] == 256
    expected = single_request_embedding(reference_session, codec, long_value)
    assert cosine(np.asarray(long_doc["embedding"]), expected) >= 0.9999
    assert len(dead) == len(bad)
    reasons = {}
    for m in dead:
        headers = dict(m.headers())
        assert headers[H_STAGE] == b"decode" and headers[H_TOPIC].decode() == inp
        reasons[m.key().decode()] = headers[H_ERROR].decode()
        assert m.value() == items[int(headers[H_OFFSET])][1]  # original bytes, for replay
    for kind, (_, reason) in bad.items():
        assert reason in reasons[kind], (kind, reasons[kind])


def test_produce_text_cli_sends_valid_mixed_length_requests(broker, topic_factory, codec) -> None:
    topic = topic_factory("text-cli", partitions=2)
    n = 20
    cmd = [
        sys.executable, "-m", "pipeline.cli", "produce", "text",
        "--bootstrap-servers", broker.bootstrap_servers, "--broker-profile", broker.profile,
        "--topic", topic, "--partitions", "2", "--rate", "200", "--count", str(n), "--quiet",
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"sent {n} text requests" in done.stdout
    msgs = read_topic(broker.bootstrap_servers, topic, n, timeout=30)
    assert len(msgs) == n
    per_bucket: dict[int, int] = defaultdict(int)
    for m in msgs:
        decoded = codec.decode(m.value(), {})  # every one is a valid request
        per_bucket[decoded.bucket] += 1
        assert m.key()
    assert len({orjson.loads(m.value())["request_id"] for m in msgs}) == n
    assert len(per_bucket) >= 2  # mixed lengths
