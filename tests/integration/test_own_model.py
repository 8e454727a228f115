"""Issue 20: models the project has never seen (tests/own_models.py: two inputs, a
dynamic batch and a dynamic sequence dimension; a LightGBM classifier with a ZipMap
output, trained and converted here), served over Kafka purely from a YAML
configuration (pipeline/registry/user_pipelines.py, the tensor-json codec). Results equal ONNX
Runtime on each request alone; bad requests are dead-lettered with a reason that names
the field, and the worker keeps going."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import orjson
import pytest
import yaml

from consumers.dead_letter import H_ERROR
from pipeline.config import load_config
from tests.integration.pipeline_helpers import (
    committed_offsets,
    produce_values,
    read_topic,
    result_docs,
    running_worker,
    wait_for,
)
from tests.own_models import ranker, run_alone

pytest.importorskip("onnx")

BAD = [
    ({"request_id": "bad-missing", "features": [0, 0, 0, 0]}, "missing field 'tokens'"),
    ({"request_id": "bad-type", "features": [0, 0, "x", 0], "tokens": [1]}, "features[2]: expected int or float, got string"),
    ({"request_id": "bad-shape", "features": [0, 0, 0], "tokens": [1]}, "features: dimension 1 must have size 4, got 3"),
    ({"request_id": "bad-int", "features": [0, 0, 0, 0], "tokens": [1.5]}, "tokens[0]: expected int, got float"),
]


@pytest.mark.parametrize("model_process", [False, True], ids=["in-process", "model-process"])
def test_own_model_served_from_configuration(broker, topic_factory, unique_group_id, tmp_path, model_process) -> None:
    model = ranker(tmp_path / "ranker.onnx")
    inp = topic_factory("own-req", partitions=2)
    out = topic_factory("own-res", partitions=2)
    dlq = topic_factory(f"{inp}.dlq", exact=True)
    config = tmp_path / "ranker.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline": "my-ranker",
        "pipelines": [{
            "name": "my-ranker", "model": str(model), "version": "2", "codec": "tensor-json",
            "input_topic": inp, "output_topic": out,
            "inputs": {"features": "dense", "tokens": "tokens"},
            "outputs": {"score": "prob", "hidden": "hidden"},
            "max_batch_rows": 64,
        }],
    }))
    cfg = load_config(config, overrides={
        "bootstrap_servers": broker.bootstrap_servers, "broker_profile": broker.profile,
        "group_id": unique_group_id, "dlq_topic": dlq, "metrics": {"enabled": False}, "create_topics": False,
        "runtime": {"model_process": model_process},
    }, environ={})
    rng = np.random.default_rng(20)
    good = []
    for i in range(300):
        seq = int(rng.choice([1, 3, 7]))  # three sequence lengths: three buckets
        good.append({"request_id": f"r{i}", "features": np.round(rng.standard_normal(4), 5).tolist(),
                     "tokens": rng.integers(0, 10, seq).tolist()})
    items = [(d["request_id"].encode(), orjson.dumps(d)) for d in good]
    for j, (doc, _) in enumerate(BAD):
        items.insert(50 * j + 7, (doc["request_id"].encode(), orjson.dumps(doc)))
    with running_worker(cfg) as worker:
        produce_values(broker.bootstrap_servers, inp, items)
        msgs = read_topic(broker.bootstrap_servers, out, len(good), timeout=120)
        dead = read_topic(broker.bootstrap_servers, dlq, len(BAD), timeout=30)
        wait_for(lambda: worker.tracker.pending() == 0, 30, "offsets pending")
        wait_for(lambda: sum(committed_offsets(broker.bootstrap_servers, unique_group_id, inp, 2).values()) == len(items),
                 30, "offsets not committed past every request")
    docs = result_docs(msgs)
    assert len(docs) == len(good) and max(Counter(d["request_id"] for d in docs).values()) == 1
    assert worker.stats.batches < len(good)  # requests really shared batches
    by_id = {d["request_id"]: d for d in docs}
    for req in good:
        doc = by_id[req["request_id"]]
        assert (doc["model"], doc["model_version"]) == ("my-ranker", "2")
        alone = run_alone(model, {"dense": np.array([req["features"]], np.float32),
                                  "tokens": np.array([req["tokens"]], np.int64)})
        assert np.allclose(doc["score"], alone["prob"][0], rtol=1e-6, atol=1e-7), (doc, alone)
        assert np.allclose(doc["hidden"], alone["hidden"][0], rtol=1e-6, atol=1e-6), (doc, alone)
    reasons = {orjson.loads(m.value())["request_id"]: dict(m.headers())[H_ERROR].decode() for m in dead}
    assert reasons == {doc["request_id"]: reason for doc, reason in BAD}


LGBM_BAD = [
    ({"request_id": "lgbm-missing", "feature": [0.1, 0.2, 0.3, 0.4, 0.5]}, "missing field 'features'"),
    ({"request_id": "lgbm-type", "features": [0.1, 0.2, 0.3, "0.4", 0.5]}, "features[3]: expected int or float, got string"),
    ({"request_id": "lgbm-size", "features": [0.1, 0.2, 0.3, 0.4]}, "features: dimension 1 must have size 5, got 4"),
    ({"request_id": "lgbm-null", "features": None}, "features: expected int or float, got null"),
]


@pytest.mark.parametrize("model_process", [False, True], ids=["in-process", "model-process"])
def test_lightgbm_classifier_served_from_configuration(broker, topic_factory, unique_group_id, tmp_path, model_process):
    """Issue 20's first model: a LightGBM classifier trained here on generated data and
    converted by onnxmltools (ZipMap output, label declared [1]), served from a YAML
    file with renamed result fields, by either executor (the model process carries
    the sequence of maps: pipeline/runtime/wire_values.py). Each result equals ONNX
    Runtime on that request alone; bad requests are dead-lettered naming the field."""
    pytest.importorskip("lightgbm")
    pytest.importorskip("onnxmltools")
    from tests.own_models import lightgbm_classifier

    model = lightgbm_classifier(tmp_path / "churn.onnx")
    inp, out = topic_factory("lgbm-req", partitions=2), topic_factory("lgbm-res", partitions=2)
    dlq = topic_factory(f"{inp}.dlq", exact=True)
    config = tmp_path / "churn.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline": "churn",
        "runtime": {"model_process": model_process},
        "pipelines": [{"name": "churn", "model": str(model), "version": "7", "input_topic": inp, "output_topic": out,
                       "outputs": {"predicted": "label", "scores": "probabilities"}, "max_batch_rows": 64}],
    }))
    cfg = load_config(config, overrides={
        "bootstrap_servers": broker.bootstrap_servers, "broker_profile": broker.profile,
        "group_id": unique_group_id, "dlq_topic": dlq, "metrics": {"enabled": False}, "create_topics": False,
    }, environ={})
    rng = np.random.default_rng(5)
    good = [{"request_id": f"c{i}", "features": np.round(rng.standard_normal(5) * 1.5, 4).tolist()} for i in range(200)]
    items = [(d["request_id"].encode(), orjson.dumps(d)) for d in good]
    for j, (doc, _) in enumerate(LGBM_BAD):
        items.insert(40 * j + 3, (doc["request_id"].encode(), orjson.dumps(doc)))
    with running_worker(cfg) as worker:
        produce_values(broker.bootstrap_servers, inp, items)
        docs = result_docs(read_topic(broker.bootstrap_servers, out, len(good), timeout=120))
        dead = read_topic(broker.bootstrap_servers, dlq, len(LGBM_BAD), timeout=30)
        wait_for(lambda: sum(committed_offsets(broker.bootstrap_servers, unique_group_id, inp, 2).values()) == len(items),
                 30, "offsets not committed past every request")
    assert len(docs) == len(good) and max(Counter(d["request_id"] for d in docs).values()) == 1
    assert worker.stats.batches < len(good)  # requests really shared batches
    by_id = {d["request_id"]: d for d in docs}
    classes = set()
    for req in good:
        doc = by_id[req["request_id"]]
        assert (doc["model"], doc["model_version"]) == ("churn", "7")
        assert "label" not in doc and "probabilities" not in doc  # only the configured fields
        alone = run_alone(model, {"features": np.array([req["features"]], np.float32)})
        assert doc["predicted"] == int(alone["label"][0])
        expected = {str(k): v for k, v in alone["probabilities"][0].items()}
        assert list(doc["scores"]) == list(expected) == ["0", "1", "2"]
        assert np.allclose(list(doc["scores"].values()), list(expected.values()), rtol=1e-6, atol=1e-7), (doc, expected)
        classes.add(doc["predicted"])
    assert classes == {0, 1, 2}  # the data reached every class: the comparison is not of one constant
    reasons = {orjson.loads(m.value())["request_id"]: dict(m.headers())[H_ERROR].decode() for m in dead}
    assert reasons == {doc["request_id"]: reason for doc, reason in LGBM_BAD}


def test_ragged_sequences_padded_with_a_mask_served_from_configuration(broker, topic_factory, unique_group_id, tmp_path):
    """`pad:` (pipeline/codecs/tensor_pad.py): token sequences of 1..12 positions share
    two buckets, the codec fills the model's attention mask, and each result (pooled and
    per-position, cut back to the request's length) equals the model on the request
    alone; one over the last bucket is dead-lettered naming the field."""
    from tests.own_models import masked_encoder

    model = masked_encoder(tmp_path / "masked.onnx")
    inp, out = topic_factory("pad-req", partitions=1), topic_factory("pad-res", partitions=1)
    dlq = topic_factory(f"{inp}.dlq", exact=True)
    cfg = load_config(overrides={
        "pipeline": "enc", "pipelines": [{"name": "enc", "model": str(model), "input_topic": inp, "output_topic": out,
                                          "pad": {"dimension": "seq", "buckets": [6, 12]}}],
        "bootstrap_servers": broker.bootstrap_servers, "broker_profile": broker.profile,
        "group_id": unique_group_id, "dlq_topic": dlq, "metrics": {"enabled": False}, "create_topics": False,
    }, environ={})
    rng = np.random.default_rng(8)
    good = [{"request_id": f"p{i}", "tokens": rng.integers(0, 10, int(rng.integers(1, 13))).tolist()} for i in range(150)]
    bad = {"request_id": "p-long", "tokens": [1] * 13}
    with running_worker(cfg):
        produce_values(broker.bootstrap_servers, inp, [(None, orjson.dumps(d)) for d in [*good[:70], bad, *good[70:]]])
        docs = result_docs(read_topic(broker.bootstrap_servers, out, len(good), timeout=90))
        dead = read_topic(broker.bootstrap_servers, dlq, 1, timeout=30)
    assert sorted(d["request_id"] for d in docs) == sorted(r["request_id"] for r in good)
    # a batch held more requests than any one length has: different lengths shared it
    assert max(d["batch_rows"] for d in docs) > max(Counter(len(r["tokens"]) for r in good).values())
    by_id = {d["request_id"]: d for d in docs}
    for req in good:
        n = len(req["tokens"])
        alone = run_alone(model, {"tokens": np.array([req["tokens"]], np.int64), "attention_mask": np.ones((1, n), np.int64)})
        doc = by_id[req["request_id"]]
        assert np.allclose(doc["pooled"], alone["pooled"][0], rtol=1e-6, atol=1e-7)
        assert np.array(doc["states"]).shape == (n, 3) and np.allclose(doc["states"], alone["states"][0], rtol=1e-6, atol=1e-7)
    assert [dict(m.headers())[H_ERROR].decode() for m in dead] == [
        "tokens: dimension 'seq' has size 13, over the largest bucket (12)"]


def test_binary_form_served_from_configuration(broker, topic_factory, unique_group_id, tmp_path):
    """`codec: tensor-binary` (pipeline/codecs/tensor_binary.py) with the model process:
    msgpack requests with raw tensor bytes give the results ONNX Runtime gives each
    alone; bad ones are dead-lettered naming the field."""
    msgpack = pytest.importorskip("msgpack")
    model = ranker(tmp_path / "ranker.onnx")
    inp, out = topic_factory("bin-req", partitions=1), topic_factory("bin-res", partitions=1)
    dlq = topic_factory(f"{inp}.dlq", exact=True)
    cfg = load_config(overrides={
        "pipeline": "bin", "runtime": {"model_process": True},
        "pipelines": [{"name": "bin", "model": str(model), "codec": "tensor-binary", "input_topic": inp, "output_topic": out}],
        "bootstrap_servers": broker.bootstrap_servers, "broker_profile": broker.profile,
        "group_id": unique_group_id, "dlq_topic": dlq, "metrics": {"enabled": False}, "create_topics": False,
    }, environ={})
    rng = np.random.default_rng(12)
    good = [{"request_id": f"b{i}", "dense": rng.standard_normal(4).astype("<f4"),
             "tokens": rng.integers(0, 10, int(rng.choice([2, 5]))).astype("<i8")} for i in range(120)]
    values = [msgpack.packb({**r, "dense": r["dense"].tobytes(), "tokens": r["tokens"].tobytes()}) for r in good]
    bad = [(msgpack.packb({"request_id": "b-short", "dense": b"\0" * 12, "tokens": b"\0" * 8}),
            "dense: 3 elements do not fit shape [4]"),
           (msgpack.packb({"request_id": "b-odd", "dense": b"\0" * 16, "tokens": b"\0" * 9}),
            "tokens: 9 bytes is not a whole number of int64 elements (8 bytes each)")]
    with running_worker(cfg):
        produce_values(broker.bootstrap_servers, inp, [(None, v) for v in [*values[:60], *(b for b, _ in bad), *values[60:]]])
        docs = result_docs(read_topic(broker.bootstrap_servers, out, len(good), timeout=90))
        dead = read_topic(broker.bootstrap_servers, dlq, len(bad), timeout=30)
    by_id = {d["request_id"]: d for d in docs}
    assert sorted(by_id) == sorted(r["request_id"] for r in good)
    for req in good:
        alone = run_alone(model, {"dense": req["dense"][None].astype(np.float32), "tokens": req["tokens"][None].astype(np.int64)})
        assert np.allclose(by_id[req["request_id"]]["prob"], alone["prob"][0], rtol=1e-6, atol=1e-7)
    assert sorted(dict(m.headers())[H_ERROR].decode() for m in dead) == sorted(reason for _, reason in bad)


def test_five_commands_of_the_docs(broker, topic_factory, unique_group_id, tmp_path) -> None:
    """docs/OWN_MODEL.md, "Five commands", as a user runs them: inspect, keep its
    starter config for this broker (`--broker-profile`, `--config-only`), `tidebatch run
    -c`, produce the user's own requests from a file, read the results with `tidebatch
    read`. Issue 48: the starter config had no broker_profile (a worker on the embedded
    broker waited ~23 s for its partitions, and its first results were all late), and
    step 5 needed kcat."""
    import signal
    import subprocess
    import sys

    from tests.integration.pipeline_helpers import REPO

    model = ranker(tmp_path / "my-ranker.onnx")
    cli = [sys.executable, "-m", "pipeline.cli"]

    def step(*argv: str) -> str:
        done = subprocess.run([*cli, *argv], cwd=tmp_path, capture_output=True, text=True, env={**os.environ,
                              "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr
        return done.stdout

    report = step("inspect", "my-ranker.onnx")
    starter = step("inspect", "my-ranker.onnx", "--broker-profile", broker.profile,
                   "--bootstrap-servers", broker.bootstrap_servers, "--config-only")
    config = yaml.safe_load(starter)
    assert (config["broker_profile"], config["bootstrap_servers"]) == (broker.profile, broker.bootstrap_servers)
    shown = yaml.safe_load(report.split("`tidebatch run -c my-ranker.yaml`):\n", 1)[1])  # the report's own config
    assert config == {**shown, "bootstrap_servers": broker.bootstrap_servers, "broker_profile": broker.profile}
    inp, out = topic_factory("five-req", partitions=1), topic_factory("five-res", partitions=1)
    topic_factory(f"{inp}.dlq", exact=True)
    config["pipelines"][0].update(input_topic=inp, output_topic=out)
    config.update(group_id=unique_group_id, metrics={"enabled": False}, create_topics=False)  # this test's topics
    (tmp_path / "my-ranker.yaml").write_text(yaml.safe_dump(config))
    sample = orjson.loads(report.split("left out):\n", 1)[1].split("\n", 1)[0])
    requests = [{**sample, "request_id": f"five-{i}", "tokens": list(range(i % 4 + 1))} for i in range(20)]
    (tmp_path / "requests.jsonl").write_text("".join(orjson.dumps(r).decode() + "\n" for r in requests))
    with open(tmp_path / "run.log", "wb") as log:
        worker = subprocess.Popen([*cli, "run", "-c", "my-ranker.yaml"], cwd=tmp_path, stdout=log,
                                  stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: b"assigned" in (tmp_path / "run.log").read_bytes(), 60, "the worker's partitions")
        step("produce", "my-ranker", "-c", "my-ranker.yaml", "--quiet", "--bootstrap-servers", broker.bootstrap_servers,
             "--file", "requests.jsonl")
        assert len(read_topic(broker.bootstrap_servers, out, len(requests), timeout=90)) == len(requests)
        docs = [orjson.loads(line) for line in step("read", out, "-c", "my-ranker.yaml").splitlines()]
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(60)
    assert sorted(d["request_id"] for d in docs) == sorted(r["request_id"] for r in requests), (
        (tmp_path / "run.log").read_text()[-2000:])
    for d in docs:
        req = next(r for r in requests if r["request_id"] == d["request_id"])
        alone = run_alone(model, {"dense": np.array([req["dense"]], np.float32),
                                  "tokens": np.array([req["tokens"]], np.int64)})
        assert np.allclose(d["prob"], alone["prob"][0], rtol=1e-6, atol=1e-7)
