"""Cost of TextCodec.decode per message for texts that stress the tokenizer.

    .venv/bin/python bench/text_cost.py [--repeats 5]

Prints the best-of-N decode time per case (one core): a normal sentence, 100k CJK
characters without spaces, 100k and 1 MB of ASCII without spaces, 1 MB of spaces,
100k punctuation marks. The 1 MB cases use max_chars=1,000,000 (the default, 100,000,
refuses them before parsing). Figures vary with machine load: quote best-of.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from pipeline.codecs.base import DecodeError  # noqa: E402
from pipeline.codecs.text import TextCodec  # noqa: E402

CASES: dict[str, str] = {
    "sentence": "A man is eating food at the table.",
    "100k CJK, no spaces": "中" * 100_000,
    "100k ASCII, no spaces": "a" * 100_000,
    "1 MB ASCII, no spaces": "a" * 1_000_000,
    "1 MB spaces": " " * 999_999 + "x",
    "100k '!'": "!" * 100_000,
    "100k '。'": "。" * 100_000,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    codec = TextCodec(max_chars=1_000_000)
    for name, text in CASES.items():
        value = orjson.dumps({"request_id": "r", "text": text})
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            try:
                d = codec.decode(value, None)
                outcome = f"tokens={d.extra['tokens']} truncated={d.extra['truncated']}"
            except DecodeError as exc:
                outcome = f"refused: {exc}"
            best = min(best, time.perf_counter() - t0)
        print(f"{name:24s} {best * 1000:9.2f} ms  {outcome}")


if __name__ == "__main__":
    main()
