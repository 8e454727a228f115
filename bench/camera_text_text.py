"""The text half of bench/camera_text.py: MiniLM on the generator's mixed lengths, padded
to the length bucket's edge or to each batch's longest request, under adaptive and
greedy batching, and unbatched: drain throughput, latency at one open-loop load, and
the share of token slots that are padding.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import orjson

from bench.camera_text_variants import (
    Variant,
    drain_rounds,
    drain_summary,
    fmt,
    load_rounds,
    merge,
    send_paced,
    slice_p99,
    summarize,
    workers,
)
from bench.harness import make_producer, table
from pipeline.loadgen.pacing import poisson_schedule

GREEDY_TEXT = {"TIDEBATCH_BATCHING__MAX_BATCH_ROWS": "32"}  # a common cap for a transformer


class TextPool:
    """Generated text requests (mixed lengths), re-sent with fresh request ids."""

    def __init__(self, size: int = 600, seed: int = 17) -> None:
        from pipeline.loadgen.text import TextRequestFactory

        factory = TextRequestFactory(seed=seed)
        self.templates = []
        for i in range(size):
            key, value = factory.make(i)
            doc = orjson.loads(value)
            doc.pop("deadline_ms", None)  # the worker's SLO governs (see the module doc)
            value = orjson.dumps(doc)
            rid = f'"request_id":"text-{seed}-{i}"'.encode()
            assert rid in value
            self.templates.append((key, value, rid))

    def get(self, i: int, run: str) -> tuple[bytes, bytes]:
        key, value, rid = self.templates[i % len(self.templates)]
        return key, value.replace(rid, f'"request_id":"{run}-{i}"'.encode(), 1)


def send_texts(bootstrap: str, topic: str, pool: TextPool, run: str, rate: float | None, count: int,
               seed: int = 2) -> tuple[int, float]:
    producer = make_producer(bootstrap, topic)
    times = iter([0.0] * count) if rate is None else poisson_schedule(rate, count, seed)
    return send_paced(producer, topic, times, lambda i: pool.get(i, run))


def padded_token_ratio(docs: list[dict], pad_to: str) -> float:
    """1 - real tokens / token slots run, over all batches. A batch's requests share
    (scored_at_ms, inference_ms, batch_rows): the worker stamps them once per batch."""
    from pipeline.codecs.text import TextCodec

    codec = TextCodec(pad_to=pad_to)  # type: ignore[arg-type]
    batches: dict[tuple, list[int]] = defaultdict(list)
    for d in docs:
        batches[(d["scored_at_ms"], d["inference_ms"], d["batch_rows"])].append(d["tokens"])
    real = slots = 0
    for tokens in batches.values():
        real += sum(tokens)
        slots += len(tokens) * codec.padded_length(tokens)
    return 1.0 - real / slots if slots else float("nan")


def text_request_seconds(pool: TextPool, n: int = 60) -> float:
    """Mean single-request model time over the pool's length mix (sets the load)."""
    import onnxruntime as ort

    from models.text.model import ensure_text_model
    from pipeline.codecs.text import TextCodec

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(ensure_text_model()), opts, providers=["CPUExecutionProvider"])
    codec = TextCodec()
    decoded = [codec.decode(pool.templates[i][1]) for i in range(n)]
    session.run(None, codec.collate([decoded[0].payload]))
    best = float("inf")
    for _ in range(2):  # other processes share the cores: the better of two passes
        t0 = time.perf_counter()
        for d in decoded:
            session.run(None, codec.collate([d.payload]))
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def bench_text(bootstrap: str, slice_s: float, rounds: int, slo_ms: float, load: float, drain: int) -> dict:
    pool = TextPool()
    t1 = text_request_seconds(pool)
    capacity = 1.0 / t1
    rate = load * capacity
    print(f"text: mixed lengths, one request alone {t1 * 1e3:.1f} ms on average -> {capacity:.1f} req/s; "
          f"open loop at {rate:.1f} req/s", flush=True)
    variants = [  # name, policy, the codec's padding
        Variant("bucketed", "adaptive", {"TIDEBATCH_CODEC__PAD_TO": "bucket"}),
        Variant("longest", "adaptive", {"TIDEBATCH_CODEC__PAD_TO": "longest"}),
        # adaptive declines to batch where its cost model sees no gain, which with one
        # bucket of mixed lengths is everywhere: greedy shows what padding costs when
        # batches do form, bucketed and not.
        Variant("bucketed-greedy", "greedy", {"TIDEBATCH_CODEC__PAD_TO": "bucket", **GREEDY_TEXT}),
        Variant("longest-greedy", "greedy", {"TIDEBATCH_CODEC__PAD_TO": "longest", **GREEDY_TEXT}),
        Variant("none", "none", {"TIDEBATCH_CODEC__PAD_TO": "bucket"}),
    ]
    report: dict[str, Any] = {"mean_single_ms": round(t1 * 1e3, 2), "capacity_rps": round(capacity, 2),
                              "load": load, "rate_rps": round(rate, 2), "rounds": rounds, "slice_seconds": slice_s,
                              "variants": {}}
    with workers(bootstrap, "text", variants, slo_ms):
        for v in variants:
            pad_to = v.env["TIDEBATCH_CODEC__PAD_TO"]
            report["variants"][v.name] = {"policy": v.policy, "pad_to": pad_to}
        drains = drain_rounds(  # a burst of requests, drained
            bootstrap, variants, timeout=drain * t1 * 8 + 60,
            send=lambda v, run, r: send_texts(bootstrap, v.inp, pool, run, None, drain))
        for v in variants:
            merged = merge(drains[v.name])
            report["variants"][v.name]["drain"] = drain_summary(drains[v.name]) | {
                "padded_token_ratio": round(padded_token_ratio(merged.docs, v.env["TIDEBATCH_CODEC__PAD_TO"]), 3)}
        slices = load_rounds(
            bootstrap, variants, rounds, "load-", timeout=slice_s * 4 + 30,
            send=lambda v, run, r: send_texts(
                bootstrap, v.inp, pool, run, rate, max(int(rate * slice_s), 1), seed=r))
        for v in variants:
            res = merge(slices.parts[v.name])
            report["variants"][v.name]["load"] = summarize(res, slices.sent[v.name], slices.seconds[v.name]) | {
                "padded_token_ratio": round(padded_token_ratio(res.docs, v.env["TIDEBATCH_CODEC__PAD_TO"]), 3),
                "slice_p99_ms": slice_p99(slices.parts[v.name])}
            print(f"  {v.name}: {report['variants'][v.name]}", flush=True)
    return report


