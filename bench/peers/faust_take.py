"""The Faust peer: an agent that takes up to PEER_TAKE requests (default 512) or what
came within 10 ms, `stream.take(512, within=0.01)`, as Faust's user guide batches a
stream (https://faust-streaming.github.io/faust/userguide/streams.html, "take()"),
scores them in one ONNX Runtime call and sends one result each.

    PEER_BROKER=kafka://HOST:PORT PEER_PROFILE=kafka|embedded PEER_APP_ID=... \\
    PEER_INPUT=... PEER_OUTPUT=... python -m faust -A bench.peers.faust_take worker

faust-streaming with aiokafka (the shared .venv's `faust` extra). The app gets the
broker profile's client settings through pipeline/faust/app.py's make_app, the same
as tidebatch's own Faust path (examples/faust_ctr/app.py), so the two differ only in
the batching: a fixed take() here, tidebatch's adaptive_batches there.
"""

from __future__ import annotations

import os

from bench.peers.common import Scorer
from pipeline.faust.app import make_app

app = make_app(
    os.environ["PEER_APP_ID"], os.environ["PEER_BROKER"], profile=os.environ.get("PEER_PROFILE", "kafka"),
    web_metrics_enabled=False,
)
_raw = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
requests_topic = app.topic(os.environ["PEER_INPUT"], **_raw)
results_topic = app.topic(os.environ["PEER_OUTPUT"], **_raw)
TAKE = int(os.environ.get("PEER_TAKE", "512"))
scorer = Scorer(int(os.environ.get("PEER_THREADS", "1")))


@app.agent(requests_topic)
async def score(stream):  # noqa: ANN001 -- Faust's agent signature
    async for events in stream.take_events(TAKE, within=0.01):
        for doc in scorer.score([(e.value, int(e.message.timestamp * 1000)) for e in events]):
            await results_topic.send(value=doc)
