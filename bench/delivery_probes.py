"""What bench/delivery.py reads from the broker and the worker: a topic's end offsets,
when the worker group's committed offsets reach them (the end of an exactly-once drain),
the transaction markers in a topic, and the worker's transaction metrics.
"""

from __future__ import annotations

import time
import uuid

from bench.harness import profile_of

POLL_S = 0.025  # committed-offsets poll: the resolution of an exactly-once drain's end


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """High watermark of every partition of `topic` (no transactions in it: a count)."""
    from confluent_kafka import Consumer, TopicPartition

    from consumers.admin import existing_topics
    from consumers.profiles import consumer_config

    c = Consumer(consumer_config(profile_of(bootstrap), bootstrap, f"bench-wm-{uuid.uuid4().hex[:8]}"))
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(existing_topics(bootstrap)[topic])}
    finally:
        c.close()


def wait_committed(bootstrap: str, proc, topic: str, ends: dict[int, int], timeout: float) -> float:
    """Poll the worker group's committed offsets of `topic` until every partition's
    reaches `ends`; the wall-clock time (ms) it was first seen. Stable offsets only
    (require_stable off): under exactly-once they appear when their transaction commits."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = [ConsumerGroupTopicPartitions(proc.group_id, [TopicPartition(topic, p) for p in ends])]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode} mid-drain; see {proc.log_path}")
        try:
            got = admin.list_consumer_group_offsets(request)[proc.group_id].result(timeout=5)
            if all(tp.offset >= ends[tp.partition] for tp in got.topic_partitions if tp.error is None) \
                    and len(got.topic_partitions) == len(ends):
                return time.time() * 1000.0
        except Exception:  # the group may not exist yet: keep polling
            pass
        time.sleep(POLL_S)
    raise RuntimeError(f"the worker's offsets of {topic} did not reach the end in {timeout:.0f} s; see {proc.log_path}")


def markers(bootstrap: str, topic: str, records: int) -> int:
    """Offsets in `topic` not taken by its `records` distinct records: transaction
    control markers (one per partition a transaction wrote to), and duplicates if any.
    0 means no transactions."""
    return sum(end_offsets(bootstrap, topic).values()) - records


def transaction_stats(proc, seconds: float) -> dict:
    """The worker's transaction metrics so far (pipeline/observe/metrics.py): commits, their mean
    time, aborts, every transaction sample as it was scraped, and the mean time between
    commits over the `seconds` the worker had work (the setting is a lower bound: the
    worker commits between turns of its source loop). Empty under at-least-once."""
    from pipeline.app.demo import _sum, scrape

    try:
        m = scrape(proc.metrics_url)
    except OSError:
        return {}
    samples = {k: v for k, v in m.items() if "transaction" in k}
    if not samples:
        return {}
    count = _sum(m, "tidebatch_transaction_commit_seconds_count")
    total = _sum(m, "tidebatch_transaction_commit_seconds_sum")
    return {
        "commits": count, "mean_commit_ms": 1000.0 * total / count if count else float("nan"),
        "aborted": sum(v for k, v in samples.items() if "abort" in k and not k.endswith("_created")),
        "commit_period_ms": 1000.0 * seconds / count if count else float("nan"),
        "samples": samples,
    }
