"""Fuzz the whole worker, publish path included: mutated requests of every form
(tests/fuzz_mutators.py, fixed seed) interleaved with valid ones, through a real
worker on the real broker. For each message exactly one outcome, every valid request
scored, the worker alive throughout and clean at the end.

tests/unit/test_codec_fuzz.py holds each codec to its rule alone; this test adds what
only a running worker does with the outcome: batching the survivors together,
building, measuring and sending their results, dead-lettering the rest."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fuzz_mutators import Target, mutate, targets
from tests.integration import opsutil
from tests.integration.outcome_reader import Message, score_in_thread, topics_for

pytestmark = pytest.mark.timeout(600)

SEED = 20261201


def _traffic(target: Target, rng: np.random.Generator, hostile: int) -> tuple[list[Message], list[int]]:
    """`hostile` mutated messages, each after a valid one; returns the messages and the
    offsets of the valid ones."""
    messages: list[Message] = []
    valid: list[int] = []
    for i in range(hostile):
        value, headers = target.samples[i % len(target.samples)]
        valid.append(len(messages))
        messages.append((b"k", value, list(headers.items())))
        _, (bad_value, bad_headers) = mutate(rng, target)
        messages.append((b"k", bad_value, list(bad_headers.items())))
    return messages, valid


@pytest.mark.parametrize(
    ("codec", "pipeline", "hostile"),
    [("ctr", "ctr", 200), ("ctr_binary", "ctr", 150), ("text", "text", 80), ("camera", "camera", 24)],
)
def test_every_fuzzed_message_gets_exactly_one_outcome(broker, topic_factory, unique_group_id, codec, pipeline, hostile):
    rng = np.random.default_rng(SEED)
    target = next(t for t in targets(SEED) if t.name == codec)
    messages, valid = _traffic(target, rng, hostile)
    topics = topics_for(topic_factory)
    # Batches mix the survivors of the mutations with the valid requests (static linger),
    # so a bad result would meet its batch-mates in the publisher.
    cfg = opsutil.worker_config(
        broker, topics, unique_group_id, pipeline=pipeline, metrics={"enabled": False},
        batching={"policy": "static", "max_queue_delay_ms": 50, "slo_ms": 600_000},
    )
    outcomes = score_in_thread(broker, topics, cfg, messages)
    unscored = [o for o in valid if outcomes[o][0][0] != "result"]
    assert not unscored, [outcomes[o] for o in unscored[:3]]