def print_text(text: dict, slo_ms: float) -> None:
    headers = ["variant", "policy", "pad to", "drain rps", "drain batch", "drain pad %", "drain ms/row",
               "load p50 ms", "load p99 ms", "load batch", "load pad %", "model ms/row", "scored/sent"]
    rows = []
    for name, r in text["variants"].items():
        d, s = r["drain"], r["load"]
        rows.append([name, r["policy"], r["pad_to"], fmt(d["per_s"]), fmt(d["mean_batch_rows"], 2),
                     fmt(100 * d["padded_token_ratio"]), fmt(d["model_ms_per_row"]), fmt(s.get("p50_ms")),
                     fmt(s.get("p99_ms")),
                     fmt(s.get("mean_batch_rows"), 2), fmt(100 * s.get("padded_token_ratio", float("nan"))),
                     fmt(s.get("model_ms_per_row")), f"{s['scored']}/{s['sent']}"])
    print(f"\nText (MiniLM, mixed lengths; one request alone {text['mean_single_ms']} ms on average = "
          f"{text['capacity_rps']} req/s; open loop at {text['rate_rps']} req/s = {int(text['load'] * 100)}%; "
          f"greedy max {GREEDY_TEXT['TIDEBATCH_BATCHING__MAX_BATCH_ROWS']} rows; SLO {slo_ms:g} ms)")
    print(table(headers, rows))
