"""The Faust example app (examples/faust_ctr) serving a user's `pipelines:` entry: a
LightGBM model the project never saw, given by the worker config the worker runs from
(TIDEBATCH_FAUST_CONFIG). Beside `tidebatch run` on the same requests: each result is the
worker's record (key, headers, document) but for what describes the run (batch_rows,
times, late), each bad request the worker's dead letter with its reason; and the scores
are ONNX Runtime's on the request alone, bit for bit (one intra-op thread)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from consumers.dead_letter import H_ERROR
from tests.integration.faust_helpers import faust_worker
from tests.integration.pipeline_helpers import REPO, produce_values, read_topic

pytest.importorskip("faust", reason="faust-streaming is not installed (the [faust] extra)")
pytest.importorskip("lightgbm")
pytest.importorskip("onnxmltools")

N = 120
BAD = {
    9: {"request_id": "bad-size", "features": [0.5, 0.5]},
    50: {"request_id": "bad-type", "features": [0.1, 0.2, None, 0.4, 0.5]},
}
RUN_FIELDS = ("batch_rows", "queue_wait_ms", "inference_ms", "scored_at_ms", "late", "source")


def test_the_faust_app_serves_a_users_pipeline_as_the_worker_does(
    broker, topic_factory, unique_group_id, tmp_path: Path
) -> None:
    from tests.own_models import lightgbm_classifier

    model = lightgbm_classifier(tmp_path / "churn.onnx")
    inp = topic_factory("faust-own-req", partitions=2)
    out_f, out_w = topic_factory("faust-own-res", partitions=2), topic_factory("worker-own-res", partitions=2)
    dlq_f, dlq_w = topic_factory(f"{inp}.dlq", exact=True), topic_factory("worker-own-dlq", partitions=1)
    config = tmp_path / "churn.yaml"
    config.write_text(yaml.safe_dump({"pipeline": "churn", "pipelines": [{
        "name": "churn", "model": str(model), "version": "5", "outputs": {"predicted": "label", "scores": "probabilities"},
        "input_topic": inp, "max_batch_rows": 64}]}))
    rng = np.random.default_rng(3)
    docs = [{"request_id": f"f{i}", "features": np.round(rng.standard_normal(5) * 1.5, 4).tolist()} for i in range(N)]
    for at, bad in BAD.items():
        docs[at] = bad
    trace = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    produce_values(broker.bootstrap_servers, inp, [(d["request_id"].encode(), orjson.dumps(d)) for d in docs],
                   headers=[("traceparent", trace)])
    good = [d for i, d in enumerate(docs) if i not in BAD]

    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "run", "-c", str(config), "--bootstrap-servers",
             broker.bootstrap_servers, "--broker-profile", broker.profile, "--group-id", f"{unique_group_id}-w",
             "--output-topic", out_w],
            stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO), TIDEBATCH_METRICS__ENABLED="false",
                     TIDEBATCH_CREATE_TOPICS="false", TIDEBATCH_DLQ_TOPIC=dlq_w),
        )
    try:
        with faust_worker(broker.bootstrap_servers, inp, out_f, unique_group_id, tmp_path, "faust",
                          TIDEBATCH_FAUST_CONFIG=str(config)) as (proc, _port, flog):
            faust_results = read_topic(broker.bootstrap_servers, out_f, len(good), timeout=120)
            faust_dead = read_topic(broker.bootstrap_servers, dlq_f, len(BAD), timeout=30)
            assert proc.poll() is None, f"faust worker exited; see {flog}"
        worker_results = read_topic(broker.bootstrap_servers, out_w, len(good), timeout=120)
        worker_dead = read_topic(broker.bootstrap_servers, dlq_w, len(BAD), timeout=30)
        assert worker.poll() is None, f"worker exited; see {log}"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    assert len(faust_results) == len(worker_results) == len(good), f"see {flog} and {log}"

    def by_id(messages: list) -> dict[str, tuple]:  # noqa: ANN001
        out = {}
        for m in messages:
            doc = orjson.loads(m.value())
            out[doc["request_id"]] = (m.key(), m.headers(), {k: v for k, v in doc.items() if k not in RUN_FIELDS})
        return out

    faust, worker_side = by_id(faust_results), by_id(worker_results)
    assert faust == worker_side
    assert all(headers == [("traceparent", trace)] for _, headers, _ in faust.values())
    assert {doc["model"] for _, _, doc in faust.values()} == {"churn"}

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    for d in good:
        label, probabilities = session.run(None, {"features": np.array([d["features"]], np.float32)})
        doc = faust[d["request_id"]][2]
        assert doc["predicted"] == int(label[0])
        want = np.array(list(probabilities[0].values()), np.float32)
        assert np.array(list(doc["scores"].values()), np.float32).tobytes() == want.tobytes(), (doc, probabilities)

    def letters(messages: list) -> dict[bytes, tuple]:  # noqa: ANN001
        return {m.value(): (m.key(), dict(m.headers())[H_ERROR]) for m in messages}

    assert letters(faust_dead) == letters(worker_dead) == {
        orjson.dumps(BAD[9]): (b"bad-size", b"features: dimension 1 must have size 5, got 2"),
        orjson.dumps(BAD[50]): (b"bad-type", b"features[2]: expected int or float, got null"),
    }
