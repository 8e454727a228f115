"""Long-form fuzzer of every codec (issue 22: no message may stop, wedge or bloat a
worker), with the mutators of the unit test (tests/fuzz_mutators.py).

    .venv/bin/python bench/fuzz_codecs.py [--seconds 120] [--seed 1] [--max-ms 500]
                                          [--codecs ctr,camera,...] [--slowest 10]

Round-robins over the codecs for --seconds, mutating valid samples; every message
must decode into a serialisable result or be refused with a clean one-line
DecodeError, and decode_many must agree with decode. Prints, per codec, the count per
outcome (ok / reason class), and the slowest inputs with their cost (decode of one
message, one core) and size. Exits 1 on a codec bug (with the mutations that made the
message) or when a message cost more than --max-ms.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from tests.fuzz_mutators import CodecBug, check_batch, mutate, reason_class, targets  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=1)
    # A PNG at the camera's pixel budget (4096x2160) decodes in ~0.2-0.3 s on a small
    # machine; the hostile inputs this bench exists for cost 1-2 s and more.
    parser.add_argument("--max-ms", type=float, default=500.0, help="fail if one message costs more")
    parser.add_argument("--codecs", default="", help="comma-separated subset (default: all)")
    parser.add_argument("--slowest", type=int, default=8)
    args = parser.parse_args(argv)

    chosen = [t for t in targets(args.seed) if not args.codecs or t.name in args.codecs.split(",")]
    rngs = {t.name: np.random.default_rng([args.seed, i]) for i, t in enumerate(chosen)}
    counts: dict[str, Counter[str]] = {t.name: Counter() for t in chosen}
    slow: list[tuple[float, str, str, int, str]] = []  # ms, codec, mutations, bytes, outcome
    bugs: list[str] = []
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end and not bugs:
        for target in chosen:
            names, message = mutate(rngs[target.name], target)
            t0 = time.perf_counter()
            try:
                (result,) = check_batch(target.codec, [message])
            except CodecBug as exc:
                bugs.append(f"{target.name} [{names}] ({len(message[0] or b'')} bytes): {exc}")
                break
            # check_batch decodes twice (decode, decode_many): half is one decode
            ms = (time.perf_counter() - t0) * 1000 / 2
            counts[target.name]["ok" if result == "ok" else reason_class(result)] += 1
            slow.append((ms, target.name, names, len(message[0] or b""), result[:90]))
        slow = sorted(slow, reverse=True)[: args.slowest]

    for name, counter in counts.items():
        print(f"{name}: {sum(counter.values())} messages")
        for outcome, n in counter.most_common(12):
            print(f"  {n:7d}  {outcome}")
        if len(counter) > 12:
            print(f"  {sum(n for _, n in counter.most_common()[12:]):7d}  ({len(counter) - 12} other reason classes)")
    print(f"slowest {len(slow)} messages (ms per decode, one core):")
    for ms, name, names, size, result in slow:
        print(f"  {ms:8.1f} ms  {name:10s} {size:9d} bytes  {names:40s} {result}")
    over = [s for s in slow if s[0] > args.max_ms]
    for bug in bugs:
        print(f"CODEC BUG: {bug}")
    if over:
        print(f"{len(over)} message(s) over --max-ms {args.max_ms}")
    return 1 if bugs or over else 0


if __name__ == "__main__":
    sys.exit(main())
