"""The generate worker's ops endpoints (pipeline/generation/ops.py): the generation
loop read as the ops server and the probes read a Worker (pipeline/ops/health.py,
pipeline/ops/http.py), on the in-memory source and producer of
tests/unit/test_generation_loop.py and a fake clock."""

from __future__ import annotations

import urllib.request

import orjson

from pipeline.clock import FakeClock
from pipeline.generation.ops import GenerateOpsView
from pipeline.ops import health
from pipeline.ops.http import OpsServer
from tests.unit.test_generation_loop import TP, Producer, Source, _loop, _rec, decoder  # noqa: F401 (fixture)


def _view(loop) -> GenerateOpsView:
    return GenerateOpsView(loop, policy="continuous", group_id="g", input_topic="in", provider="cpu")


def test_readiness_follows_the_loop_from_start_to_stop(decoder) -> None:  # noqa: F811
    clock, producer = FakeClock(), Producer()
    loop = _loop(decoder, clock, producer, slots=1)
    view = _view(loop)
    ready, body = health.readiness(view, clock.now())
    assert not ready
    assert "worker not started (loading the model or subscribing)" in body["reasons"]
    assert "no partitions assigned" in body["reasons"]
    assert health.liveness(view, clock.now())[0]
    seen: dict[str, object] = {}

    def script(poll: int) -> None:
        if poll == 3:  # three requests polled, one KV slot: two wait
            seen["ready"] = health.readiness(view, clock.now())
            seen["waiting"] = view.queue.rows
        if poll == 200:
            loop.stop("test")

    reqs = [_rec(i, {"request_id": f"r{i}", "prompt": "Kafka ", "max_new_tokens": 20}) for i in range(3)]
    source = Source(reqs, clock, script)
    loop.partitions.on_assign([TP])
    assert loop.run(source) == 0
    ready, body = seen["ready"]  # type: ignore[misc]
    assert ready, body
    assert body["checks"]["assigned_partitions"] == ["in[0]"]
    assert seen["waiting"] == 2
    # stopping: alive (it is draining) but no longer ready
    ready, body = health.readiness(view, clock.now())
    assert not ready and "worker is stopping" in body["reasons"]


def test_a_failed_loop_is_neither_alive_nor_ready(decoder) -> None:  # noqa: F811
    clock = FakeClock()
    loop = _loop(decoder, clock, Producer())
    loop.fail("an outcome could not be written")
    view = _view(loop)
    alive, body = health.liveness(view, clock.now())
    assert not alive and body["reason"] == "worker failed: an outcome could not be written"
    assert not health.readiness(view, clock.now())[0]


def test_the_ops_server_serves_a_generate_worker(decoder) -> None:  # noqa: F811
    clock = FakeClock()
    loop = _loop(decoder, clock, Producer())
    with OpsServer(_view(loop), port=0) as server:
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        with urllib.request.urlopen(server.url + "/api/stats", timeout=5) as r:
            stats = orjson.loads(r.read())
    # the SLO gauge is the admission deadline of a request without deadline_ms
    assert f'tidebatch_slo_seconds{{pipeline="generate"}} {loop.settings.deadline_ms / 1000.0}' in text
    assert 'tidebatch_queue_rows{pipeline="generate"} 0.0' in text
    assert 'tidebatch_ready{pipeline="generate"} 0.0' in text  # not started
    worker = stats["worker"]
    assert (worker["pipeline"], worker["policy"], worker["input_topic"], worker["provider"]) == (
        "generate", "continuous", "in", "cpu")
    assert worker["slo_ms"] == loop.settings.deadline_ms


def test_the_loop_feeds_the_histograms_tidebatch_status_reads(decoder) -> None:  # noqa: F811
    # pipeline/commands/status.py reads p99 from tidebatch_end_to_end_latency_seconds
    # and the batch from tidebatch_batch_rows: a decoding step is a batch of sequences.
    clock, producer = FakeClock(), Producer()
    loop = _loop(decoder, clock, producer, slots=2)
    reqs = [_rec(i, {"request_id": f"r{i}", "prompt": "Kafka ", "max_new_tokens": 5}) for i in range(3)]
    source = Source(reqs, clock, lambda poll: loop.stop("test") if poll == 60 else None)
    assert loop.run(source) == 0
    reg = loop.metrics.registry

    def value(name: str, **labels: str) -> float:
        got = reg.get_sample_value(name, {"pipeline": "generate", **labels})
        assert got is not None, name
        return got

    assert value("tidebatch_end_to_end_latency_seconds_count") == len(producer.finals()) == 3
    assert value("tidebatch_stage_seconds_count", stage="to_worker") == 3
    steps = value("tidebatch_batch_rows_count", policy="continuous")
    assert steps >= 4 and value("tidebatch_batch_rows_sum", policy="continuous") > steps  # 2 slots mostly full
    assert value("tidebatch_inference_seconds_count") >= steps
